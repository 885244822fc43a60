"""Run llama.cpp's ``convert_hf_to_gguf.py`` with its bf16 rounding done in slices (``bench/bench_llamacpp.py``).

Its ``gguf.quants.BF16.quantize_blocks`` rounds a whole tensor at once through uint64 temporaries: for E2B's
per-layer-embedding table (262,144 x 8,960 = 2.35 G elements) that is ~19 GB on top of the float32 copy, and
the converter was killed for memory on a 24 GB machine. The rounding is elementwise, so doing it 16 M elements
at a time writes the same bytes. Usage: ``python -m bench.llamacpp_convert LLAMA_CPP_DIR [converter args]``.
"""

from __future__ import annotations

import os
import runpy
import sys

SLICE = 1 << 24  # elements per slice: ~200 MB of temporaries


def main(argv: list[str]) -> None:
    src, args = argv[0], argv[1:]
    sys.path[:0] = [src, os.path.join(src, "gguf-py")]  # the script imports its conversion package and gguf
    import numpy as np
    from gguf import quants

    whole = quants.BF16.quantize_blocks.__func__

    def sliced(cls, blocks: np.ndarray) -> np.ndarray:  # blocks: [n, 1] float32 -> [n, 2] uint8
        out = np.empty((blocks.shape[0], 2), dtype=np.uint8)
        for i in range(0, blocks.shape[0], SLICE):
            out[i:i + SLICE] = whole(cls, blocks[i:i + SLICE]).reshape(-1, 2)
        return out

    quants.BF16.quantize_blocks = classmethod(sliced)
    script = os.path.join(src, "convert_hf_to_gguf.py")
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
