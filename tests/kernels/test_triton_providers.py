"""Which kernels the triton backend launches (IMPL_TRITON_KERNELS), what the engine says about it, and
that every provider gives the same tokens over the same metadata."""

from __future__ import annotations

import logging

import pytest
import torch

from impl.attention import triton_providers
from impl.attention.triton_providers import ENV_PROVIDER, select_provider
from impl.kernels import cpu_attn

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="provider choice on a CPU-only machine")
needs_ext = pytest.mark.skipif(cpu_attn.load() is None, reason=f"CPU attention extension unavailable: {cpu_attn.error()}")


@needs_ext
def test_auto_on_cpu_is_the_compiled_cpu_kernels(monkeypatch):
    monkeypatch.delenv(ENV_PROVIDER, raising=False)
    monkeypatch.delenv("IMPL_CPU_ATTN_KEEP_MB", raising=False)
    p = select_provider(CPU)
    assert p.name == "cpu" and p.extend is cpu_attn.extend_attention_fwd
    simd = cpu_attn.load().simd_isa()
    tiles = cpu_attn.load().extend_isa(torch.bfloat16, torch.bfloat16, 256)
    extend = f"{tiles} (bf16 / fp8 KV with bf16 queries), {simd} otherwise" if tiles != simd else simd
    decode = (f"{tiles} (bf16 / fp8 KV with bf16 queries; packed keys kept across steps, at most 512 MB), {simd} "
              "otherwise") if tiles != simd else simd
    assert p.isa == {"extend": extend, "decode": decode}
    assert p.startup_line() == f"Attention kernels: triton backend, CPU kernels (compiled; extend: {extend}, decode: {decode})"


@pytest.mark.parametrize("value,match", [("triton", "Triton compiles only for GPUs"), ("cuda", "is not one of auto, triton, cpu, interpreter, reference")])
def test_unusable_choices_are_refused(monkeypatch, value, match):
    monkeypatch.setenv(ENV_PROVIDER, value)
    with pytest.raises(ValueError, match=match) as e:
        select_provider(CPU)
    assert ENV_PROVIDER in str(e.value)


def test_explicit_interpreter_and_reference(monkeypatch):
    monkeypatch.setenv(ENV_PROVIDER, "interpreter")
    assert "under the interpreter" in select_provider(CPU).startup_line()
    monkeypatch.setenv(ENV_PROVIDER, "reference")
    assert select_provider(CPU).name == "reference"


def test_failed_build_falls_back_to_the_reference_with_one_warning(monkeypatch, caplog):
    def broken():
        raise RuntimeError("g++ not found")

    monkeypatch.setattr(cpu_attn.EXTENSION, "_tried", False)
    monkeypatch.setattr(cpu_attn.EXTENSION, "_module", None)
    monkeypatch.setattr(cpu_attn.EXTENSION, "build", broken)
    monkeypatch.delenv(ENV_PROVIDER, raising=False)
    with caplog.at_level(logging.WARNING, logger="impl.kernels"):
        first, second = select_provider(CPU), select_provider(CPU)
    assert first.name == second.name == "reference"
    assert "compiled CPU kernels unavailable: RuntimeError: g++ not found" in first.startup_line()
    warnings = [r.getMessage() for r in caplog.records if "CPU attention kernels unavailable" in r.getMessage()]
    assert len(warnings) == 1, warnings
    monkeypatch.setenv(ENV_PROVIDER, "cpu")  # asked for explicitly: refused, not silently replaced
    with pytest.raises(ValueError, match="g\\+\\+ not found"):
        select_provider(CPU)


def _engine(**kw):
    from impl import Engine
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    return Engine(tiny_checkpoint("e2b"), dtype="float32", random_seed=0, attention_backend="triton",
                  disable_radix_cache=True, **kw)


def _greedy(engine, prompts):
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 4, "temperature": 0.0})
    return [o["output_ids"] for o in outs]


@needs_ext
def test_engine_reports_the_provider_and_providers_agree(monkeypatch):
    """Startup line and /get_server_info name the provider; the CPU kernels and the torch reference over
    the same metadata produce the same greedy tokens, flag on (YOCO back half) and off."""
    from contracts.yoco_engine import prompts

    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    ps = prompts(tiny_checkpoint("e2b"), lengths=[3, 17, 40, 66])
    results = {}
    for provider in ("auto", "reference"):
        monkeypatch.setenv(ENV_PROVIDER, provider)
        for flag in (False, True):
            engine = _engine(kv_sharing_fast_prefill=flag, decode_attention_backend="triton")
            try:
                info = engine.get_server_info()
                name = "cpu" if provider == "auto" else "reference"
                want = {"backend": "triton", "provider": name}
                if provider == "auto":
                    want["isa"] = cpu_attn.kernel_isa()
                assert info["attention_kernels"] == {"prefill": want, "decode": want}
                expect = triton_providers.select_provider(CPU).startup_line()
                assert engine.startup_log.count(expect) == 1, engine.startup_log
                results[provider, flag] = _greedy(engine, ps)
            finally:
                engine.shutdown()
    assert results["auto", False] == results["reference", False] == results["auto", True] == results["reference", True]
