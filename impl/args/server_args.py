"""ServerArgs: SGLang's names, one dataclass, argparse generated from field metadata.

Each field's metadata carries its help text (and choices); ``add_cli_args``
registers ``--field-name`` for every field, ``store_true`` for booleans that
default to False. Values the user gave stay on the dataclass; automatic changes
are *declared* (see ``resolution.py``) and applied by ``resolved()``.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

ATTENTION_BACKEND_CHOICES = (
    # implemented here
    "triton",
    "torch_native",
    # valid SGLang names that this engine recognises (the KV-cache rules read them)
    "flex_attention",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "cutlass_mla",
    "trtllm_mla",
    "trtllm_mha",
    "cutedsl_mla",
    "tokenspeed_mla",
    "aiter",
)
IMPLEMENTED_ATTENTION_BACKENDS = ("triton", "torch_native")
KV_CACHE_DTYPE_CHOICES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4", "fp4_mx_block16")
SPECULATIVE_ALGORITHM_CHOICES = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "FROZEN_KV_MTP", "DSPARK")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "half", "float")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
# Seed 004 settings (SGLang's names). Valid here even where this engine has no such feature:
# the KV-cache rules read them, and impl.args.unsupported refuses them at launch.
DISAGG_TRANSFER_BACKEND_CHOICES = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
DECODE_RETRACTION_BACKUP_CHOICES = ("cpu_tensor", "host_pool", "none")
HICACHE_STORAGE_BACKEND_CHOICES = (
    "file", "sim", "mooncake", "npu_memcache", "hf3fs", "nixl", "aibrix", "dynamic", "eic", "simm", "mori", "shm",
    "tensorcast", "seaweedfs",
)
CUDA_GRAPH_BACKEND_CHOICES = ("disabled", "breakable", "piecewise", "full")
LINEAR_ATTN_BACKEND_CHOICES = ("triton", "cutedsl", "flashinfer", "flashkda", "nvidia_kda", "ptx_kda", "helion", "intel_xpu")
MAMBA_BACKEND_CHOICES = ("triton", "flashinfer")


def _f(default: Any, help: str, choices: Sequence[Any] | None = None, type: Any = None, cli: bool = True) -> Any:
    meta = {"help": help, "choices": choices, "type": type, "cli": cli}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default.copy(), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ServerArgs:
    # ---- model and tokenizer ---------------------------------------------
    model_path: str | None = _f(None, "HF-format checkpoint folder (config.json, safetensors, tokenizer). Default: the embedded tiny Gemma-4.")
    tokenizer_path: str | None = _f(None, "Tokenizer folder; defaults to --model-path.")
    served_model_name: str | None = _f(None, "Model name reported by the API; defaults to --model-path (as in SGLang).")
    chat_template: str | None = _f(None, "Jinja chat template file overriding tokenizer_config.json's.")
    context_length: int | None = _f(None, "Maximum context length; defaults to the model's max_position_embeddings.", type=int)
    dtype: str = _f("auto", "Weight and activation dtype.", DTYPE_CHOICES)
    device: str = _f("auto", "Device: auto picks cuda when torch sees one, else cpu.", DEVICE_CHOICES)
    quantization: str | None = _f(
        None,
        "Weight quantization method (SGLang's names): compressed-tensors (a checkpoint quantized by llm-compressor: "
        "W8A8 int8 or W4A16 pack-quantized; detected without the flag too) or w8a8_int8 (W8A8 int8; a float "
        "checkpoint is quantized while loading). CPU only; other methods are refused.",
    )
    torchao_config: str = _f(
        "",
        "Quantize a float checkpoint's linear layers while loading (SGLang's names): int8dq (int8 weights and "
        "activations), int8wo (int8 weights), int4wo-<group> (int4 weights, group 32/64/128/256). CPU only.",
    )
    torchao_config_kv_shared: str = _f(
        "",
        "Beside --torchao-config: the format of the KV-shared layers (the last num_kv_shared_layers; the same names). "
        "With --kv-sharing-fast-prefill they run on a few rows per prompt, so int4 there (8da4w-<group>) cuts the "
        "bytes a decode step reads while int8dq keeps the prefill's matmuls fast. Default: --torchao-config's.",
    )
    # ---- HTTP -------------------------------------------------------------
    host: str = _f("127.0.0.1", "HTTP host to bind.")
    port: int = _f(30000, "HTTP port.", type=int)
    api_key: str | None = _f(None, "Require 'Authorization: Bearer <key>' on every route but /health.")
    timeout_keep_alive: int = _f(
        120,
        "Seconds an idle HTTP keep-alive connection stays open. Longer than a router's connection-pool idle "
        "timeout (sglang-router: 90 s), so the server never closes a pooled connection the router is about to reuse.",
        type=int,
    )
    # ---- data parallelism ----------------------------------------------------
    dp_size: int = _f(
        1,
        "Data-parallel replicas: N engine processes, each with its own KV pool and scheduler and a share of the "
        "CPU cores, behind one HTTP front.",
        type=int,
    )
    load_balance_method: str = _f(
        "round_robin",
        "How the --dp-size front picks a replica: round_robin, or shortest_queue (fewest requests in flight).",
        ("round_robin", "shortest_queue"),
    )
    # ---- HTTP hardening (impl/server/limits.py, impl/server/browser_guard.py) ----------
    allowed_origins: str | None = _f(
        None, "Comma-separated browser origins (scheme://host[:port]) allowed to call the API besides the server's "
        "own; '*' allows any. A request whose Origin header names another origin gets 403.")
    allowed_hosts: str | None = _f(
        None, "Comma-separated Host header names accepted besides IP literals, localhost and --host; '*' accepts any "
        "(turns the DNS-rebinding guard off). Another Host gets 403.")
    max_request_body_bytes: int = _f(8 * 2**20, "Largest request body in bytes (413 above).", type=int)
    max_n: int = _f(16, "Largest 'n' (choices per prompt) one request may ask for.", type=int)
    max_batch_size: int = _f(64, "Most prompts one request may carry (a batch of texts, ids or OpenAI prompts).", type=int)
    max_stop_strings: int = _f(32, "Most stop strings per request.", type=int)
    max_stop_string_len: int = _f(256, "Longest stop string in characters.", type=int)
    max_stop_token_ids: int = _f(256, "Most stop token ids per request.", type=int)
    max_logprobs: int = _f(20, "Largest top_logprobs_num / logprobs / top_logprobs (vLLM's --max-logprobs).", type=int)
    allow_auto_truncate: bool = _f(
        False, "Truncate a prompt longer than the context and cap max_new_tokens to the room left, instead of a 400 "
        "(SGLang's flag).")
    # ---- attention ---------------------------------------------------------
    attention_backend: str | None = _f(None, "Attention backend for prefill and decode.", ATTENTION_BACKEND_CHOICES)
    prefill_attention_backend: str | None = _f(None, "Attention backend for prefill (extend) batches; overrides --attention-backend.", ATTENTION_BACKEND_CHOICES)
    decode_attention_backend: str | None = _f(None, "Attention backend for decode batches; overrides --attention-backend.", ATTENTION_BACKEND_CHOICES)
    # ---- YOCO ---------------------------------------------------------------
    kv_sharing_fast_prefill: bool = _f(
        False,
        "KV-sharing (YOCO) fast prefill for Gemma-4 models with num_kv_shared_layers > 0: during prefill the "
        "KV-shared layers run only on the rows that feed the LM head. Needs the triton attention backend.",
    )
    enable_deterministic_inference: bool = _f(
        False,
        "Batch-invariant results (SGLang's flag): a request's tokens and logprobs do not depend on which requests "
        "share its forwards, so --kv-sharing-fast-prefill on and off give identical greedy tokens under concurrent "
        "load too. Here: the triton attention backend, on CPU with bf16 weights and native bf16 (avx512_bf16 or AMX); "
        "a lone-row forward runs as two rows, decode sums each request's keys in one pass; batch-1 decode is slower.",
    )
    # ---- speculative decoding ---------------------------------------------
    speculative_algorithm: str | None = _f(None, "Speculative decoding algorithm.", SPECULATIVE_ALGORITHM_CHOICES)
    speculative_draft_model_path: str | None = _f(None, "Draft model folder (a gemma4_assistant checkpoint for NEXTN / FROZEN_KV_MTP).")
    speculative_num_steps: int | None = _f(None, "Number of draft steps.", type=int)
    speculative_eagle_topk: int | None = _f(None, "Draft tree top-k per step.", type=int)
    speculative_num_draft_tokens: int | None = _f(None, "Number of draft tokens verified per step.", type=int)
    # ---- memory and scheduling ----------------------------------------------
    kv_cache_dtype: str = _f(
        "auto",
        "KV-cache dtype: auto (the model dtype), bf16/bfloat16, fp8_e4m3, fp8_e5m2 (per-layer scales: "
        "--quantization-param-path), mxfp8 (Blackwell), nvfp4 (SM100/SM120), fp4_mx_block16 (CUDA).",
        KV_CACHE_DTYPE_CHOICES,
    )
    quantization_param_path: str | None = _f(
        None,
        "JSON file of per-layer fp8 KV-cache scaling factors (SGLang's / vLLM's schema: kv_cache.dtype and "
        "kv_cache.scaling_factor {tp rank: {layer: scale}}); needs --kv-cache-dtype fp8_e4m3 or fp8_e5m2. Without "
        "it fp8 KV caches use scale 1.0.",
    )
    max_total_tokens: int | None = _f(None, "KV-cache capacity in tokens; overrides --mem-fraction-static.", type=int)
    mem_fraction_static: float | None = _f(None, "Fraction of available memory for weights plus KV cache.", type=float)
    chunked_prefill_size: int | None = _f(None, "Maximum tokens of one prefill chunk; -1 disables chunking.", type=int)
    max_prefill_tokens: int = _f(16384, "Maximum new tokens in one prefill batch.", type=int)
    max_running_requests: int | None = _f(None, "Maximum concurrently running requests.", type=int)
    schedule_policy: str = _f("fcfs", "Scheduling policy for the waiting queue.", ("fcfs", "lpm"))
    disable_radix_cache: bool = _f(False, "Disable the radix prefix cache.")
    skip_server_warmup: bool = _f(False, "Start serving without the warm-up request (one prompt of a prefill chunk's "
                                  "size, run before the server is ready so the first requests are not slower).")
    page_size: int = _f(1, "KV-cache page size in tokens.", type=int)
    random_seed: int | None = _f(None, "Global random seed.", type=int)
    stream_interval: int = _f(1, "Stream a chunk every N generated tokens.", type=int)
    # ---- logging and metrics -----------------------------------------------
    log_level: str = _f("info", "Log level.", ("debug", "info", "warning", "error", "critical"))
    log_requests: bool = _f(False, "Log every request's inputs and outputs.")
    enable_metrics: bool = _f(False, "Also count metrics when /metrics is never scraped (it is always served).")
    # ---- KV-cache dtype and pool (seed 004) --------------------------------
    prefill_only_disable_kv_cache: bool = _f(False, "Prefill-only embedding mode that never touches the paged KV cache.")
    is_embedding: bool = _f(False, "Serve an embedding model.")
    attn_cp_size: int = _f(1, "Attention context-parallel size.", type=int)
    enable_prefill_cp: bool = _f(False, "Context-parallel prefill.")
    cp_strategy: str | None = _f(None, "Sharding strategy of context-parallel prefill (SGLang needs one with --enable-prefill-cp).",
                                 ("zigzag", "interleave"))
    enable_hisparse: bool = _f(False, "HiSparse attention.")
    disaggregation_mode: str = _f("null", "PD disaggregation role.", ("null", "prefill", "decode"))
    disaggregation_transfer_backend: str = _f("mooncake", "PD disaggregation transfer backend.", DISAGG_TRANSFER_BACKEND_CHOICES)
    disaggregation_decode_retraction_backup: str | None = _f(
        None,
        "Where a PD decode server keeps KV preserved across retraction: cpu_tensor (per-request CPU tensors), "
        "host_pool (a reserved hierarchical-cache host pool; PD decode servers only), none (abort and retry).",
        DECODE_RETRACTION_BACKUP_CHOICES,
    )
    disaggregation_decode_enable_offload_kvcache: bool = _f(False, "Offload decode-side KV to the hierarchical cache storage.")
    hicache_storage_backend: str | None = _f(None, "Hierarchical-cache storage backend.", HICACHE_STORAGE_BACKEND_CHOICES)
    dcp_size: int = _f(1, "Decode context-parallel size.", type=int)
    pp_size: int = _f(1, "Pipeline-parallel size.", type=int)
    tp_size: int = _f(1, "Tensor-parallel size.", type=int)
    enable_priority_scheduling: bool = _f(False, "Priority scheduling.")
    disable_priority_preemption: bool = _f(False, "Disable preemption by priority.")
    enable_hierarchical_cache: bool = _f(False, "Hierarchical (host-tiered) KV cache.")
    enable_lmcache: bool = _f(False, "LMCache KV offload.")
    swa_full_tokens_ratio: float = _f(
        0.8,
        "Ratio of sliding-window layer KV tokens to full-attention layer KV tokens, in (0, 1.0] (SGLang's): the "
        "hybrid KV pool gives sliding-window layers this share of the full layers' token budget.",
        type=float,
    )
    disable_hybrid_swa_memory: bool = _f(
        False,
        "Keep one KV pool for sliding-window and full-attention layers (every layer keeps every token) instead of "
        "the hybrid pool, whose sliding-window layers free tokens that left their window.",
    )
    enable_unified_memory: bool = _f(
        False,
        "Unified memory KV pool: one byte buffer split dynamically between the full-attention and sliding-window "
        "sub-pools. Implies --enable-page-major-kv-layout.",
    )
    enable_page_major_kv_layout: bool = _f(
        False, "Page-major KV layout (one entry per token slot holding every layer); needs --enable-unified-memory."
    )
    cuda_graph_backend_prefill: str | None = _f(
        None,
        "Prefill cuda-graph capture backend. Unset: SGLang's default (capture on CUDA, off elsewhere and with "
        "--disable-cuda-graph).",
        CUDA_GRAPH_BACKEND_CHOICES,
    )
    disable_cuda_graph: bool = _f(False, "Disable CUDA graphs (this engine never captures them; accepted for compatibility).")
    linear_attn_backend: str | None = _f(
        None, "Linear-attention (GDN/KDA) kernel backend for prefill and decode; unset: the engine chooses.", LINEAR_ATTN_BACKEND_CHOICES
    )
    linear_attn_prefill_backend: str | None = _f(
        None, "Linear-attention prefill backend; overrides --linear-attn-backend.", LINEAR_ATTN_BACKEND_CHOICES
    )
    linear_attn_decode_backend: str | None = _f(
        None, "Linear-attention decode backend; overrides --linear-attn-backend.", LINEAR_ATTN_BACKEND_CHOICES
    )
    mamba_backend: str | None = _f(None, "Mamba SSM kernel backend; unset: the engine chooses.", MAMBA_BACKEND_CHOICES)

    # ---- CLI ----------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(ServerArgs):
            meta = f.metadata
            if not meta.get("cli", True):
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.type in (bool, "bool") and f.default is False:
                parser.add_argument(flag, action="store_true", default=False, help=meta["help"])
                continue
            kw: dict[str, Any] = {"default": f.default, "help": meta["help"]}
            if meta.get("type") is not None:
                kw["type"] = meta["type"]
            if meta.get("choices") is not None:
                kw["choices"] = list(meta["choices"])
            parser.add_argument(flag, **kw)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})

    @classmethod
    def parse(cls, argv: Sequence[str]) -> "ServerArgs":
        parser = make_parser()
        return cls.from_cli_args(parser.parse_args(list(argv)))

    # ---- views ----------------------------------------------------------------
    def user_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def resolved(self) -> "ServerArgs":
        """A copy with every declared resolution applied (context carried over)."""
        from impl.args.resolution import context_of

        ctx = context_of(self)
        out = dataclasses.replace(self, **ctx.overrides)
        object.__setattr__(out, "_resolution_ctx", ctx)
        return out


def make_parser(prog: str = "impl.launch_server") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Gemma-4 serving engine with YOCO fast prefill")
    ServerArgs.add_cli_args(parser)
    return parser
