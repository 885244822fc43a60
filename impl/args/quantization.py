"""Rules of ``--quantization`` and ``--torchao-config`` (SGLang's flags): the argument side.

The whole decision lives in ``impl/quant/config.py`` (``resolve_scheme``); this hook runs it at startup with
the model's ``quantization_config`` and the device, so a bad combination is a ValueError naming the flag
before any weight is read. ``--enable-deterministic-inference`` is implemented for bf16 weights only, so it is
refused beside quantized ones (naming both flags).
"""

from __future__ import annotations

from typing import Any

from impl.args.attention import device_of
from impl.args.resolution import model_config_of, resolved_view
from impl.quant.config import resolve_scheme


def validate_quantization(server_args: Any) -> None:
    cfg = resolved_view(server_args)
    mc = model_config_of(server_args)
    qc = getattr(mc, "quantization_config", None) if mc is not None else None
    scheme = resolve_scheme(cfg.quantization, cfg.torchao_config, qc, device_of(server_args), cfg.torchao_config_kv_shared,
                            mc.num_kv_shared_layers if mc is not None else None)
    if scheme is not None and cfg.enable_deterministic_inference:
        raise ValueError(f"--enable-deterministic-inference is implemented for bf16 weights; these are quantized "
                         f"({scheme.describe()}). Drop one of them.")
