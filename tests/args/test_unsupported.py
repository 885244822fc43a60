"""impl.args.unsupported: one ValueError listing every unimplemented setting, nothing silently ignored."""

from __future__ import annotations

import dataclasses

import pytest

from contracts.models import model_dir
from impl.args.check import check_server_args
from impl.args.platform import Platform
from impl.args.server_args import ServerArgs
from impl.args.unsupported import UNIMPLEMENTED, refuse_unimplemented, unimplemented_settings


def _checked(*flags: str, platform: str = "cpu") -> ServerArgs:
    args = ServerArgs.parse(["--model-path", model_dir("gemma-4-E2B-it"), *flags])
    return check_server_args(args, platform=Platform.by_name(platform))


@pytest.mark.parametrize("dtype", ["auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2"])
def test_implemented_settings_start(dtype):
    refuse_unimplemented(_checked("--kv-cache-dtype", dtype))
    refuse_unimplemented(_checked("--attention-backend", "triton", "--kv-cache-dtype", dtype, platform="hopper"))


def test_defaults_list_nothing():
    assert unimplemented_settings(ServerArgs()) == []


def test_one_error_lists_every_feature():
    args = _checked(
        "--enable-lmcache", "--dcp-size", "2", "--enable-hierarchical-cache", "--enable-priority-scheduling",
        "--tp-size", "2", "--enable-hisparse", "--mamba-backend", "triton",
    )
    with pytest.raises(ValueError) as err:
        refuse_unimplemented(args)
    msg = str(err.value)
    for flag in ("--enable-lmcache", "--dcp-size 2", "--enable-hierarchical-cache", "--enable-priority-scheduling",
                 "--tp-size 2", "--enable-hisparse", "--mamba-backend triton"):
        assert flag in msg, flag
    assert msg.count("\n  - ") == len(unimplemented_settings(args)) == 7


def test_resolved_values_are_refused():
    """Unified memory resolves page-major on; the refusal sees the resolved value too."""
    found = dict(unimplemented_settings(_checked("--enable-unified-memory", "--attention-backend", "triton")))
    assert found["the page-major KV layout"] == ["--enable-page-major-kv-layout (implied by other settings)"]
    assert found["the unified memory pool"] == ["--enable-unified-memory"]


def test_every_seed_field_with_a_missing_feature_is_covered():
    """Flipping any such field away from its default is refused (nothing silently ignored)."""
    flips = {
        "disaggregation_mode": "decode", "disaggregation_transfer_backend": "nixl",
        "disaggregation_decode_retraction_backup": "none", "disaggregation_decode_enable_offload_kvcache": True,
        "hicache_storage_backend": "file", "enable_hierarchical_cache": True, "enable_lmcache": True,
        "enable_unified_memory": True, "enable_page_major_kv_layout": True, "enable_hisparse": True,
        "attn_cp_size": 2, "enable_prefill_cp": True, "dcp_size": 2, "pp_size": 2, "tp_size": 2,
        "attention_backend": "fa3", "prefill_attention_backend": "flashinfer", "decode_attention_backend": "trtllm_mha",
        "linear_attn_backend": "triton", "linear_attn_prefill_backend": "triton", "linear_attn_decode_backend": "triton",
        "mamba_backend": "triton", "kv_cache_dtype": "mxfp8", "prefill_only_disable_kv_cache": True, "is_embedding": True,
        "speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1, "speculative_num_steps": 3,
        "speculative_num_draft_tokens": 4, "speculative_draft_model_path": "/x", "enable_priority_scheduling": True,
        "disable_priority_preemption": True, "cuda_graph_backend_prefill": "full",
    }
    for name, value in flips.items():
        found = unimplemented_settings(dataclasses.replace(ServerArgs(), **{name: value}))
        flag = "--" + name.replace("_", "-")
        assert any(f.split()[0] == flag for _, flags in found for f in flags), name
    assert len(UNIMPLEMENTED) == 16
