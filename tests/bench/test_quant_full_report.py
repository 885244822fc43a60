"""The quantized end-to-end report (bench/bench_quant_full.py) from recorded runs: rows per system and format,
each tg128 against its own bytes per step, and issue 32's ratios computed from the rows; llama.cpp's build
names the CPU's extensions and never its AMX path."""

from __future__ import annotations

import json

from bench import bench_quant_full
from bench.bench_llamacpp import cmake_options
from impl.checkpoint_factory.checkpoints import tiny_checkpoint

LIMITS = {"cpu": "Test CPU (avx2), 2 cores", "gemm_f32_flops": 1e11, "gemm_bf16_flops": 1e11, "copy_bytes_per_s": 2e10,
          "gemm_int8_ops": 2e11}


def _run(model: str, tg: float, ids: list[list[int]], **extra) -> dict:
    return {"model": model, "limits": LIMITS, "peak_rss_bytes": 4.5e9, "finished": "2026-12-03 15:00 UTC",
            "concurrent": {"ttft_median_s": 3.0, "tok_s": 5.0, "ids": ids}, "pp512": {"tok_s": 300.0},
            "pp1024": {"tok_s": 280.0}, "tg128": {"tok_s": tg}, **extra}


def test_report_rows_and_ratios(tmp_path):
    model = tiny_checkpoint("e2b")
    runs = {
        "quant-ours-bf16-on": _run(model, 4.0, [[1, 2, 3]] * 4),
        "quant-ours-int4wo-128-on": _run(model, 6.0, [[1, 2, 4]] * 4, quantization={"decode_weight_bytes": 1.5e9}),
        "quant-ours-int4wo-128-off": _run(model, 5.5, [[1, 2, 4]] * 4, quantization={"decode_weight_bytes": 1.5e9}),
        "llamacpp-q4_0": {**_run(model, 5.0, [[1, 2, 3]] * 4), "decode_weight_bytes": 1.6e9, "cmake": ["-DGGML_AVX2=ON"]},
        "llamacpp-bf16": {**_run(model, 3.0, [[1, 9, 9]] * 4), "decode_weight_bytes": 4.6e9, "cmake": ["-DGGML_AVX2=ON"]},
    }
    for name, r in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(r))

    class Args:
        out_dir = str(tmp_path)

    text = bench_quant_full.report(Args())
    assert text.startswith(bench_quant_full.SECTION + " (")  # titled with the CPU kind
    assert "CPU: Test CPU (avx2), 2 cores" in text
    # tg128 of its own bound: 6 tok/s x 1.5 GB / 20 GB/s = 45%; llama.cpp Q4_0 5 x 1.6 / 20 = 40%
    assert "| ours | int4 W4A16 (`int4wo-128`) | on | 1.50 | 4.50 | 3.0 | 5.00 | 300.0 | 280.0 | 6.00 (45%) |" in text
    assert "| llama.cpp | Q4_0 | - | 1.60 | 4.50 | 3.0 | 5.00 | 300.0 | 280.0 | 5.00 (40%) |" in text
    assert "ours int4wo-128 (flag on) / llama.cpp Q4_0: 6.00 / 5.00 = **1.20x**" in text
    assert "Peak RSS with int4 weights: 4.50 GB" in text
    assert "ours int4wo-128 2.0 / 3; llama.cpp Q4_0 1.0 / 3" in text  # each against its own engine's bf16
    assert "ours int4wo-128 flag on vs off: 4/4 requests identical" in text


def test_llamacpp_build_names_the_cpu_extensions_never_amx():
    avx2 = cmake_options({"avx2", "fma"})
    assert "-DGGML_NATIVE=OFF" in avx2 and "-DGGML_AVX2=ON" in avx2 and not any("AVX512" in o for o in avx2)
    amx = cmake_options({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"})
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"} <= set(amx)
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(amx)
