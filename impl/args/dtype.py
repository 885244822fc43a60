"""``--dtype auto``: the checkpoint's dtype (SGLang's and vLLM's convention), declared and logged.

* ``config.json`` names ``bfloat16`` / ``float32`` (``dtype``, or the older ``torch_dtype``): that dtype, on
  every device: a bf16 checkpoint is served in bf16 (Gemma-4 E2B: 8.6 GiB instead of 17 GiB), float32
  only when asked (``--dtype float32``).
* ``float16`` on CPU: ``bfloat16`` (same size; CPUs have no fast float16 matmul, and bf16 keeps
  float32's range); on CUDA: float16.
* no dtype in ``config.json``: ``float32``.
"""

from __future__ import annotations

from typing import Any

from impl.args.resolution import declare_resolution, model_config_of, platform_of, resolving_view

KNOWN = ("float32", "bfloat16", "float16")


def auto_dtype(checkpoint_dtype: str | None, is_cuda: bool) -> str:
    """The dtype ``--dtype auto`` serves a checkpoint of ``checkpoint_dtype`` in."""
    if checkpoint_dtype not in KNOWN:
        return "float32"
    if checkpoint_dtype == "float16" and not is_cuda:
        return "bfloat16"
    return checkpoint_dtype


def handle_dtype_auto(server_args: Any) -> None:
    if resolving_view(server_args).dtype != "auto":
        return
    choice = auto_dtype(model_config_of(server_args).torch_dtype, platform_of(server_args).is_cuda)
    declare_resolution(server_args, "handle_dtype_auto", dtype=choice)
