"""Property: random seed-004 settings x platforms x models never crash check_server_args.

``check_server_args`` either accepts or raises ValueError / RuntimeError whose
message names at least one real command-line flag (or our environment switch);
after acceptance, the launch-time refusal raises only ValueError naming real
flags. Pure Python, a few ms per example.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.models import model_dir
from impl.args import unsupported
from impl.args.check import check_server_args
from impl.envs import envs
from impl.args.platform import Platform
from impl.args.server_args import (
    ATTENTION_BACKEND_CHOICES,
    CUDA_GRAPH_BACKEND_CHOICES,
    DECODE_RETRACTION_BACKUP_CHOICES,
    DISAGG_TRANSFER_BACKEND_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
    LINEAR_ATTN_BACKEND_CHOICES,
    MAMBA_BACKEND_CHOICES,
    ServerArgs,
    make_parser,
)
from impl.config.model_config import ModelConfig

MODELS = ("gemma-4-E2B-it", "gemma-4-31B-it", "DeepSeek-V3", "Llama-3.1-8B-Instruct", "MiMo-V2-Flash", "MLA-hybrid-SWA-test")
PLATFORMS = ("cpu", "ampere", "hopper", "sm100", "sm120")
FLAG_RE = re.compile(r"--[a-z][a-z0-9-]*")
ENV = envs.YOCO_DISABLE_LAZY_COMPACTION.name


@pytest.fixture(scope="module")
def model_configs() -> dict[str, ModelConfig]:
    return {name: ModelConfig.from_pretrained(model_dir(name)) for name in MODELS}


@pytest.fixture(scope="module")
def options() -> set[str]:
    return {opt for act in make_parser()._actions for opt in act.option_strings}


def _opt(values):
    # Unset half the time, so deep rule paths (unified memory + DCP, ...) are reached.
    return st.one_of(st.none(), st.sampled_from(values))


RARE = st.sampled_from([False, False, False, True])  # a rarely-set switch


SETTINGS = st.fixed_dictionaries(
    {
        "kv_cache_dtype": st.sampled_from(("auto", "auto", *KV_CACHE_DTYPE_CHOICES)),
        "attention_backend": _opt(ATTENTION_BACKEND_CHOICES),
        "prefill_attention_backend": _opt(ATTENTION_BACKEND_CHOICES),
        "decode_attention_backend": _opt(ATTENTION_BACKEND_CHOICES),
        "prefill_only_disable_kv_cache": RARE,
        "is_embedding": RARE,
        "chunked_prefill_size": st.sampled_from([None, -1, 512, 8192]),
        "disable_radix_cache": st.booleans(),
        "attn_cp_size": st.sampled_from([1, 1, 2]),
        "enable_prefill_cp": RARE,
        "enable_hisparse": RARE,
        "disaggregation_mode": st.sampled_from(["null", "null", "prefill", "decode"]),
        "disaggregation_transfer_backend": st.sampled_from(DISAGG_TRANSFER_BACKEND_CHOICES),
        "disaggregation_decode_retraction_backup": _opt(DECODE_RETRACTION_BACKUP_CHOICES),
        "disaggregation_decode_enable_offload_kvcache": RARE,
        "hicache_storage_backend": _opt(["file", "mooncake"]),
        "dcp_size": st.sampled_from([1, 1, 2]),
        "pp_size": st.sampled_from([1, 1, 2]),
        "tp_size": st.sampled_from([1, 1, 2]),
        "enable_priority_scheduling": RARE,
        "disable_priority_preemption": RARE,
        "enable_hierarchical_cache": RARE,
        "enable_lmcache": RARE,
        "swa_full_tokens_ratio": st.sampled_from([0.8, 0.8, 0.8, 0.25, 1.0, 0.0, -1.0, 1.5]),
        "enable_unified_memory": st.booleans(),
        "enable_page_major_kv_layout": RARE,
        "speculative_algorithm": _opt(["EAGLE", "EAGLE3", "NGRAM", "STANDALONE", "DSPARK", "NEXTN"]),
        "speculative_eagle_topk": _opt([1, 2, 4]),
        "cuda_graph_backend_prefill": _opt(CUDA_GRAPH_BACKEND_CHOICES),
        "disable_cuda_graph": RARE,
        "linear_attn_backend": _opt(LINEAR_ATTN_BACKEND_CHOICES),
        "linear_attn_prefill_backend": _opt(LINEAR_ATTN_BACKEND_CHOICES),
        "linear_attn_decode_backend": _opt(LINEAR_ATTN_BACKEND_CHOICES),
        "mamba_backend": _opt(MAMBA_BACKEND_CHOICES),
        "kv_sharing_fast_prefill": RARE,
    }
)


def _named_flags(message: str, options: set[str]) -> list[str]:
    return [f for f in FLAG_RE.findall(message) if f in options]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fields=SETTINGS,
    model=st.sampled_from(MODELS),
    platform=st.sampled_from(PLATFORMS),
    env=st.sampled_from([None, "0", "1", "bogus"]),
)
def test_check_raises_only_documented_errors_naming_flags(model_configs, options, fields, model, platform, env):
    _check_property(model_configs, options, fields, model, platform, env)


def _check_property(model_configs, options, fields, model, platform, env) -> None:
    args = ServerArgs(**fields)
    saved = os.environ.pop(ENV, None)
    if env is not None:
        os.environ[ENV] = env
    try:
        check_server_args(args, model_config=model_configs[model], platform=Platform.by_name(platform))
    except (ValueError, RuntimeError) as e:
        named = _named_flags(str(e), options)
        assert named or ENV in str(e), f"{model} on {platform}: rejection names no flag: {e}"
        return
    finally:
        os.environ.pop(ENV, None)
        if saved is not None:
            os.environ[ENV] = saved
    # Accepted: the launch-time refusal either passes or is one ValueError naming real flags.
    try:
        unsupported.refuse_unimplemented(args)
    except ValueError as e:
        found = unsupported.unimplemented_settings(args)
        assert found, "refused with nothing listed"
        for _, flags in found:
            for flag in flags:
                assert flag.split()[0] in options and flag in str(e), f"refusal must list {flag}: {e}"
    else:
        resolved = args.resolved()
        assert resolved.kv_cache_dtype in unsupported.IMPLEMENTED_KV_CACHE_DTYPES
        assert not (resolved.enable_unified_memory or resolved.enable_page_major_kv_layout or resolved.prefill_only_disable_kv_cache)


# Unified memory pinned on, the rest mostly default: reaches the DCP, DSPARK, page-major and
# prefill-capture rules (K19-K39), which the fully random settings above rarely get to.
UNIFIED = SETTINGS.map(
    lambda f: dict(
        f,
        enable_unified_memory=True,
        prefill_only_disable_kv_cache=False,
        kv_sharing_fast_prefill=False,
        swa_full_tokens_ratio=0.8,
        disaggregation_decode_enable_offload_kvcache=False,
        disaggregation_decode_retraction_backup=None,
        kv_cache_dtype="auto",
    )
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=UNIFIED, model=st.sampled_from(MODELS), platform=st.sampled_from(PLATFORMS), env=st.sampled_from([None, "1"]))
def test_unified_memory_rules_raise_only_documented_errors(model_configs, options, fields, model, platform, env):
    _check_property(model_configs, options, fields, model, platform, env)
