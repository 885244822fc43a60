"""The engine's memory decisions around loading: the fit check before any weight is read, and the
``Memory:`` startup line after (``impl/cache/memory.py`` holds the rules, ``loader.WeightPlan`` the
weights' placement)."""

from __future__ import annotations

import torch

from impl.cache.memory import MIN_KV_TOKENS, MemoryNeed, check_fits, gib, process_memory, working_bytes
from impl.config.model_config import ModelConfig
from impl.envs import envs
from impl.model.loader import MMAP_ENV, WeightPlan, plan_weights

DEFAULT_CHUNK_TOKENS = 2048  # the CPU chunked-prefill default (engine.DEFAULT_CHUNKED_PREFILL)


def check_memory(server_args, model_config: ModelConfig, dtype: torch.dtype, kv_bytes_per_token: int,
                 device: torch.device, quant=None) -> WeightPlan:
    """The WeightPlan of the model, after checking that it, the smallest KV pool the flags allow and one
    prefill chunk's working memory fit in the available memory (else ValueError naming the flags)."""
    plan = plan_weights(model_config.model_path, model_config, dtype, device, quant=quant)
    context = server_args.context_length or model_config.max_position_embeddings
    kv_tokens = server_args.max_total_tokens or min(context, MIN_KV_TOKENS)
    chunk = server_args.chunked_prefill_size
    chunk = DEFAULT_CHUNK_TOKENS if chunk is None or chunk <= 0 else chunk
    mc = model_config
    inter = mc.intermediate_size * (2 if mc.use_double_wide_mlp else 1)
    need = MemoryNeed(
        weights=plan.resident_bytes,
        kv_tokens=kv_tokens,
        kv_bytes_per_token=kv_bytes_per_token,
        working=working_bytes(chunk, mc.hidden_size, inter, mc.num_hidden_layers * mc.hidden_size_per_layer_input),
    )
    check_fits(need, device, f"{mc.name} as {str(dtype).replace('torch.', '')}", _hints(plan, model_config, kv_tokens,
                                                                                  chunk))
    return plan


def _hints(plan: WeightPlan, mc: ModelConfig, kv_tokens: int, chunk: int) -> list[str]:
    hints = []
    ck = mc.torch_dtype
    if ck in ("bfloat16", "float16") and plan.dtype == torch.float32:
        hints.append(f"--dtype auto or --dtype {ck} (the checkpoint's dtype: weights at half the size)")
    elif plan.dtype == torch.float32:
        hints.append("--dtype bfloat16 (weights at half the size)")
    if not envs.IMPL_MMAP_EMBEDDINGS.get():
        hints.append(f"unset {MMAP_ENV} (the per-layer-embedding table is then memory-mapped, not loaded)")
    hints.append(f"--max-total-tokens N below {kv_tokens} (a smaller KV pool)")
    if chunk > 512:
        hints.append(f"--chunked-prefill-size 512 (now {chunk}: less working memory per prefill step)")
    return hints


def memory_line(plan: WeightPlan, packed_bytes: int, kv_pool_bytes: int, load_peak_rss: int) -> str:
    """The ``Memory:`` startup line: peak RSS during loading, RSS now, and where the bytes are."""
    rss, _ = process_memory()
    mapped = f" + {gib(plan.mapped_bytes)} memory-mapped (page cache)" if plan.mapped_bytes else ""
    packed = f", {gib(packed_bytes)} of prepacked copies" if packed_bytes else ""
    return (f"Memory: peak RSS {gib(load_peak_rss)} while loading, RSS {gib(rss)} now; weights "
            f"{gib(plan.resident_bytes)} in memory{mapped}{packed}; KV pool {gib(kv_pool_bytes)}")


def memory_info(plan: WeightPlan, packed_bytes: int, kv_pool_bytes: int, load_peak_rss: int) -> dict:
    """``/get_server_info``'s ``memory``: RSS now and its peak so far (loading and serving), and the parts."""
    rss, peak = process_memory()
    return {"rss_bytes": rss, "peak_rss_bytes": peak, "load_peak_rss_bytes": load_peak_rss,
            "weights_bytes": plan.resident_bytes, "mapped_weights_bytes": plan.mapped_bytes,
            "prepacked_bytes": packed_bytes, "kv_pool_bytes": kv_pool_bytes,
            "embedding_tables": plan.describe_tables()}
