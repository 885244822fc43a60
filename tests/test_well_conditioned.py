"""The well-conditioned full-size recipe (e2b-full-wc): its init rules, its Gemma-style tokenizer, its reduced
copies. CI never builds it (9.3 GB); bench/conditioning.py measures its conditioning figures."""

from __future__ import annotations

import json

import pytest
import torch

from impl.checkpoint_factory import checkpoints as ck
from impl.checkpoint_factory import full_size as fs
from impl.checkpoint_factory import well_conditioned as wc
from impl.checkpoint_factory.gemma_tokenizer import BYTE_PIECES, SPACE, train_gemma_tokenizer
from impl.checkpoint_factory.reduced import reduced
from impl.checkpoint_factory.tokenizer_factory import SPECIAL_TOKENS, widen_tokenizer


def test_recipe_is_e2b_full_shape_on_demand_with_its_own_weights_and_tokenizer():
    recipe, plain = ck.TINY_CHECKPOINTS["e2b-full-wc"], ck.TINY_CHECKPOINTS["e2b-full"]
    assert recipe.text_config == plain.text_config and recipe.text_config["vocab_size"] == 262_144
    assert recipe.on_demand and recipe.dtype == "bfloat16" and recipe.kind == "streamed"
    assert recipe.tokenizer == "gemma" and recipe.init
    assert ck.recipe_hash("e2b-full-wc") != ck.recipe_hash("e2b-full")


def _values(name: str, shape: tuple[int, ...], init) -> torch.Tensor:
    spec = fs.TensorSpec(name, shape, name)
    return torch.cat(list(fs.tensor_values(spec, seed=24, init=init)))


def test_init_keeps_attention_logits_small_and_contributions_scaled():
    init = ck.TINY_CHECKPOINTS["e2b-full-wc"].init
    s = wc.scales(init)
    q = _values("model.layers.3.self_attn.q_norm.weight", (256,), init)
    assert abs(float(q.mean()) - s["qk_norm"]) < 0.05 * s["qk_norm"] + 0.01
    post = _values("model.layers.3.post_attention_layernorm.weight", (1536,), init)
    assert abs(float(post.mean()) - s["post_norm"] * s["post_norm_decay"] ** 3) < 0.02
    assert torch.equal(_values("model.layers.3.layer_scalar", (1,), init), torch.ones(1))
    pre = _values("model.layers.3.input_layernorm.weight", (1536,), init)
    assert abs(float(pre.mean()) - 1.0) < 0.02


def test_embedding_rows_have_log_normal_norms_and_do_not_depend_on_the_block_size(monkeypatch):
    init = {"embed_std": 0.05, "embed_tail": 0.5}
    a = _values("model.embed_tokens.weight", (4096, 64), init).view(4096, 64)
    norms = a.norm(dim=1) / (0.05 * 8)
    assert 0.9 < float(norms.mean()) < 1.1 and float(norms.log().std()) > 0.4  # spread: exp(0.5 z)
    monkeypatch.setattr(fs, "BLOCK_ELEMENTS", 64 * 100)  # whole rows per block
    b = _values("model.embed_tokens.weight", (4096, 64), init).view(4096, 64)
    assert a.shape == b.shape and torch.isfinite(b).all()


def test_unknown_init_key_is_refused():
    with pytest.raises(ValueError, match="unknown well-conditioned init keys"):
        wc.scales({"post_norms": 0.1})


def test_gemma_tokenizer_has_the_published_form_and_round_trips_any_text():
    tok = widen_tokenizer(train_gemma_tokenizer(), 4096)
    spec = json.loads(tok.to_str())
    assert spec["model"]["type"] == "BPE" and spec["model"]["byte_fallback"] and spec["model"]["merges"]
    assert spec["normalizer"] == {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    assert spec["decoder"]["type"] == "Sequence"
    assert [d["type"] for d in spec["decoder"]["decoders"]] == ["Replace", "ByteFallback", "Fuse"]
    vocab = spec["model"]["vocab"]
    assert [vocab[t] for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert [vocab[b] for b in BYTE_PIECES] == list(range(6, 262))
    assert {t["content"] for t in spec["added_tokens"]} == set(SPECIAL_TOKENS)  # byte pieces are vocabulary
    assert tok.get_vocab_size() == 4096
    for text in ("Hello world, this is a test.", "naïve café — 日本語 🙂", "  two  spaces"):
        enc = tok.encode(text)
        assert enc.ids[0] == 2 and 3 not in enc.ids  # bos first, never <unk>
        assert tok.decode(enc.ids) == text
    assert any(t.startswith("<0x") for t in tok.encode("日本語").tokens)  # characters not in the corpus: bytes


def test_reduced_recipe_keeps_widths_and_ends_on_a_full_layer():
    recipe = ck.TINY_CHECKPOINTS["e2b-full-wc"]
    r = reduced(recipe, 7, 4096)
    t = r.text_config
    assert t["num_hidden_layers"] == 7 and t["num_kv_shared_layers"] == 2 and t["layer_types"][-1] == "full_attention"
    assert t["hidden_size"] == 1536 and t["vocab_size"] == 4096 and r.init == recipe.init
    assert reduced(recipe, 6).text_config["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"] * 2
    with pytest.raises(ValueError, match="at least 5"):
        reduced(recipe, 4)


def test_a_reduced_copy_meets_the_three_conditioning_figures():
    """bench/conditioning.py on 5 layers of the recipe at its real widths (vocabulary 4096, 96-token prompts): the
    figures docs/accuracy.md states at 7 / 14 layers and 1024 tokens hold here too."""
    import dataclasses

    from bench.conditioning import build_model, measure

    recipe = reduced(ck.TINY_CHECKPOINTS["e2b-full-wc"], 5, 4096)
    model = build_model(dataclasses.replace(recipe, dtype="float32"))
    f = measure(model, 4096, length=96, prompts=1, margin_prompts=4, seed=0, log=lambda *_: None)
    assert f.eager_vs_sdpa <= 1e-4
    assert f.min_layer_effect >= 1e-2
    assert f.margin_fraction > 0.5
