"""Rules of ``--enable-deterministic-inference`` (SGLang's flag): the argument side.

SGLang (``arg_groups/overrides.py:_deterministic_attention_backend``) falls back to a batch-invariant
attention backend when none is set and refuses an explicit one that is not; here triton is that backend
(its decode metadata then never splits a request's keys, ``impl/attention/triton_backend.py``). What the
rest needs (CPU, bf16 weights, native bf16) is known only once the dtype and kernels are: the engine checks
it before any weight is read (``impl/engine/deterministic.py``).
"""

from __future__ import annotations

from typing import Any

from impl.args.attention import device_of
from impl.args.resolution import attention_backends_of, declare_resolution, resolved_view

FLAG = "--enable-deterministic-inference"


def handle_deterministic_attention_backend(server_args: Any) -> None:
    """An unset attention backend resolves to triton under the flag (SGLang's fallback to a deterministic one)."""
    cfg = resolved_view(server_args)  # the fast-prefill pin may already have declared triton
    if not cfg.enable_deterministic_inference:
        return
    if cfg.attention_backend is None and cfg.prefill_attention_backend is None and cfg.decode_attention_backend is None:
        declare_resolution(server_args, "handle_deterministic_attention_backend", attention_backend="triton")


def validate_deterministic_inference(server_args: Any) -> None:
    cfg = resolved_view(server_args)
    if not cfg.enable_deterministic_inference:
        return
    for role, name in zip(("prefill", "decode"), attention_backends_of(cfg)):
        if name != "triton":
            which = f"--{role}-attention-backend" if getattr(cfg, f"{role}_attention_backend") else "--attention-backend"
            raise ValueError(
                f"{FLAG} needs the triton attention backend for prefill and decode (its kernels sum a request's keys "
                f"in one order whatever the batch), but {which}={name}. Use {which} triton (or leave it unset), "
                f"or drop {FLAG}."
            )
    if cfg.speculative_algorithm:
        raise ValueError(
            f"{FLAG} is not supported with speculative decoding in this engine (--speculative-algorithm "
            f"{cfg.speculative_algorithm}): its draft and verify batches are not made batch-invariant. Drop one of the two."
        )
    device = device_of(server_args)
    if device != "cpu":
        raise ValueError(
            f"{FLAG} is implemented for the CPU here (--device {device}): on CUDA this engine's matmuls are not "
            f"batch-invariant. Serve on --device cpu, or drop {FLAG}."
        )
