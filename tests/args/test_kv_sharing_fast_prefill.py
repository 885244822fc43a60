"""The eight unit tests seed 000 lists for PR-A (test_kv_sharing_fast_prefill.py), against impl directly."""

from __future__ import annotations

import dataclasses

import pytest

from contracts.models import argv_for, model_dir
from impl.args import Platform, ServerArgs, check_server_args, make_parser
from impl.config import ModelConfig
from impl.args.resolution import resolutions_of

FLAG = "--kv-sharing-fast-prefill"
E2B = "gemma-4-E2B-it"


def _check(*argv: str) -> ServerArgs:
    args = ServerArgs.parse(list(argv))
    check_server_args(args, platform=Platform.cpu())
    return args


def test_dataclass_default():
    field = {f.name: f for f in dataclasses.fields(ServerArgs)}["kv_sharing_fast_prefill"]
    assert field.default is False
    assert ServerArgs().kv_sharing_fast_prefill is False


def test_cli_parse():
    assert ServerArgs.parse([FLAG]).kv_sharing_fast_prefill is True
    assert ServerArgs.parse([]).kv_sharing_fast_prefill is False


def test_argparse_registration():
    actions = {a.dest: a for a in make_parser()._actions}
    action = actions["kv_sharing_fast_prefill"]
    assert action.option_strings == [FLAG]
    assert action.nargs == 0 and action.const is True and action.default is False  # store_true
    assert "prefill" in action.help


def test_model_config_plumbing():
    on = ModelConfig.from_server_args(ServerArgs.parse(argv_for(E2B, FLAG)))
    off = ModelConfig.from_server_args(ServerArgs.parse(argv_for(E2B)))
    assert on.kv_sharing_fast_prefill is True and off.kv_sharing_fast_prefill is False
    assert dataclasses.replace(on, kv_sharing_fast_prefill=False) == off
    direct = ModelConfig.from_pretrained(model_dir(E2B), kv_sharing_fast_prefill=True)
    assert direct.kv_sharing_fast_prefill is True and direct.num_kv_shared_layers == 20


def test_eagle_rejected():
    with pytest.raises(ValueError, match=r"--kv-sharing-fast-prefill.*--speculative-algorithm EAGLE\b"):
        _check(*argv_for(E2B, FLAG, "--speculative-algorithm", "EAGLE"))


def test_eagle3_rejected():
    with pytest.raises(ValueError, match=r"--kv-sharing-fast-prefill.*--speculative-algorithm EAGLE3"):
        _check(*argv_for(E2B, FLAG, "--speculative-algorithm", "EAGLE3"))


def test_nextn_accepted():
    args = _check(*argv_for(E2B, FLAG, "--speculative-algorithm", "NEXTN", draft="gemma-4-E2B-it-assistant"))
    assert args.speculative_algorithm == "NEXTN"  # the user's value stays
    assert args.resolved().speculative_algorithm == "FROZEN_KV_MTP"


def test_flag_off_noop(caplog):
    caplog.set_level("INFO", logger="impl")
    # The backend is the model's / platform's default (SGLang's Gemma-4 override: triton; other models on CPU:
    # torch_native), declared by the default rule, never by the fast-prefill pin.
    cases = ((argv_for(E2B), "triton"), (argv_for("Llama-3.1-8B-Instruct"), "torch_native"),
             (argv_for(E2B, "--speculative-algorithm", "EAGLE3"), "triton"))
    for argv, backend in cases:
        args = _check(*argv)
        assert args.resolved().attention_backend == backend
        sources = {r.source for r in resolutions_of(args) if r.field == "attention_backend"}
        assert sources == {"handle_attention_backend_default"}
        assert args.resolved().kv_sharing_fast_prefill is False
    assert not [r for r in caplog.records if "fast prefill" in r.getMessage().lower()]
