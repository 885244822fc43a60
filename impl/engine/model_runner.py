"""ModelRunner: the model, its KV pools and attention backends, and one forward at a time.

Built from RESOLVED server args (``server_args.resolved()`` after
``check_server_args``): the prefill backend serves EXTEND batches (mixed ones
included), the decode backend DECODE batches. ``fb.fast_prefill`` is set when
``--kv-sharing-fast-prefill`` is on and the batch extends some request by more
than one token (pure decode batches take the normal path). Work counters are
counted here from what each forward reports (``LogitsOutput``): into the batch's
own ``fb.work`` and summed over forwards (``work``). On CPU the model's layers get the
compiled fast paths (``impl/kernels/cpu_fused/transform.py``); ``cpu_kernels``
is the record of what they installed (None on other devices: a CUDA model keeps
the model files' own forwards).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from impl.args.resolution import attention_backends_of
from impl.attention.registry import create_attention_backend
from impl.cache.kv_pool import ReqToTokenPool, TokenToKVPool
from impl.args.dtype import auto_dtype
from impl.cache.kv_quant import kv_cache_torch_dtype, load_kv_scales
from impl.cache.memory import KVBudget, kv_budget, process_memory
from impl.cache.swa_pool import HybridBudget, HybridSWAKVPool, hybrid_applies, hybrid_budget
from impl.cache.swa_request_cap import SWASizing, choose_swa_sizing, request_cap_budget
from impl.config.model_config import ModelConfig
from impl.forward_batch import ForwardBatch, WorkCounters
from impl.engine import deterministic
from impl.kernels.cpu_fused import transform as cpu_fused_transform
from impl.model import yoco
from impl.engine.memory_plan import check_memory, memory_info, memory_line
from impl.model.loader import load_model, resolve_dtype
from impl.model.outputs import LogitsOutput
from impl.quant.config import resolve_scheme
from impl.quant.loading import decode_weight_bytes

logger = logging.getLogger("impl.engine")


DETERMINISTIC_LINE = ("Deterministic inference: on (batch-invariant: a lone-row forward runs as two rows, on AMX the "
                      "layers' matmuls on blocks of 64 rows, decode attention "
                      "never splits a request's keys, the LM head and the per-layer-input projection take the bf16 row "
                      "kernel at every row count)")


@dataclass(frozen=True)
class RunnerLimits:
    max_running_requests: int
    max_req_len: int  # prompt + output tokens one request may reach (context length, pool size)


class ModelRunner:
    def __init__(self, server_args, model_config: ModelConfig, device: torch.device, chunked_prefill_size: int = -1):
        """``chunked_prefill_size``: the resolved chunk (-1: off); the hybrid pool's request cap is sized by it."""
        self.server_args = server_args  # resolved
        self.device = device
        self.model_config = model_config
        name = {"half": "float16", "float": "float32"}.get(server_args.dtype, server_args.dtype)
        if name == "auto":  # check_server_args resolves it (impl/args/dtype.py); an unchecked caller gets the same rule
            name = auto_dtype(model_config.torch_dtype, device.type == "cuda")
        self.dtype = resolve_dtype(name, model_config)
        # --kv-cache-dtype auto stores K/V in the model dtype; bf16 / bfloat16 in bfloat16; fp8_e4m3 / fp8_e5m2 in
        # fp8 with per-layer scales (impl/cache/kv_quant.py; other dtypes are refused by impl.args.unsupported).
        kv_dtype = kv_cache_torch_dtype(server_args.kv_cache_dtype, self.dtype)
        self.kv_scales = load_kv_scales(
            getattr(server_args, "quantization_param_path", None), server_args.kv_cache_dtype, model_config.model_type,
            model_config.num_hidden_layers, tuple(model_config.kv_layer_ids),
        )
        probe = TokenToKVPool(model_config, 2, kv_dtype, "meta")
        # --quantization / --torchao-config / a quantized checkpoint (impl/quant/config.py; the args rules checked it)
        self.quant = resolve_scheme(getattr(server_args, "quantization", None), getattr(server_args, "torchao_config", ""),
                                    model_config.quantization_config, device.type,
                                    getattr(server_args, "torchao_config_kv_shared", ""), model_config.num_kv_shared_layers)
        # refused here, before any weight is read, when it cannot fit (impl/engine/memory_plan.py)
        self.weight_plan = check_memory(server_args, model_config, self.dtype, probe.bytes_per_token, device, quant=self.quant)
        self.deterministic = bool(getattr(server_args, "enable_deterministic_inference", False))
        if self.deterministic:
            deterministic.check_supported(self.dtype)  # refused before any weight is read
        self._serve(load_model(model_config.model_path, self.dtype, device, config=model_config, plan=self.weight_plan,
                               quant=self.quant))
        self.load_peak_rss = process_memory()[1]
        weight_bytes = self.weight_plan.resident_bytes + self.packed_bytes
        # The budget in one-pool tokens (impl/cache/memory.py); the hybrid sliding-window pool (the default
        # for models with both layer types, as in SGLang) splits the same bytes into its two budgets.
        self.budget: KVBudget = kv_budget(
            probe.bytes_per_token, device, weight_bytes, server_args.max_total_tokens, server_args.mem_fraction_static
        )
        self.hybrid_budget: HybridBudget | None = None
        self.swa_sizing: SWASizing | None = None
        if hybrid_applies(model_config, bool(getattr(server_args, "disable_hybrid_swa_memory", False))):
            shape = HybridSWAKVPool(model_config, 2, 2, kv_dtype, "meta")
            # the request cap (--max-running-requests, radix cache off, chunked prefill) or the ratio, as in SGLang
            self.swa_sizing = choose_swa_sizing(server_args, int(model_config.sliding_window or 0), chunked_prefill_size)
            if self.swa_sizing.cap is not None:
                self.hybrid_budget = request_cap_budget(
                    self.budget.num_tokens, shape.full_bytes_per_token, shape.swa_bytes_per_token, self.swa_sizing.cap,
                    full_tokens=server_args.max_total_tokens, budget_reason=self.budget.reason)
            else:
                self.hybrid_budget = hybrid_budget(self.budget.num_tokens, shape.full_bytes_per_token,
                                                   shape.swa_bytes_per_token, server_args.swa_full_tokens_ratio,
                                                   full_tokens=server_args.max_total_tokens)
            self.token_to_kv_pool: TokenToKVPool = HybridSWAKVPool(
                model_config, self.hybrid_budget.capacity, self.hybrid_budget.swa_capacity, kv_dtype, device,
                self.kv_scales)
            self.max_total_num_tokens = self.hybrid_budget.full_tokens
        else:
            self.token_to_kv_pool = TokenToKVPool(model_config, self.budget.capacity, kv_dtype, device, self.kv_scales)
            self.max_total_num_tokens = self.budget.num_tokens
        context_len = server_args.context_length or model_config.max_position_embeddings
        max_req_len = min(context_len, self.max_total_num_tokens)
        default_running = 256 if device.type == "cuda" else 64
        max_running = server_args.max_running_requests or default_running
        self.limits = RunnerLimits(max_running, max_req_len)
        self.req_to_token_pool = ReqToTokenPool(max_running, max_req_len + 1, device)
        prefill_name, decode_name = attention_backends_of(server_args)
        assert prefill_name is not None and decode_name is not None  # resolved arguments name both
        self.prefill_backend = create_attention_backend(
            prefill_name, model_config, self.token_to_kv_pool, self.req_to_token_pool, device
        )
        self.decode_backend = (
            self.prefill_backend
            if decode_name == prefill_name
            else create_attention_backend(decode_name, model_config, self.token_to_kv_pool, self.req_to_token_pool, device)
        )
        self.backend_names = (prefill_name, decode_name)
        for backend in (self.prefill_backend, self.decode_backend):  # may be one object: set twice alike
            backend.deterministic = self.deterministic
        self.fast_prefill_enabled = bool(server_args.kv_sharing_fast_prefill)
        self.work = WorkCounters()

    def forward(self, fb: ForwardBatch) -> LogitsOutput:
        """Run ``fb``; returns the model's LogitsOutput: logits [R, vocab] float32 and the final-normed
        hidden states [R, hidden] of the rows ``fb.logits_indices``."""
        fb.req_to_token_pool = self.req_to_token_pool
        fb.token_to_kv_pool = self.token_to_kv_pool
        fb.attn_backend = self.decode_backend if fb.forward_mode.is_decode else self.prefill_backend
        fb.fast_prefill = yoco.applies(self.fast_prefill_enabled, fb.extend_seq_lens_cpu)
        if fb.work is None:
            fb.work = WorkCounters()
        out = self.model.forward(fb)
        fb.work.count_forward(fb.forward_mode.is_extend, fb.num_tokens, int(out.logits.shape[0]), out.cross_decoder_rows,
                              out.fast_prefill)
        for k, v in fb.work.as_dict().items():
            setattr(self.work, k, getattr(self.work, k) + v)
        return out

    def load_weights(self, model_path: str, config: ModelConfig) -> None:
        """SGLang's update_weights_from_disk: the checkpoint at ``model_path`` (``config``: this model's
        architecture, which the engine has checked) loaded as the served one was (the same dtype, quantized and
        packed alike) beside it, then swapped in; the old weights go with their last reference. Peak memory: both
        sets. The KV pools, backends and limits stay."""
        self._serve(load_model(model_path, self.dtype, self.device, config=config, quant=self.quant))

    def _serve(self, model) -> None:
        """Install the compiled CPU paths on a loaded ``model`` (checked under --enable-deterministic-inference)
        and serve it, with the bytes of weights a decode step reads and what its packed copies add."""
        kernels = install_cpu_kernels(model, self.device, batch_invariant=self.deterministic)
        if self.deterministic:
            deterministic.check_kernels(kernels)
        self.model, self.cpu_kernels, self.weight_plan = model, kernels, model.weight_plan
        # weights do not change after load (the transform may restack them: counted after it)
        # (W8A8 weights in AMX tile order replace their parameters: the transform's copies count instead)
        tiled = 0 if kernels is None else kernels.packed_bytes
        self.decode_weight_bytes = decode_weight_bytes(model) + tiled if self.weight_plan.quant is not None else None
        # prepacked copies replace their parameters; count what they add
        self.packed_bytes = 0 if kernels is None else kernels.extra_bytes

    def describe(self) -> list[str]:
        mc = self.model_config
        return [
            f"Model {mc.name} ({mc.model_type}): {mc.num_hidden_layers} layers, {mc.num_kv_shared_layers} KV-shared, "
            f"dtype {str(self.dtype).replace('torch.', '')}, device {self.device}",
            self._kv_pool_line(),
        ] + ([self.swa_sizing.describe()] if self.swa_sizing is not None else []) + [
            f"KV cache dtype: {self.kv_cache_dtype_name()}",
            memory_line(self.weight_plan, self.packed_bytes, self.kv_pool_bytes, self.load_peak_rss),
            f"Attention backends: prefill {self.backend_names[0]}, decode {self.backend_names[1]}",
        ] + ([DETERMINISTIC_LINE] if self.deterministic else []) + [
            f"Scheduler limits: max_running_requests={self.limits.max_running_requests}, "
            f"max request length {self.limits.max_req_len} tokens",
        ] + ([f"CPU kernels: {self._cpu_kernels()}"] if self.device.type == "cpu" else []) + (
            [f"Quantized weights: {self.weight_plan.quant.describe()}; "
             f"{(self.decode_weight_bytes or 0) / 1e9:.3f} GB of weights read per decode step"]
            if self.weight_plan.quant is not None else [])

    def quantization_info(self) -> dict | None:
        """What ``/get_server_info`` reports under ``quantization`` (None: float weights)."""
        q = self.weight_plan.quant
        if q is None:
            return None
        shared = q.scheme.kv_shared
        return {"format": q.scheme.fmt.kind, "group_size": q.scheme.fmt.group_size, "describe": q.scheme.describe(),
                "kv_shared_format": None if shared is None else {"format": shared.kind, "group_size": shared.group_size},
                "source": q.scheme.source, "lm_head": None if q.scheme.lm_head is None else q.scheme.lm_head.kind,
                "quantized_weights": len(q.shapes), "kept_float": dict(q.kept),
                "decode_weight_bytes": self.decode_weight_bytes}

    @property
    def kv_pool_bytes(self) -> int:
        return self.token_to_kv_pool.total_bytes

    def memory_info(self) -> dict:
        return memory_info(self.weight_plan, self.packed_bytes, self.kv_pool_bytes, self.load_peak_rss)

    def _kv_pool_line(self) -> str:
        pool, mc, hb = self.token_to_kv_pool, self.model_config, self.hybrid_budget
        if hb is None or not isinstance(pool, HybridSWAKVPool):
            return (f"KV pool: {pool.bytes_per_token} bytes per token, {pool.num_kv_layers} of {mc.num_hidden_layers} "
                    f"layers hold KV, {self.budget.num_tokens} tokens ({self.budget.reason})")
        sizing = (f"--swa-full-tokens-ratio {self.server_args.swa_full_tokens_ratio:g}"
                  if self.swa_sizing is None or self.swa_sizing.cap is None else "request cap")
        return (f"KV pool: hybrid sliding-window pool ({sizing}): "
                f"{len(pool.layer_ids) - len(pool.swa_layers)} full-attention layers {pool.full_bytes_per_token} bytes "
                f"per token, {hb.full_tokens} tokens; {len(pool.swa_layers)} sliding-window layers "
                f"{pool.swa_bytes_per_token} bytes per token, {hb.swa_tokens} tokens; {pool.num_kv_layers} of "
                f"{mc.num_hidden_layers} layers hold KV; the memory of {hb.one_pool_tokens} one-pool tokens "
                f"({self.budget.reason})")

    def kv_pools(self) -> dict[str, Any]:
        """``/get_server_info``'s ``kv_pools``: bytes per token and token budget of each pool."""
        pool, hb = self.token_to_kv_pool, self.hybrid_budget
        if hb is None or not isinstance(pool, HybridSWAKVPool):
            return {"kind": "one pool", "full": {"layers": pool.num_kv_layers, "bytes_per_token": pool.bytes_per_token,
                                                 "tokens": self.budget.num_tokens}}
        return {
            "kind": "hybrid sliding-window", "swa_full_tokens_ratio": self.server_args.swa_full_tokens_ratio,
            "sizing": None if self.swa_sizing is None else self.swa_sizing.as_dict(),
            "full": {"layers": len(pool.layer_ids) - len(pool.swa_layers), "bytes_per_token": pool.full_bytes_per_token,
                     "tokens": hb.full_tokens},
            "swa": {"layers": len(pool.swa_layers), "bytes_per_token": pool.swa_bytes_per_token,
                    "tokens": hb.swa_tokens, "sliding_window": self.model_config.sliding_window},
        }

    def kv_cache_dtype_name(self) -> str:
        """The pool's storage dtype, with its scales when fp8 (the startup log and /get_server_info)."""
        pool = self.token_to_kv_pool
        name = str(pool.dtype).replace("torch.", "")
        return f"{name} ({self.kv_scales.describe()})" if pool.quantized else name

    def cpu_linear(self) -> dict[str, str | bool] | None:
        """Which library multiplies the fused layers' weights (``impl/kernels/cpu_fused/linear.py``), or
        None when no layer runs the fused CPU kernels."""
        plan = None if self.cpu_kernels is None else self.cpu_kernels.linear
        return None if plan is None else plan.info()

    def _cpu_kernels(self) -> str:
        """Which path the decoder layers take on CPU (impl/kernels/cpu_fused)."""
        return "none" if self.cpu_kernels is None else self.cpu_kernels.describe()


def install_cpu_kernels(model, device: torch.device, batch_invariant: bool = False) -> "cpu_fused_transform.CpuKernels | None":
    """The compiled CPU fast paths on ``model`` when it lives on the CPU (the target model and the
    speculative assistant); None elsewhere. ``batch_invariant``: --enable-deterministic-inference."""
    return cpu_fused_transform.apply(model, batch_invariant) if device.type == "cpu" else None
