"""Quantized weights while loading: compressed-tensors checkpoints (W8A8, W4A16 pack-quantized, written with the
compressed-tensors library's packing) and --torchao-config on a float checkpoint, as a user sees them: the
weights the engine serves, the startup log, /get_server_info, and tokens."""

from __future__ import annotations

import json
import os

import pytest
import torch

from impl import Engine
from impl.config import ModelConfig
from impl.model.loader import load_model
from impl.quant import reference
from impl.quant.base import QuantScheme, WeightFormat
from impl.quant.checkpoint import unpack_int4
from impl.quant.config import resolve_scheme
from impl.checkpoint_factory.checkpoints import tiny_checkpoint

pytest.importorskip("compressed_tensors")
from impl.checkpoint_factory.quantized import quantized_checkpoint  # noqa: E402

PROMPTS = [[2, 5, 9, 11, 3, 7, 8, 1 + i] * (i + 1) for i in range(3)]


def _file_tensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


@pytest.mark.parametrize("scheme", ["W8A8", "W4A16"])
def test_compressed_tensors_weights_are_served_as_stored(scheme):
    """Every quantized linear the engine serves dequantizes to exactly the checkpoint's codes times its scales."""
    path = quantized_checkpoint("e2b", scheme)
    mc = ModelConfig.from_pretrained(path)
    q = resolve_scheme(None, None, mc.quantization_config)
    assert q is not None and q.prequantized and q.fmt.kind == ("w8a8" if scheme == "W8A8" else "w4a16")
    model = load_model(path, "float32", config=mc, quant=q)
    files = _file_tensors(path)
    checked = 0
    for name in ("layers.0.self_attn.q_proj", "layers.4.mlp.down_proj", "layers.30.self_attn.o_proj",
                 "per_layer_model_projection"):
        w = model.get_submodule(name).weight
        k = model.get_submodule(name).in_features
        scale = files[f"model.{name}.weight_scale"].float()
        if scheme == "W8A8":
            expect = files[f"model.{name}.weight"].float() * scale
        else:
            codes = unpack_int4(files[f"model.{name}.weight_packed"], k).float() - 8
            expect = (codes.view(w.shape[0], -1, 32) * scale[..., None]).reshape(w.shape[0], k)
        assert torch.equal(reference.dequantize(w, k), expect), name
        checked += 1
    assert checked == 4
    # the tied LM head reads an int8 copy (W8A8 beside W8A8 layers, else W8A16); the embedding it is tied to
    # stays float (gathers)
    head = torch.int8 if scheme == "W8A8" else torch.uint8
    assert model.lm_head_quant.dtype == head and model.embed_tokens.weight.dtype == torch.float32


