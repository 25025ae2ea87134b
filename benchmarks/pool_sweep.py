"""How lab 12's thread pool and BLAS's thread count play out at each thread count: a sweep
of the choices that ``bench_inference`` makes once.

    BENCH_COUNTS=2,16 python benchmarks/pool_sweep.py --threads 16 [--repeats 2]

At each count of ``BENCH_COUNTS`` (default: 2 and ``--threads``; see ``common.thread_counts``),
NumPy's BLAS and PyTorch at that count:

1. **The GIL's cost of a NumPy call.** Blocks of tiny in-place NumPy calls (``np.add`` on 16
   numbers), on one thread and in ``RowPool(count)``: the calls per second each gets. A call
   runs Python (argument parsing, dispatch) holding the GIL, so threads cannot run calls
   faster than one thread does; what a pool adds to each call is the GIL changing hands.
2. **The forward** (GPT-2 small, T = 1024, random weights): PyTorch, lab 12's fast forward,
   its products alone and its other work on one thread (``bench_inference``'s probes); then,
   for each ``RowPool(count, blocks_per_thread=b, min_rows=r)``, the threaded forward (at
   a ``block_q`` of 128 or 512) and
   the other work in the pool, each ÷ PyTorch's forward, with the pool's CPU time (every
   thread's) ÷ the one thread's.
3. **Decoding** (12 greedy tokens after 32-token prompts): lab 12's decoder on one stream and
   on 8, with NumPy's BLAS at 1, 2, 4, … up to ``count`` threads, and HuggingFace's batch of
   8 with PyTorch at ``count``: tokens/s.

Every time is the best of ``--repeats`` after a warm-up, the runs of a table taking turns
(``common.time_runs``). It prints; it asserts nothing. ``docs/performance.md`` ("Scaling with
cores") quotes what it printed on a 16-core machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_inference as bench  # noqa: E402  (sets the BLAS threads from --threads before NumPy loads)
import common  # noqa: E402

import numpy as np  # noqa: E402

CONFIGS = [(4, 16, 128), (2, 16, 128), (1, 16, 128), (1, 64, 128), (1, 256, 128), (1, 64, 512)]
# (blocks_per_thread, min_rows, the threaded forward's block_q)


def gil_rows(inference, count: int, repeats: int) -> list:
    """Calls per second of tiny NumPy calls on one thread and in RowPool(count)."""
    calls, blocks = 200, 4 * count
    arrays = [np.zeros(16, np.float32) for _ in range(blocks)]

    def block(a, b):
        for i in range(a, b):
            x = arrays[i]
            for _ in range(calls):
                np.add(x, 1.0, out=x)

    with inference.RowPool(count, min_rows=1, blocks_per_thread=4) as pool:
        one = common.best_of(lambda: block(0, blocks), repeats)
        many = common.best_of(lambda: pool.map(block, blocks, min_rows=1), repeats)
    n = calls * blocks
    return [count, f"{n / one / 1e3:.0f}", f"{n / many / 1e3:.0f}", f"{1e6 * many / n:.2f}"]


def forward_rows(model, hf, inference, count: int, repeats: int) -> list:
    import torch

    T = 1024
    ids = np.random.default_rng(T).integers(0, model.vocab_size, (1, T))
    t_ids = torch.from_numpy(ids)
    kept = np.empty((1, T, model.vocab_size), np.float32)

    def pytorch():
        with torch.inference_mode():
            return hf(t_ids).logits.numpy()

    runs = {"pytorch": (pytorch, repeats),
            "fast": (lambda: inference.fast_forward(model, ids, out=kept), repeats),
            common.PROBE + "products": (bench.forward_products(model, T), repeats),
            common.PROBE + "other": (bench.forward_other_work(model, T, inference), repeats)}
    pools = {}
    for b, r, q in CONFIGS:
        pool = pools[b, r] = pools.get((b, r)) or inference.RowPool(count, blocks_per_thread=b, min_rows=r)
        runs[f"threaded {b} {r} {q}"] = (lambda pool=pool, q=q: inference.threaded_forward(
            model, ids, pool, block_q=q, out=kept), repeats)
        runs[common.PROBE + f"other {b} {r}"] = (bench.forward_other_work_threaded(model, T, inference, pool), repeats)
    times, _ = common.time_runs(runs)
    cpu = bench.cpu_times({"one": bench.forward_other_work(model, T, inference),
                           **{(b, r): bench.forward_other_work_threaded(model, T, inference, pool)
                              for (b, r), pool in pools.items()}}, repeats)
    for pool in pools.values():
        pool.close()
    base = times["pytorch"]
    rows = [[count, "—", "—", "—", f"{times['fast'] / base:.2f}× (fast forward, one thread between products)",
             f"{times[common.PROBE + 'other'] / base:.2f}× (one thread)", "1.00×", "1.00×",
             f"{times[common.PROBE + 'products'] / base:.2f}×"]]
    for b, r, q in CONFIGS:
        other = times[common.PROBE + f"other {b} {r}"]
        rows.append([count, b, r, q, f"{times[f'threaded {b} {r} {q}'] / base:.2f}×", f"{other / base:.2f}×",
                     f"{other / times[common.PROBE + 'other']:.2f}×", f"{cpu[b, r] / cpu['one']:.2f}×", ""])
    return rows, base


def decoding_rows(model, hf, inference, count: int, repeats: int) -> list:
    n, T, S = 12, 32, 8
    prompts = np.random.default_rng(7).integers(0, model.vocab_size, (S, T))
    one, eight = bench.serve(inference, model, 1, n)(prompts[:1]), bench.serve(inference, model, S, n)(prompts)
    hf_run = common.hf_greedy(hf, prompts, n)
    rows = []
    with common.at_threads(count):
        hf_time = common.best_of(hf_run, repeats)
    k = 1
    while k <= count:
        with common.at_threads(count), bench.threadpool_limits(k, user_api="blas"):
            times, _ = common.time_runs({"one": (one, repeats), "eight": (eight, repeats)})
        rows.append([count, k, f"{n / times['one']:.1f}", f"{S * n / times['eight']:.1f}", f"{S * n / hf_time:.1f}"])
        k = count if k < count and 2 * k > count else 2 * k
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=bench.THREADS, help="the largest count (default: all cores)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each (the best counts)")
    args = parser.parse_args()
    model, hf, _ = common.gpt2_small_pair(bench.THREADS)
    import inference

    counts = common.thread_counts(bench.THREADS)
    load = os.getloadavg()[0]
    common.print_machine(bench.THREADS, f"; load average {load:.1f} at the start")
    gil, fwd, dec, bases = [], [], [], {}
    start = time.perf_counter()
    for count in counts:
        with common.at_threads(count):
            gil.append(gil_rows(inference, count, args.repeats))
            rows, bases[count] = forward_rows(model, hf, inference, count, args.repeats)
            fwd += rows
        dec += decoding_rows(model, hf, inference, count, args.repeats)
        print(f"(count {count} done after {time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    print("### The GIL's cost of a NumPy call")
    print()
    common.print_table(["threads", "one thread: thousand calls/s", "RowPool: thousand calls/s",
                        "RowPool: µs per call"], gil)
    print("### The forward, T = 1024: RowPool's blocks")
    print()
    print("PyTorch's forward took " + ", ".join(f"{bases[c]:.3f} s at {common.threads(c)}" for c in counts) + ".")
    print()
    common.print_table(["threads", "blocks per thread", "min rows", "block_q", "threaded forward ÷ PyTorch",
                        "other work ÷ PyTorch's forward", "other work ÷ its one-thread time",
                        "CPU time ÷ one thread's", "products alone ÷ PyTorch"], fwd)
    print("### Decoding: BLAS's thread count")
    print()
    common.print_table(["threads (PyTorch)", "NumPy's BLAS threads", "lab 12, 1 stream tokens/s",
                        "lab 12, 8 streams tokens/s", "HuggingFace batch 8 tokens/s"], dec)
    print(f"Load average at the end: {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
