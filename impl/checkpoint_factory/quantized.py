"""Write a compressed-tensors checkpoint from a float one (the format llm-compressor writes and vLLM / SGLang load).

``write_compressed_tensors(src, dst, scheme)`` streams the source shard by shard (one shard's tensors in memory
at a time): every linear weight of the text decoder (q/k/v/o, gate/up/down, the per-layer-input gate and
projection, the model's per-layer-input projection) whose width allows the scheme is quantized with
compressed-tensors' own rules and its ``pack_to_int32``; every other tensor is copied; config.json gets the
``quantization_config`` llm-compressor writes for the preset (``W8A8``: int8 channel weights with dynamic
per-token int8 activations, ``int-quantized``; ``W4A16``: symmetric int4 groups of 128, ``pack-quantized``),
with the modules left in float (the tied LM head among them) in ``ignore``.

Command line (on demand; never run by ``make test``):
``python -m impl.checkpoint_factory.quantized SRC DST --scheme W8A8|W4A16 [--group-size 128]``.
``quantized_checkpoint(name, scheme)`` builds (once) and caches one from a tiny checkpoint for the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile

import torch

LINEAR = re.compile(r"^(model\.(?:language_model\.)?)(layers\.\d+\.(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj|"
                    r"per_layer_input_gate|per_layer_projection)|per_layer_model_projection)\.weight$")
SCHEMES = ("W8A8", "W4A16")


def _qconfig(scheme: str, group: int, ignore: list[str]) -> dict:
    if scheme == "W8A8":
        weights = dict(num_bits=8, type="int", symmetric=True, strategy="channel", group_size=None, dynamic=False,
                       observer="minmax")
        acts = dict(num_bits=8, type="int", symmetric=True, strategy="token", group_size=None, dynamic=True,
                    observer=None)
        fmt = "int-quantized"
    else:
        weights = dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group, dynamic=False,
                       observer="minmax")
        acts = None
        fmt = "pack-quantized"
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                      "output_activations": None, "format": fmt}},
        "ignore": sorted(ignore),
        "kv_cache_scheme": None,
    }


def _quantize(w: torch.Tensor, scheme: str, group: int) -> dict[str, torch.Tensor]:
    """compressed-tensors' symmetric quantization of one weight [N, K] -> its stored tensors (by suffix)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    wf = w.float()
    n, k = wf.shape
    if scheme == "W8A8":  # scale = max|w| / ((127 - (-128)) / 2), codes clamped to int8
        s = wf.abs().amax(dim=1, keepdim=True) / 127.5
        q = torch.round(wf / torch.where(s > 0, s, 1.0)).clamp_(-128, 127).to(torch.int8)
        return {"weight": q, "weight_scale": s.to(w.dtype)}
    wg = wf.view(n, k // group, group)
    s = wg.abs().amax(dim=2, keepdim=True) / 7.5  # (7 - (-8)) / 2
    q = torch.round(wg / torch.where(s > 0, s, 1.0)).clamp_(-8, 7).to(torch.int8).view(n, k)
    return {"weight_packed": pack_to_int32(q, 4), "weight_scale": s.view(n, -1).to(w.dtype),
            "weight_shape": torch.tensor([n, k], dtype=torch.int64)}


def _fits(k: int, scheme: str, group: int) -> bool:
    g = k if scheme == "W8A8" else group
    return k % g == 0 and g % 32 == 0


def write_compressed_tensors(src: str, dst: str, scheme: str, group: int = 128) -> None:
    """Write ``src`` (an HF checkpoint folder) quantized with ``scheme`` into the folder ``dst`` (created)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    os.makedirs(dst, exist_ok=True)
    index_path = os.path.join(src, "model.safetensors.index.json")
    shards = sorted(set(json.load(open(index_path))["weight_map"].values())) if os.path.isfile(index_path) else ["model.safetensors"]
    weight_map: dict[str, str] = {}
    ignore: list[str] = []
    for shard in shards:
        out: dict[str, torch.Tensor] = {}
        with safe_open(os.path.join(src, shard), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                m = LINEAR.match(name)
                if m and t.dim() == 2 and _fits(t.shape[1], scheme, group):
                    module = name[: -len(".weight")]
                    for suffix, v in _quantize(t, scheme, group).items():
                        out[f"{module}.{suffix}"] = v.contiguous()
                else:
                    if m:
                        ignore.append(name[: -len(".weight")])
                    out[name] = t.contiguous()
        save_file(out, os.path.join(dst, shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in out})
        del out
    if len(shards) > 1:
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    config = json.load(open(os.path.join(src, "config.json")))
    config["quantization_config"] = _qconfig(scheme, group, ignore + ["lm_head"])
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in os.listdir(src):
        if name != "config.json" and not name.endswith(".safetensors") and not name.endswith(".index.json"):
            path = os.path.join(src, name)
            if os.path.isfile(path):
                shutil.copy(path, os.path.join(dst, name))


def quantized_checkpoint(name: str, scheme: str, group: int = 32) -> str:
    """Tiny checkpoint ``name`` written in compressed-tensors ``scheme`` (built once, cached beside it)."""
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    src = tiny_checkpoint(name)
    final = f"{src}-ct-{scheme.lower()}-g{group}"
    if os.path.isdir(final):
        return final
    tmp = tempfile.mkdtemp(prefix=".tmp-ct-", dir=os.path.dirname(final))
    try:
        write_compressed_tensors(src, tmp, scheme, group)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(final):
            raise
    return final


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--scheme", choices=SCHEMES, required=True)
    p.add_argument("--group-size", type=int, default=128)
    a = p.parse_args(argv)
    write_compressed_tensors(a.src, a.dst, a.scheme, a.group_size)
    print(f"wrote {a.dst} ({a.scheme})")


if __name__ == "__main__":
    main()
