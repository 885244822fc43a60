"""The tiny checkpoint factory: deterministic, cached, atomic, and loadable by transformers."""

from __future__ import annotations

import hashlib
import json
import os
import threading

import pytest
import torch

from impl.checkpoint_factory import checkpoints as ck
from impl.checkpoint_factory.hf_quirks import assistant_kv_sharing_patch

TEXT = ["e2b", "k_eq_v", "moe", "noshare"]
ASSISTANTS = ["assistant", "assistant_ordered", "assistant_bench"]
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _digest(folder: str) -> dict[str, str]:
    return {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest() for f in FILES}


def test_names_paths_and_hashes():
    hashes = {n: ck.recipe_hash(n) for n in ck.TINY_CHECKPOINTS}
    assert hashes == {n: ck.recipe_hash(n) for n in ck.TINY_CHECKPOINTS}  # stable
    assert len(set(hashes.values())) == len(hashes)  # distinct per name
    path = ck.checkpoint_dir("e2b")
    assert os.path.basename(path) == f"e2b-{hashes['e2b']}"
    assert ck.default_model_path() == ck.tiny_checkpoint("e2b") == path
    with pytest.raises(ValueError, match="unknown tiny checkpoint 'nope'.*e2b"):
        ck.tiny_checkpoint("nope")


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(ck.CACHE_ENV, str(tmp_path))
    assert ck.checkpoint_dir("moe").startswith(os.path.join(str(tmp_path), "checkpoints", "moe-"))


def test_build_is_byte_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    ck.build_checkpoint("e2b", str(a))
    ck.build_checkpoint("e2b", str(b))
    assert _digest(str(a)) == _digest(str(b)) == _digest(ck.tiny_checkpoint("e2b"))
    other = _digest(ck.tiny_checkpoint("noshare"))
    assert other["model.safetensors"] != _digest(str(a))["model.safetensors"]
    assert other["tokenizer.json"] == _digest(str(a))["tokenizer.json"]


