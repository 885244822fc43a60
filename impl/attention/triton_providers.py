"""Kernel providers of the triton attention backend: who runs the kernels the metadata describes.

``TritonAttnBackend`` builds one metadata (``triton_metadata.py``) per pass and hands it to a
provider's ``extend`` / ``decode`` launches, which all take the same arguments:

* ``triton``: the Triton kernels compiled for the GPU (default on CUDA).
* ``cpu``: the compiled CPU kernels of ``impl/kernels/cpu_attn`` (default on CPU).
* ``interpreter``: the Triton kernels under Triton's interpreter: slow, chosen only explicitly
  (``IMPL_TRITON_KERNELS=interpreter``) to verify the Triton code itself on a CPU.
* ``reference``: the pure-torch reference (``impl/kernels/reference.py``) over the same metadata;
  what ``auto`` falls back to on CPU when the C++ extension cannot be built (one warning).

``IMPL_TRITON_KERNELS`` (``auto`` by default) picks one; a provider that cannot serve the device
is refused at startup with a ValueError naming the variable and the choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from impl.envs import TRITON_KERNEL_PROVIDERS, envs
from impl.kernels.launch_config import KVSplitPolicy, kv_split_policy
from impl.kernels.triton_env import TRITON_INTERPRETED

ENV_PROVIDER = envs.IMPL_TRITON_KERNELS.name
PROVIDERS = TRITON_KERNEL_PROVIDERS

# CPU decode: split a request's keys into pieces of at least 256 keys, up to 16, until there are
# about twice as many (request, KV head, split) items as threads.
CPU_SPLIT_POLICY = KVSplitPolicy(max_kv_splits=16, min_split_tokens=256)
ONE_SPLIT = KVSplitPolicy(max_kv_splits=1, min_split_tokens=1 << 30)


@dataclass(frozen=True)
class KernelProvider:
    name: str  # one of PROVIDERS except "auto"
    description: str  # the startup log's words for it
    extend: Callable[..., torch.Tensor]  # extend_attention_fwd's signature, without the launch config
    decode: Callable[..., torch.Tensor]  # decode_attention_fwd's signature, without the launch config
    split_policy: KVSplitPolicy  # how decode metadata splits each request's keys
    fill_units: int | None  # decode splits fill this many parallel units twice over (None: no fill limit)
    isa: dict[str, str] | None = None  # compiled CPU kernels: the instructions each kernel runs on
    # compiled CPU kernels: a new pack epoch per forward (cpu_attn.next_pack_epoch), which the launches over a
    # KV buffer that later layers share take as pack_epoch=; None: the kernels take no such argument
    pack_epochs: Callable[[], int] | None = None
    # compiled CPU kernels: decode launches take kv_generation= (impl.cache.allocator.kv_generation) and keep each
    # request's packed keys from one decode step to the next under it
    keeps_packings: bool = False
    # compiled CPU kernels: a decode launch over one metadata and one layer's buffers prepared (checked) once and then
    # called with each layer's q and o (cpu_attn.DecodeLaunch, decode's arguments as keywords less kv_generation);
    # None: every launch goes through ``decode``
    prepare_decode: Callable[..., Callable[..., torch.Tensor]] | None = None

    def startup_line(self) -> str:
        return f"Attention kernels: triton backend, {self.description}"


def requested_provider() -> str:
    return envs.IMPL_TRITON_KERNELS.get()


def select_provider(device: torch.device) -> KernelProvider:
    """The provider for ``device`` per ``IMPL_TRITON_KERNELS`` (ValueError when it cannot serve it)."""
    want = requested_provider()
    if device.type == "cuda":
        if want in ("cpu", "reference"):
            raise ValueError(f"{ENV_PROVIDER}={want} serves CPU tensors but the device is {device}; "
                             "unset it (auto: compiled Triton) or choose triton or interpreter.")
        if want == "interpreter" or (want == "auto" and TRITON_INTERPRETED):
            return _interpreter()
        if TRITON_INTERPRETED:  # want == "triton" but TRITON_INTERPRET=1 was set before triton was imported
            raise ValueError(f"{ENV_PROVIDER}=triton but TRITON_INTERPRET=1 is set: unset TRITON_INTERPRET "
                             "for the compiled kernels, or choose interpreter.")
        return _triton_compiled(device)
    if want == "triton":
        raise ValueError(f"{ENV_PROVIDER}=triton: Triton compiles only for GPUs and the device is {device}; "
                         "unset it (auto: the compiled CPU kernels) or choose cpu, interpreter or reference.")
    if want == "interpreter":
        if not TRITON_INTERPRETED:
            raise ValueError(f"{ENV_PROVIDER}=interpreter on {device} needs TRITON_INTERPRET=1 before triton is "
                             f"imported: set {ENV_PROVIDER}=interpreter in the environment before starting.")
        return _interpreter()
    if want == "reference":
        return _reference("torch reference (IMPL_TRITON_KERNELS=reference)")
    from impl.kernels import cpu_attn

    if cpu_attn.load() is not None:
        isa = cpu_attn.kernel_isa()  # reads IMPL_CPU_ATTN_KEEP_MB, which attention.cpp reads raw: a bad value stops here
        words = ", ".join(f"{k}: {v}" for k, v in isa.items())
        return KernelProvider("cpu", f"CPU kernels (compiled; {words})", cpu_attn.extend_attention_fwd,
                              cpu_attn.decode_attention_fwd, CPU_SPLIT_POLICY, torch.get_num_threads(), isa,
                              cpu_attn.next_pack_epoch, keeps_packings=True, prepare_decode=cpu_attn.DecodeLaunch)
    reason = f"{cpu_attn.ENV_SWITCH}=0" if not cpu_attn.enabled_by_env() else cpu_attn.error()
    if want == "cpu":
        raise ValueError(f"{ENV_PROVIDER}=cpu but the compiled CPU attention kernels are unavailable ({reason}); "
                         "install a C++ compiler and ninja, or choose reference or interpreter.")
    return _reference(f"torch reference (compiled CPU kernels unavailable: {reason})")


def _triton_compiled(device: torch.device) -> KernelProvider:
    from impl.kernels.decode_attention import decode_attention_fwd
    from impl.kernels.extend_attention import extend_attention_fwd

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return KernelProvider("triton", "Triton kernels (compiled)", extend_attention_fwd, decode_attention_fwd,
                          kv_split_policy(interpreted=False), sms)


def _interpreter() -> KernelProvider:
    from impl.kernels.decode_attention import decode_attention_fwd
    from impl.kernels.extend_attention import extend_attention_fwd

    return KernelProvider("interpreter", "Triton kernels under the interpreter (IMPL_TRITON_KERNELS=interpreter): "
                          "correct but slow", extend_attention_fwd, decode_attention_fwd,
                          kv_split_policy(interpreted=True), None)


def _reference(description: str) -> KernelProvider:
    return KernelProvider("reference", description, _extend_reference, _decode_reference, ONE_SPLIT, None)


def _extend_reference(q, o, k_buf, v_buf, qo_indptr, q_positions, kv_indptr, kv_indices, max_q_len, sm_scale,
                      window=None, logit_cap=None, k_scale=1.0, v_scale=1.0):
    from impl.kernels.reference import attention_ref

    o.copy_(attention_ref(q, k_buf, v_buf, qo_indptr, q_positions, kv_indptr, kv_indices, sm_scale, window,
                          logit_cap, compute_dtype=torch.float32, k_scale=k_scale, v_scale=v_scale))
    return o


def _decode_reference(q, o, k_buf, v_buf, q_positions, kv_indptr, kv_indices, num_kv_splits, max_kv_splits, sm_scale,
                      window=None, logit_cap=None, k_scale=1.0, v_scale=1.0):
    from impl.kernels.reference import decode_attention_ref

    o.copy_(decode_attention_ref(q, k_buf, v_buf, q_positions, kv_indptr, kv_indices, sm_scale, window, logit_cap,
                                 compute_dtype=torch.float32, k_scale=k_scale, v_scale=v_scale))
    return o


def attention_kernels_of(prefill_backend, decode_backend) -> dict[str, dict[str, str | None]]:
    """``/get_server_info``'s ``attention_kernels``: per role, the backend, (triton) its provider and (compiled
    CPU kernels) the instructions each kernel runs on."""
    out: dict[str, dict] = {}
    for role, b in (("prefill", prefill_backend), ("decode", decode_backend)):
        provider = getattr(b, "provider", None)
        out[role] = {"backend": b.name, "provider": getattr(provider, "name", None)}
        if isinstance(provider, KernelProvider) and provider.isa:
            out[role]["isa"] = dict(provider.isa)
    return out


def kernel_startup_lines(prefill_backend, decode_backend) -> list[str]:
    """One startup line per distinct triton backend naming its provider."""
    seen: list[str] = []
    for b in (prefill_backend, decode_backend):
        provider = getattr(b, "provider", None)
        if isinstance(provider, KernelProvider) and provider.startup_line() not in seen:
            seen.append(provider.startup_line())
    return seen