def test_int4_packing_matches_compressed_tensors():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    codes = torch.randint(-8, 8, (6, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_int4(pack_to_int32(codes, 4), 64).to(torch.int16) - 8, codes.to(torch.int16))


@pytest.mark.parametrize("scheme", ["W8A8", "W4A16"])
def test_compressed_tensors_checkpoint_serves(scheme):
    e = Engine(quantized_checkpoint("e2b", scheme), random_seed=0)
    try:
        out = e.generate(input_ids=PROMPTS, sampling_params=dict(max_new_tokens=4, temperature=0))
        assert all(len(o["output_ids"]) == 4 for o in out)
        info = e.get_server_info()
        kind = "w8a8" if scheme == "W8A8" else "w4a16"
        head = "w8a8" if scheme == "W8A8" else "w8a16"  # activation-quantized formats quantize the head's too
        assert info["quantization"]["format"] == kind and info["quantization"]["lm_head"] == head
        assert info["cpu_kernels"]["weight_dtype"] == kind and info["cpu_kernels"]["layers"] == {"fused": 35}
        line = next(x for x in info["startup_log"] if x.startswith("Quantized weights: "))
        assert "checkpoint (compressed-tensors" in line and "GB of weights read per decode step" in line
    finally:
        e.shutdown()


def test_on_the_fly_int4_reads_fewer_bytes_than_float():
    path = tiny_checkpoint("e2b")
    byts = {}
    for cfg in ({}, {"torchao_config": "int4wo-32"}, {"torchao_config": "int8dq"}, {"torchao_config": "8da4w-32"}):
        e = Engine(path, random_seed=0, **cfg)
        try:
            q = e.get_server_info()["quantization"]
            byts[cfg.get("torchao_config", "float")] = None if q is None else q["decode_weight_bytes"]
            assert e.generate(input_ids=PROMPTS[0], sampling_params=dict(max_new_tokens=3, temperature=0))["output_ids"]
        finally:
            e.shutdown()
    assert byts["float"] is None
    assert byts["int4wo-32"] < byts["int8dq"]
    assert byts["8da4w-32"] == byts["int4wo-32"]  # the same bytes, int8 activations


def test_ignored_modules_keep_float_weights(tmp_path):
    src = quantized_checkpoint("e2b", "W8A8")
    dst = tmp_path / "ck"
    os.makedirs(dst)
    for n in os.listdir(src):
        os.symlink(os.path.join(src, n), dst / n) if n != "config.json" else None
    cfg = json.load(open(os.path.join(src, "config.json")))
    mc = ModelConfig.from_hf_dict(cfg, model_path=str(dst))
    q = resolve_scheme(None, None, mc.quantization_config)
    assert q is not None
    # per_layer_projection (8 inputs) cannot be int8 per channel in groups of 32: the writer listed it in ignore
    assert any("per_layer_projection" in x for x in cfg["quantization_config"]["ignore"])
    assert QuantScheme(WeightFormat("w8a8"), "x", False).describe().startswith("w8a8")


def test_quantized_head_maps_the_embedding(monkeypatch):
    """With a packed LM head the tied embedding is only gathered: it is mapped from the checkpoint (as the
    per-layer-embedding table) and gathered through its FileRows, the head packed from the file in blocks of
    rows. The head's bytes and the embedded rows equal those of a model that loads the table into memory."""
    path = tiny_checkpoint("e2b")
    scheme = resolve_scheme(None, "8da4w-32", None)
    mapped = load_model(path, "float32", quant=scheme)
    assert "embed_tokens.weight" in mapped.weight_plan.mapped and hasattr(mapped.embed_tokens, "file_rows")
    monkeypatch.setenv("IMPL_MMAP_EMBEDDINGS", "0")
    loaded = load_model(path, "float32", quant=scheme)
    assert "embed_tokens.weight" not in loaded.weight_plan.mapped
    assert torch.equal(mapped.lm_head_quant, loaded.lm_head_quant)
    ids = torch.tensor([0, 5, 17, 5, mapped.config.vocab_size - 1])
    assert torch.equal(mapped.embed(ids), loaded.embed(ids))
    # a float LM head is the embedding itself, read whole every step: kept in memory
    plain = load_model(path, "float32", quant=QuantScheme(WeightFormat("w8a8"), "test", False, lm_head=None))
    assert "embed_tokens.weight" not in plain.weight_plan.mapped


def test_layers_named_in_impl_quant_keep_stay_float(monkeypatch):
    """IMPL_QUANT_KEEP keeps the layers its patterns name in the checkpoint's dtype (as llama-quantize's per-tensor
    overrides do): /get_server_info lists them with the reason, fewer bytes are packed, and the fused kernels serve
    the mixed layer (a float q_proj beside int8 k/v) with the torch reference's tokens. A pre-quantized checkpoint
    refuses it (its ignore list says which layers are float)."""
    path = tiny_checkpoint("e2b")
    monkeypatch.setenv("IMPL_QUANT_KEEP", "per_layer_model_projection,layers.0.self_attn.q_proj")
    ids = {}
    for fused in ("1", "0"):
        monkeypatch.setenv("IMPL_CPU_FUSED", fused)
        e = Engine(path, random_seed=0, torchao_config="int8dq")
        try:
            kept = e.get_server_info()["quantization"]["kept_float"]
            ids[fused] = e.generate(input_ids=PROMPTS[1], sampling_params=dict(max_new_tokens=4, temperature=0))["output_ids"]
        finally:
            e.shutdown()
        for name in ("per_layer_model_projection.weight", "layers.0.self_attn.q_proj.weight"):
            assert kept[name] == "kept by IMPL_QUANT_KEEP", kept
        assert "layers.1.self_attn.q_proj.weight" not in kept
    assert ids["1"] == ids["0"]
    cfg = json.load(open(os.path.join(quantized_checkpoint("e2b", "W8A8"), "config.json")))
    scheme = resolve_scheme(None, None, cfg["quantization_config"])
    with pytest.raises(ValueError, match="IMPL_QUANT_KEEP.*already quantized"):
        load_model(quantized_checkpoint("e2b", "W8A8"), "float32", quant=scheme)
