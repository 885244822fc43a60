"""Weight loading: layouts (single, sharded, multimodal), dtypes, and clear errors for bad checkpoints."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from impl.model.loader import load_model
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.model import ours, prompt
from tests.helpers.session import Session


def _copy_with(tmp_path, name: str, edit) -> str:
    """Copy checkpoint ``name`` to tmp_path with its tensors passed through ``edit(dict)``."""
    src = tiny_checkpoint(name)
    dst = str(tmp_path / name)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    edit(tensors)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return dst


def _same_logits(model, ref_model, tol=0.0) -> None:
    toks = prompt(20, 3)
    a = Session(model).step([("a", toks)], all_logits=True).logits
    b = Session(ref_model).step([("a", toks)], all_logits=True).logits
    assert (a - b).abs().max().item() <= tol


def test_corrupted_shape_names_tensor_and_shapes(tmp_path):
    name = "model.layers.3.mlp.up_proj.weight"

    def edit(t):
        t[name] = t[name][:-1]

    path = _copy_with(tmp_path, "e2b", edit)
    with pytest.raises(ValueError, match=r"model\.layers\.3\.mlp\.up_proj\.weight.*\(127, 64\).*expected \(128, 64\)"):
        load_model(path)


def test_missing_tensor_names_it(tmp_path):
    path = _copy_with(tmp_path, "e2b", lambda t: t.pop("model.layers.7.self_attn.k_norm.weight"))
    with pytest.raises(ValueError, match=r"missing 1 tensor.*layers\.7\.self_attn\.k_norm\.weight.*expected shape \(16,\)"):
        load_model(path)


def test_unexpected_tensor_names_it(tmp_path):
    def edit(t):
        t["model.layers.2.self_attn.bogus.weight"] = torch.zeros(2)

    with pytest.raises(ValueError, match=r"model\.layers\.2\.self_attn\.bogus\.weight"):
        load_model(_copy_with(tmp_path, "e2b", edit))


def test_shared_layer_kv_weights_are_ignored(tmp_path):
    def edit(t):
        # layer 30 is KV-shared (sliding): a checkpoint may still carry its k/v projections and norms
        t["model.layers.30.self_attn.k_proj.weight"] = torch.ones(16, 64)
        t["model.layers.30.self_attn.v_proj.weight"] = torch.ones(16, 64)
        t["model.layers.30.self_attn.k_norm.weight"] = torch.ones(16)
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()

    _same_logits(load_model(_copy_with(tmp_path, "e2b", edit)), ours("e2b"))


def test_sharded_checkpoint(tmp_path):
    src = tiny_checkpoint("k_eq_v")
    dst = str(tmp_path / "sharded")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, os.path.join(dst, fname))
        weight_map.update({k: fname for k in keys})
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    _same_logits(load_model(dst), ours("k_eq_v"))


def test_multimodal_layout_skips_towers_with_one_log_line(tmp_path, caplog):
    src = tiny_checkpoint("noshare")
    dst = str(tmp_path / "mm")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    with open(os.path.join(src, "config.json")) as f:
        text_cfg = json.load(f)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text_cfg}, f)
    tensors = {k.replace("model.", "model.language_model.", 1): v for k, v in load_file(os.path.join(src, "model.safetensors")).items()}
    tensors["model.vision_tower.encoder.layers.0.mlp.gate_proj.linear.weight"] = torch.zeros(4, 4)
    tensors["model.audio_tower.layers.0.norm.weight"] = torch.zeros(4)
    tensors["model.embed_vision.embedding_projection.weight"] = torch.zeros(4, 4)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with caplog.at_level(logging.INFO, logger="impl.model"):
        model = load_model(dst)
    skips = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert skips == ["skipped 3 non-text (vision/audio) tensors"]
    _same_logits(model, ours("noshare"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_dtypes(dtype):
    """Weights convert to the asked dtype; the error against float32 is of transformers' own size in that dtype."""
    from transformers import Gemma4ForCausalLM

    path, toks = tiny_checkpoint("e2b"), prompt(20, 3)
    model = load_model(path, dtype=dtype)
    assert all(p.dtype == getattr(torch, dtype) for p in model.parameters())
    ours_low = Session(model).step([("a", toks)], all_logits=True).logits
    ref32 = Session(ours("e2b")).step([("a", toks)], all_logits=True).logits
    with torch.no_grad():
        hf_low = Gemma4ForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))(torch.tensor([toks])).logits[0].float()
    hf_err = (hf_low - ref32).abs().max().item()
    assert (ours_low - ref32).abs().max().item() <= 1.5 * hf_err


def test_bad_dtype_and_folder(tmp_path):
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        load_model(tiny_checkpoint("e2b"), dtype="int8")
    with pytest.raises(ValueError, match="no config.json"):
        load_model(str(tmp_path))
