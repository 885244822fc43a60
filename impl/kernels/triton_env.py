"""Decide, before any ``triton`` import in ``impl``, whether Triton runs compiled or interpreted.

Triton compiles only for GPUs; on a CPU-only machine its kernels run under the
interpreter (``TRITON_INTERPRET=1``, read when ``@triton.jit`` decorates a
kernel). Every kernel module imports this module first, so the variable is set
before any kernel is defined.
"""

from __future__ import annotations

import os

import torch

from impl.envs import envs

HAS_CUDA: bool = torch.cuda.is_available()

# The interpreter is also what IMPL_TRITON_KERNELS=interpreter asks for (impl/attention/triton_providers.py).
# A value it does not accept is refused at startup, with the choices (triton_providers.select_provider).
_raw_provider = os.environ.get(envs.IMPL_TRITON_KERNELS.name, "").strip().lower()
if not HAS_CUDA or _raw_provider == "interpreter":
    os.environ[envs.TRITON_INTERPRET.name] = "1"

# True when Triton kernels run under the interpreter (CPU): correct but slow.
TRITON_INTERPRETED: bool = envs.TRITON_INTERPRET.get()
