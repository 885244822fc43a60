"""FROZEN_KV_MTP settings: the declared chain resolution, the refusals, the draft/target match, no launch refusal."""

from __future__ import annotations

import dataclasses

import pytest

from impl.args.check import check_server_args
from impl.args.platform import Platform
from impl.args.resolution import resolutions_of
from impl.args.server_args import ServerArgs
from impl.args.speculative import check_draft_matches_target
from impl.args.unsupported import refuse_unimplemented
from impl.config.model_config import ModelConfig
from impl.checkpoint_factory.checkpoints import tiny_checkpoint


def _check(**kw) -> ServerArgs:
    args = ServerArgs(model_path=tiny_checkpoint("e2b"), speculative_algorithm="NEXTN",
                      speculative_draft_model_path=tiny_checkpoint("assistant"), **kw)
    check_server_args(args, platform=Platform.cpu())
    return args


def test_unset_chain_resolves_to_3_1_4_and_48_running_requests():
    args = _check()
    r = args.resolved()
    assert (r.speculative_algorithm, r.speculative_num_steps, r.speculative_eagle_topk, r.speculative_num_draft_tokens) == (
        "FROZEN_KV_MTP", 3, 1, 4)
    assert r.max_running_requests == 48
    sources = {x.field: x.source for x in resolutions_of(args)}
    assert sources["speculative_num_steps"] == "handle_frozen_kv_mtp"
    assert sources["max_running_requests"] == "handle_frozen_kv_mtp"
    refuse_unimplemented(args)  # the launch refusal is gone for FROZEN_KV_MTP chains


@pytest.mark.parametrize("kw,want", [
    (dict(speculative_num_steps=2), (2, 1, 3)),
    (dict(speculative_num_draft_tokens=5), (4, 1, 5)),
    (dict(speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=2), (1, 1, 2)),
])
def test_one_given_value_determines_the_chain(kw, want):
    r = _check(max_running_requests=7, **kw).resolved()
    assert (r.speculative_num_steps, r.speculative_eagle_topk, r.speculative_num_draft_tokens) == want
    assert r.max_running_requests == 7  # the user's value stays


@pytest.mark.parametrize("kw,flags", [
    (dict(speculative_num_steps=2, speculative_num_draft_tokens=5), ("--speculative-num-draft-tokens", "--speculative-num-steps")),
    (dict(speculative_num_steps=0), ("--speculative-num-steps",)),
    (dict(speculative_num_draft_tokens=1), ("--speculative-num-draft-tokens",)),
    (dict(speculative_eagle_topk=2), ("--speculative-eagle-topk", "tree")),
])
def test_inconsistent_or_tree_chains_are_value_errors_naming_the_flags(kw, flags):
    with pytest.raises(ValueError) as e:
        _check(**kw)
    for f in flags:
        assert f in str(e.value)


def test_draft_config_must_match_the_target():
    target = ModelConfig.from_pretrained(tiny_checkpoint("e2b"))
    draft = ModelConfig.from_pretrained(tiny_checkpoint("assistant"))
    check_draft_matches_target(draft, target)
    with pytest.raises(ValueError, match="backbone_hidden_size 48 != the target's hidden_size 64"):
        check_draft_matches_target(dataclasses.replace(draft, backbone_hidden_size=48), target)
    dims = (draft.layer_head_dims[0] * 2,) + tuple(draft.layer_head_dims[1:])
    with pytest.raises(ValueError, match="head_dim"):
        check_draft_matches_target(dataclasses.replace(draft, layer_head_dims=dims), target)
    with pytest.raises(ValueError, match="vocab_size"):
        check_draft_matches_target(dataclasses.replace(draft, vocab_size=draft.vocab_size * 2), target)
    # at startup: an assistant for a different target is refused before any request
    with pytest.raises(ValueError, match="--speculative-draft-model-path"):
        args = ServerArgs(model_path=tiny_checkpoint("noshare"), speculative_algorithm="NEXTN",
                          speculative_draft_model_path=tiny_checkpoint("assistant"), max_running_requests=4)
        check_server_args(args, platform=Platform.cpu(),
                          model_config=dataclasses.replace(ModelConfig.from_pretrained(tiny_checkpoint("noshare")), hidden_size=48))


def test_other_algorithms_are_still_refused_at_launch():
    args = ServerArgs(model_path=tiny_checkpoint("e2b"), speculative_algorithm="EAGLE", speculative_draft_model_path="/x")
    with pytest.raises(ValueError, match="speculative decoding other than FROZEN_KV_MTP"):
        refuse_unimplemented(args)
