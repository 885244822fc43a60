"""impl.args.kv_cache: hook names and order, no asserts, the views the hooks read, helper facts."""

from __future__ import annotations

import ast
import inspect
import logging

import pytest

from contracts.models import model_dir
from impl.args import check, kv_cache
from impl.args.check import check_server_args
from impl.args.platform import Platform
from impl.args.resolution import resolutions_of
from impl.args.server_args import ServerArgs
from impl.config.model_config import ModelConfig

SEED_FUNCTIONS = (
    "handle_mxfp8_kv_cache_compatibility",
    "handle_kv4_compatibility",
    "handle_prefill_only_disable_kv_cache",
    "handle_cache_compatibility",
    "handle_unified_memory_pool",
    "_validate_unified_memory_dcp",
    "handle_page_major_kv_layout",
    "validate_prefill_only_disable_kv_cache_args",
)
# SGLang 0.5.23's pipeline order (srt/arg_groups/pipeline.py).
RUN_ORDER = (
    "validate_prefill_only_disable_kv_cache_args",
    "handle_kv4_compatibility",
    "handle_mxfp8_kv_cache_compatibility",
    "handle_prefill_only_disable_kv_cache",
    "handle_cache_compatibility",
    "handle_page_major_kv_layout",
    "handle_unified_memory_pool",
)


def _check(*flags: str, model: str = "gemma-4-E2B-it", platform: str = "cpu") -> ServerArgs:
    args = ServerArgs.parse(["--model-path", model_dir(model), *flags])
    return check_server_args(args, platform=Platform.by_name(platform))


def test_every_seed_function_exists_in_seed_order():
    lines = [inspect.getsourcelines(getattr(kv_cache, name))[1] for name in SEED_FUNCTIONS]
    assert sorted(lines[:5]) == lines[:5]  # defined in the seed's order (page-major after unified)


def test_hooks_run_in_pipeline_order_after_backend_default():
    assert tuple(h.__name__ for h in kv_cache.KV_CACHE_HOOKS) == RUN_ORDER
    names = [h.__name__ for h in check.hooks()]
    assert names.index("handle_attention_backend_default") < names.index("handle_kv4_compatibility")
    assert names[-len(RUN_ORDER):] == list(RUN_ORDER)


def test_no_assert_statements():
    """Rules on user input must survive ``python -O``."""
    tree = ast.parse(inspect.getsource(kv_cache))
    assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)]


def test_unified_memory_declares_page_major_and_keeps_user_value():
    args = _check("--enable-unified-memory", "--attention-backend", "triton")
    assert args.enable_page_major_kv_layout is False
    assert args.resolved().enable_page_major_kv_layout is True
    assert [(r.source, r.field, r.value) for r in resolutions_of(args) if r.field == "enable_page_major_kv_layout"] == [
        ("handle_page_major_kv_layout", "enable_page_major_kv_layout", True)
    ]


@pytest.mark.parametrize(
    "flags,platform,expected",
    [
        ((), "cpu", "disabled"),
        ((), "hopper", "breakable"),
        (("--disable-cuda-graph",), "hopper", "disabled"),
        (("--cuda-graph-backend-prefill", "full"), "cpu", "full"),
        (("--cuda-graph-backend-prefill", "piecewise", "--disable-cuda-graph"), "sm100", "piecewise"),
    ],
)
def test_prefill_cuda_graph_backend(flags, platform, expected):
    args = _check("--attention-backend", "triton", *flags, platform=platform)
    assert kv_cache.prefill_cuda_graph_backend(args) == expected


def test_unified_memory_disables_default_prefill_capture_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="impl.args"):
        args = _check("--enable-unified-memory", "--attention-backend", "triton", platform="hopper")
    assert args.resolved().cuda_graph_backend_prefill == "disabled"
    assert kv_cache.prefill_cuda_graph_backend(args) == "disabled"
    warned = [r for r in caplog.records if r.name == "impl.args" and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "prefill cuda-graph" in warned[0].getMessage()


@pytest.mark.parametrize(
    "model,asymmetric",
    [("gemma-4-E2B-it", False), ("gemma-4-31B-it", False), ("Llama-3.1-8B-Instruct", False), ("DeepSeek-V3", True), ("MiMo-V2-Flash", True)],
)
def test_kv_row_symmetry(model, asymmetric):
    mc = ModelConfig.from_pretrained(model_dir(model))
    assert kv_cache.has_asymmetric_kv(mc) is asymmetric
    assert kv_cache.unified_memory_supported_for_model(mc, use_mla_backend=mc.is_mla) is (mc.is_mla or not asymmetric)


def test_fixture_model_facts():
    mla_swa = ModelConfig.from_pretrained(model_dir("MLA-hybrid-SWA-test"))
    assert mla_swa.is_mla and mla_swa.is_hybrid_swa
    mimo = ModelConfig.from_pretrained(model_dir("MiMo-V2-Flash"))
    assert not mimo.is_mla and mimo.is_hybrid_swa and (mimo.head_dim, mimo.v_head_dim) == (192, 128)


def test_prefill_only_error_names_resolved_backend():
    with pytest.raises(ValueError, match="'triton'"):
        _check("--prefill-only-disable-kv-cache", "--is-embedding", "--chunked-prefill-size", "-1", "--disable-radix-cache", platform="hopper")


def test_prefill_only_guard_refuses_unresolved_backend():
    """Called before the backend default (an ordering bug), the rule stops rather than check None."""
    args = ServerArgs.parse(["--prefill-only-disable-kv-cache"])
    with pytest.raises(RuntimeError, match="must run after"):
        kv_cache.handle_prefill_only_disable_kv_cache(args)