def test_concurrent_callers_get_one_complete_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(ck.CACHE_ENV, str(tmp_path))
    results, errors = [], []

    def worker():
        try:
            results.append(ck.tiny_checkpoint("assistant"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    folder = results[0]
    assert sorted(os.listdir(folder)) == sorted(FILES)
    leftovers = [e for e in os.listdir(os.path.dirname(folder)) if e.startswith(".tmp-")]
    assert leftovers == []


def test_cli_builds_and_prints_paths(capsys):
    assert ck.main(["noshare", "moe"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"noshare\t{ck.tiny_checkpoint('noshare')}", f"moe\t{ck.tiny_checkpoint('moe')}"]
    assert ck.main(["bogus"]) == 2


def _greedy(model, ids: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False, eos_token_id=[], pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("name", TEXT)
def test_transformers_loads_text_checkpoint_and_generates_varied_text(name):
    from transformers import Gemma4ForCausalLM

    path = ck.tiny_checkpoint(name)
    recipe = ck.TINY_CHECKPOINTS[name].text_config
    model = Gemma4ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_kv_shared_layers, cfg.hidden_size) == (
        recipe["num_hidden_layers"], recipe["num_kv_shared_layers"], recipe["hidden_size"])
    assert (cfg.attention_k_eq_v, cfg.enable_moe_block, cfg.hidden_size_per_layer_input) == (
        recipe["attention_k_eq_v"], recipe["enable_moe_block"], recipe["hidden_size_per_layer_input"])
    full = cfg.layer_types.index("full_attention")
    assert model.model.layers[full].self_attn.head_dim == recipe["global_head_dim"] != recipe["head_dim"]
    # non-default values survive the round trip (a loader that ignores them is caught by parity tests)
    scalars = torch.stack([layer.layer_scalar for layer in model.model.layers]).flatten()
    assert (scalars - 1).abs().min() > 0 and model.model.norm.weight.std() > 0.01
    raw = json.load(open(os.path.join(path, "config.json")))
    if ck.TINY_CHECKPOINTS[name].published_config_form:
        assert "per_layer_config" not in raw and raw["global_head_dim"] == recipe["global_head_dim"]
    else:
        assert "per_layer_config" in raw

    # greedy text over a prompt longer than the sliding window (16) is not stuck on one token
    out = _greedy(model, [2] + list(range(100, 130)), steps=12)
    assert len(set(out)) >= 5, out
    # and different prompts lead to different next tokens
    prompts = torch.tensor([[2, 45 + i, 74, 296, 84 + 3 * i] for i in range(4)])
    with torch.no_grad():
        nxt = model(prompts).logits[:, -1].argmax(-1)
    assert len(set(nxt.tolist())) >= 3, nxt


@pytest.mark.parametrize("name", ASSISTANTS)
def test_transformers_loads_assistant_matching_its_target(name):
    from transformers import Gemma4AssistantForCausalLM, Gemma4TextConfig

    target = ck.TINY_CHECKPOINTS[ck.ASSISTANT_TARGETS[name]].text_config
    original = Gemma4TextConfig.__dict__["kv_sharing_modes"]
    with assistant_kv_sharing_patch():
        model = Gemma4AssistantForCausalLM.from_pretrained(ck.tiny_checkpoint(name), dtype=torch.float32).eval()
    assert Gemma4TextConfig.__dict__["kv_sharing_modes"] is original  # patch undone
    tc = model.config.text_config
    assert model.config.backbone_hidden_size == target["hidden_size"]
    assert tc.num_kv_shared_layers == tc.num_hidden_layers
    attn = [layer.self_attn for layer in model.model.layers]
    assert (attn[0].head_dim, attn[-1].head_dim, tc.sliding_window) == (
        target["head_dim"], target["global_head_dim"], target["sliding_window"])

    # one draft step over fabricated target K/V: [batch, kv_heads, kv_len, head_dim] per layer type
    g = torch.Generator().manual_seed(0)
    kv_len, hb = 20, target["hidden_size"]
    kv = {
        "sliding_attention": tuple(torch.randn(1, 1, kv_len, target["head_dim"], generator=g) for _ in range(2)),
        "full_attention": tuple(torch.randn(1, 1, kv_len, target["global_head_dim"], generator=g) for _ in range(2)),
    }
    with torch.no_grad():
        out = model(inputs_embeds=torch.randn(1, 1, 2 * hb, generator=g), shared_kv_states=kv,
                    position_ids=torch.tensor([[kv_len]]))
    assert out.logits.shape == (1, 1, 512) and out.last_hidden_state.shape == (1, 1, hb)
    assert torch.isfinite(out.logits).all()
    if model.config.use_ordered_embeddings:
        ordering = model.masked_embedding.token_ordering
        assert sorted(ordering.tolist()) == list(range(512))  # a permutation, not the all-zero default
        kept = (out.logits > out.logits.min()).sum().item()
        assert kept == model.config.centroid_intermediate_top_k * 512 // model.config.num_centroids


def test_real_dimension_recipes_are_on_demand_and_e2b_shaped():
    """e2b-dims (and its 7-layer cut) carry E2B's layer dimensions; build_all never builds them (not in CI)."""
    from transformers import Gemma4TextConfig

    for name, layers, shared in (("e2b-dims", 35, 20), ("e2b-dims-7l", 7, 4)):
        recipe = ck.TINY_CHECKPOINTS[name]
        assert recipe.on_demand
        cfg = Gemma4TextConfig(**dict(recipe.text_config))
        assert (cfg.num_hidden_layers, cfg.num_kv_shared_layers) == (layers, shared)
        assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (
            1536, 6144, 8, 1)
        tc = recipe.text_config
        assert (tc["head_dim"], tc["global_head_dim"], cfg.sliding_window) == (256, 512, 512)
        assert cfg.use_double_wide_mlp and cfg.hidden_size_per_layer_input == 256
        assert cfg.layer_types[-1] == "full_attention"
        assert cfg.rope_parameters["full_attention"]["partial_rotary_factor"] == 0.25
    s, f = "sliding_attention", "full_attention"
    assert ck.TINY_CHECKPOINTS["e2b-dims"].text_config["layer_types"] == [s, s, s, s, f] * 7
    assert not {"e2b-dims", "e2b-dims-7l"} & {n for n, r in ck.TINY_CHECKPOINTS.items() if not r.on_demand}
