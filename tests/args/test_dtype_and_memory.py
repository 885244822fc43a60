"""--dtype auto follows the checkpoint (impl/args/dtype.py); a model that cannot fit is refused before
loading; the CPU default KV budget is sized from what the weights leave (impl/cache/memory.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from impl.args.check import check_server_args
from impl.args.dtype import auto_dtype
from impl.args.platform import Platform
from impl.args.resolution import resolutions_of
from impl.args.server_args import ServerArgs
from impl.cache import memory
from impl.config.model_config import ModelConfig
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.model import bf16_copy


def test_auto_dtype_rule():
    assert auto_dtype("bfloat16", is_cuda=False) == "bfloat16"
    assert auto_dtype("float32", is_cuda=False) == "float32"
    assert auto_dtype("float16", is_cuda=False) == "bfloat16"  # no fast float16 on CPU
    assert auto_dtype("float16", is_cuda=True) == "float16"
    assert auto_dtype(None, is_cuda=False) == auto_dtype("int8", is_cuda=True) == "float32"


@pytest.mark.parametrize("given,want", [("auto", "bfloat16"), ("float32", None), ("bfloat16", None)])
def test_auto_is_a_declared_resolution_explicit_dtypes_are_kept(given, want):
    mc = ModelConfig.from_hf_dict({"model_type": "gemma4_text", "dtype": "bfloat16", "num_hidden_layers": 2},
                                  model_path="/m/gemma")
    args = ServerArgs(model_path="/m/gemma", dtype=given)
    check_server_args(args, mc, Platform.cpu())
    declared = [(r.field, r.value, r.source) for r in resolutions_of(args) if r.field == "dtype"]
    assert declared == ([] if want is None else [("dtype", want, "handle_dtype_auto")])
    assert args.resolved().dtype == (want or given)


def test_multimodal_config_dtype_at_the_top_level_counts():
    mc = ModelConfig.from_hf_dict({"model_type": "gemma4", "torch_dtype": "bfloat16", "text_config": {}})
    assert mc.torch_dtype == "bfloat16"


@pytest.mark.slow  # loads an engine
def test_engine_serves_a_bf16_checkpoint_in_bf16_by_default(tmp_path_factory, caplog):
    from impl.engine.engine import Engine

    path = bf16_copy(tmp_path_factory)
    with caplog.at_level(logging.INFO):
        eng = Engine(path, max_total_tokens=512)
    try:
        assert eng.runner.dtype == torch.bfloat16
        assert "Resolved dtype='bfloat16' (was 'auto'; by handle_dtype_auto)" in caplog.text
        mem = [line for line in eng.startup_log if line.startswith("Memory: peak RSS ")]
        assert len(mem) == 1 and "memory-mapped" in mem[0], eng.startup_log
        info = eng.get_server_info()["memory"]
        assert info["peak_rss_bytes"] >= info["load_peak_rss_bytes"] > 0
        out = eng.generate(input_ids=[2, 40, 41, 42], sampling_params={"max_new_tokens": 3, "temperature": 0})
        assert len(out["output_ids"]) == 3
    finally:
        eng.shutdown()


def test_a_model_that_cannot_fit_is_refused_before_loading(monkeypatch, tmp_path_factory):
    from impl.engine import model_runner
    from impl.engine.engine import Engine

    def no_load(*a, **k):
        raise AssertionError("load_model must not run for a model that does not fit")

    monkeypatch.setattr(model_runner, "load_model", no_load)
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: 50 * 2**20)
    with pytest.raises(ValueError) as err:
        Engine(tiny_checkpoint("e2b"))
    msg = str(err.value)
    assert "does not fit: it needs " in msg and "52428800 bytes (0.05 GiB) of host memory" in msg
    assert "KV pool of at least 2048 tokens x 2304 bytes" in msg  # the tiny model's context (2048) < 4096
    assert "--max-total-tokens" in msg and "--dtype bfloat16" in msg and "--chunked-prefill-size 512" in msg
    # float32 asked over a bf16 checkpoint: the dtype flag is named as the fix
    with pytest.raises(ValueError, match=r"--dtype auto or --dtype bfloat16 \(the checkpoint's dtype"):
        Engine(bf16_copy(tmp_path_factory), dtype="float32")


def test_cpu_default_kv_budget_is_sized_from_what_the_weights_leave(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: 10 * 2**30)
    # 8.6 GiB of weights (E2B in bf16) no longer matter to the default: half of what is left
    b = memory.kv_budget(18432, cpu, weight_bytes=int(8.6 * 2**30))
    assert b.num_tokens == memory.CPU_DEFAULT_MAX_TOKENS and "CPU default: 0.5 of the 10.0 GiB" in b.reason
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: 2**30)
    assert memory.kv_budget(18432, cpu, weight_bytes=8 * 2**30).num_tokens == 2**29 // 18432
    # the explicit flag keeps SGLang's meaning, and its refusal names the fix
    with pytest.raises(ValueError, match="does not cover the 8.00 GiB of weights.*leave both unset on CPU"):
        memory.kv_budget(18432, cpu, weight_bytes=8 * 2**30, mem_fraction_static=0.3)
