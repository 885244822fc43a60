"""Why the server's main thread runs torch on one thread: a 32-row oneDNN linear timed on the main thread
and then on a second thread, in one process (not a test).

Once a thread has run a multi-threaded op it keeps an OpenMP team; with a second team in the process
libgomp manages more threads than cores and stops spinning between parallel regions, so each region of
the second thread pays a sleep / wake-up. ``--main-threads 1`` keeps the main thread single-threaded, as
``impl.server.runtime.build_engine`` does.

Usage: ``OMP_NUM_THREADS=2 python -m bench.investigations.bench_thread_team [--main-threads 2|1]``.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch


def per_call_us(f, reps: int = 2000) -> float:
    for _ in range(10):
        f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--main-threads", type=int, default=2, help="torch threads of the main thread")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the second thread")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.main_threads)
    x, w = torch.randn(32, 256), torch.randn(2048, 256)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 64)

    def run(where: str) -> None:
        us = per_call_us(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
        print(f"{where}: {us:.0f} us per [32, 256] x [256, 2048] oneDNN linear ({torch.get_num_threads()} threads)")

    run(f"main thread ({args.main_threads} torch threads)")

    def second() -> None:
        torch.set_num_threads(args.threads)
        run("second thread")

    t = threading.Thread(target=second)
    t.start()
    t.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
