"""The streamed full-size checkpoint writer (impl/checkpoint_factory/full_size.py) and the e2b-full recipes.

CI never builds e2b-full (9.3 GB): it checks the recipe's shape from the meta-device model, and the
writer on the small streamed recipe ``e2b-mm``, whose file digest pins FORMAT_VERSION (the full-size
recipes' cache key does not hash the factory's source, see full_size.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest
import torch

from impl.checkpoint_factory import checkpoints as ck
from impl.checkpoint_factory import full_size as fs
from impl.checkpoint_factory.corpus import CORPUS


def folder_digest(folder: str) -> str:
    files = sorted(os.listdir(folder))
    parts = [(f, hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest()) for f in files]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def test_streamed_writer_output_is_pinned_by_its_format_version(tmp_path):
    ck.build_checkpoint("e2b-mm", str(tmp_path))
    digest = folder_digest(str(tmp_path))
    assert digest == folder_digest(ck.tiny_checkpoint("e2b-mm"))  # deterministic
    assert digest == fs.GOLDEN_DIGEST, (
        f"the streamed writer's output changed (digest {digest}): bump full_size.FORMAT_VERSION (so every streamed "
        "checkpoint gets a new folder) and set GOLDEN_DIGEST to the new digest")


def test_streamed_multimodal_layout_is_what_transformers_saves_and_loads(tmp_path):
    from safetensors import safe_open
    from transformers import Gemma4ForConditionalGeneration

    path = ck.tiny_checkpoint("e2b-mm")
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    names = set(index["weight_map"])
    text = {n for n in names if n.startswith("model.language_model.")}
    with safe_open(os.path.join(ck.tiny_checkpoint("e2b"), "model.safetensors"), "pt") as f:
        assert {n.replace("model.language_model.", "model.", 1) for n in text} == set(f.keys())
    assert {n.split(".")[1] for n in names - text} == {"vision_tower", "audio_tower", "embed_vision", "embed_audio"}
    cfg = json.load(open(os.path.join(path, "config.json")))
    assert cfg["architectures"] == ["Gemma4ForConditionalGeneration"] and cfg["model_type"] == "gemma4"
    model = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)  # no missing / unexpected keys
    assert model.model.audio_tower.layers[0].self_attn.q_proj.input_min.item() == float("-inf")


def test_e2b_full_recipes_are_the_published_shape_on_demand():
    total = {}
    for name in ("e2b-full", "e2b-full-mm"):
        recipe = ck.TINY_CHECKPOINTS[name]
        assert recipe.on_demand and recipe.kind == "streamed" and recipe.dtype == "bfloat16"
        cfg = fs.hf_config(recipe)
        tc = getattr(cfg, "text_config", cfg)
        assert (tc.vocab_size, tc.vocab_size_per_layer_input, tc.hidden_size, tc.intermediate_size) == (
            262144, 262144, 1536, 6144)
        assert (tc.num_hidden_layers, tc.num_kv_shared_layers, tc.num_attention_heads, tc.num_key_value_heads) == (
            35, 20, 8, 1)
        assert tc.layer_types == (["sliding_attention"] * 4 + ["full_attention"]) * 7
        rc = recipe.text_config
        assert (rc["head_dim"], rc["global_head_dim"], tc.sliding_window, tc.hidden_size_per_layer_input) == (
            256, 512, 512, 256)
        assert tc.use_double_wide_mlp and tc.tie_word_embeddings and tc.final_logit_softcapping == 30.0
        assert tc.rope_parameters == {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
        specs = {s.value_name: s.shape for s in fs.tensor_specs(recipe)}
        assert specs["model.embed_tokens_per_layer.weight"] == (262144, 35 * 256)
        assert specs["model.layers.34.mlp.gate_proj.weight"] == (12288, 1536)  # double-wide shared MLP
        text_prefix = "model.language_model." if recipe.towers else "model."
        total[name] = sum(s.numel for s in fs.tensor_specs(recipe) if s.name.startswith(text_prefix))
    assert total["e2b-full"] == total["e2b-full-mm"] == 4_628_569_379  # 4.63 B text parameters, 9.3 GB in bf16
    assert all(ck.TINY_CHECKPOINTS[n].on_demand for n in ("e2b-full", "e2b-full-mm"))


def test_full_size_cache_key_ignores_the_factory_source(monkeypatch):
    before = {n: ck.recipe_hash(n) for n in ("e2b-full", "e2b-full-mm", "e2b")}
    monkeypatch.setattr(ck, "_factory_sources", lambda: "an edited factory")
    after = {n: ck.recipe_hash(n) for n in before}
    assert after["e2b-full"] == before["e2b-full"] and after["e2b-full-mm"] == before["e2b-full-mm"]
    assert after["e2b"] != before["e2b"]  # the tiny recipes still rebuild on any factory edit
    monkeypatch.setattr(fs, "FORMAT_VERSION", fs.FORMAT_VERSION + 1)
    assert ck.recipe_hash("e2b-full") != before["e2b-full"]


def test_full_size_build_refuses_a_disk_too_small(monkeypatch, tmp_path):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 0, 10**9))
    with pytest.raises(ValueError, match=r"needs \d+ bytes \(8\.7 GiB\) of disk.*1000000000 bytes"):
        ck.build_checkpoint("e2b-full", str(tmp_path))
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # a 262144-entry tokenizer
def test_widened_tokenizer_has_exactly_262144_entries_and_round_trips():
    from impl.checkpoint_factory.tokenizer_factory import BOS_ID, END_OF_TURN_ID, SPECIAL_TOKENS, train_tokenizer, widen_tokenizer

    tok = widen_tokenizer(train_tokenizer(), 262144)
    assert tok.get_vocab_size(with_added_tokens=True) == 262144
    vocab = tok.get_vocab(with_added_tokens=True)
    assert sorted(vocab.values()) == list(range(262144))
    assert [vocab[s] for s in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    for line in CORPUS.splitlines()[:40]:
        ids = tok.encode(line).ids
        assert ids[0] == BOS_ID and tok.decode(ids) == line
    assert tok.encode("<start_of_turn>user\nhi<end_of_turn>").ids.count(END_OF_TURN_ID) == 1
    # random ids (what a random-weight model emits) decode, high ids included
    r = random.Random(0)
    text = tok.decode([r.randrange(6, 262144) for _ in range(200)])
    assert isinstance(text, str) and len(text) > 100
