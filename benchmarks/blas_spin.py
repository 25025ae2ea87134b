"""Why lab 12's ``threaded_forward`` runs its products in the pool too: OpenBLAS's threads
busy-wait after a product, on the cores the pool needs. At the BLAS thread count of
``--threads`` (default: every core), it prints:

- the process's CPU time during a 0.3 s sleep that follows one product at that count (BLAS's
  other threads polling for their next task before they sleep; ``OPENBLAS_THREAD_TIMEOUT``,
  read when NumPy loads, sets how long: 2**28 time-stamp ticks unless set);
- at one thread, GPT-2 small's products on 1,024 rows as one call, in 16 blocks of the
  weight's columns (as ``_product(..., pool)`` splits them) and in 64-row blocks: what
  splitting a product for a pool costs;
- one layer's attention at GPT-2 small's shapes (12 heads, T = 1024, lab 12's
  ``tiled_causal_attention``) on one thread, and in ``RowPool(threads)`` two ways: one call
  per head, and one call per query range with every head (how ``threaded_forward`` cuts
  it): each NumPy call holds the GIL a moment, so more calls leave threads waiting for it;
- lab 12's ``threaded_forward`` on GPT-2 small (random weights, T = 1024), its time and the
  time spent inside each kind of map, with ``RowPool(threads)`` and ``RowPool(1)``, two
  ways: the products through the pool (as the lab states it, BLAS at one thread for the
  whole pass) and through BLAS's own threads between the maps (``_product`` and ``_head``
  called without the pool), with ``fast_forward`` beside them.

    uv run python benchmarks/blas_spin.py --threads 2
    OPENBLAS_THREAD_TIMEOUT=4 uv run python benchmarks/blas_spin.py --threads 2   # no busy wait

Each time is the fastest of ``--repeats``, every pass after a 0.3 s pause (so no pass
inherits the previous one's spinning threads). It prints; it asserts nothing.
docs/12_inference.md quotes it.
"""

import argparse
import os
import sys
import time
from collections import defaultdict

import common

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402


def cpu_after_product(threads: int, pause: float = 0.3) -> float:
    """Milliseconds of the process's CPU time during a sleep right after one product."""
    a = np.ones((512, 512), np.float32)
    a @ a
    time.sleep(pause)  # any thread still spinning from an earlier call has slept by now
    a @ a
    start = time.process_time()
    time.sleep(pause)
    return (time.process_time() - start) * 1e3


def split_costs(model) -> list[tuple[str, float, float, float]]:
    """(shape, one call ms, 16 column blocks ÷ one call, 64-row blocks ÷ one call) at one
    BLAS thread, for each distinct product of GPT-2 small and the head."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    rows = []
    block = model.h[0]
    weights = [block.attn.c_attn.weight, block.attn.c_proj.weight, block.mlp.c_fc.weight, block.mlp.c_proj.weight]
    with threadpool_limits(1, user_api="blas"):
        for w in weights + [np.ascontiguousarray(model.wte.weight.T)]:
            k, n = w.shape
            x = rng.standard_normal((1024, k), dtype=np.float32)
            out = np.empty((1024, n), np.float32)
            cols = np.linspace(0, n, 17).astype(int)
            repeats = 2 if n > 10000 else 5

            def whole():
                np.matmul(x, w, out=out)

            def columns():
                for a, b in zip(cols[:-1], cols[1:]):
                    np.matmul(x, w[:, a:b], out=out[:, a:b])

            def row_blocks():
                for a in range(0, 1024, 64):
                    np.matmul(x[a:a + 64], w, out=out[a:a + 64])

            one = common.best_of(whole, repeats)
            rows.append((f"(1024, {k}) @ ({k}, {n})", one * 1e3, common.best_of(columns, repeats) / one,
                         common.best_of(row_blocks, repeats) / one))
    return rows


def attention_split(inference, threads: int, repeats: int) -> tuple[float, float, float]:
    """Milliseconds of one layer's causal attention (12 heads, T = 1024, d = 64) on one
    thread, then in ``RowPool(threads)`` as one call per head and as one call per query
    range of every head (ranges of equal causal area, as ``threaded_forward`` makes them), with
    ``threaded_forward``'s tiles."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((12, 1024, 64), dtype=np.float32) for _ in range(3))
    out = np.empty_like(q)
    tiles = dict(block_q=128, block_k=1024)  # threaded_forward's defaults

    def per_head(a, b):
        for h in range(a, b):
            out[h] = inference.tiled_causal_attention(q[h], k[h], v[h], **tiles)

    ranges = inference._query_chunks(1024, threads * max(1, 8 // threads), 16)

    def per_range(a, b):
        for s, e in ranges[a:b]:
            out[:, s:e] = inference.tiled_causal_attention(q[:, s:e], k[:, :e], v[:, :e], **tiles)

    def fastest(fn) -> float:  # after a warm-up; every call after a short pause, untimed
        fn()
        times = []
        for _ in range(repeats):
            time.sleep(0.05)
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times) * 1e3

    def whole(a, b):
        out[:] = inference.tiled_causal_attention(q, k, v, **tiles)

    with inference.RowPool(1) as alone:  # one block in the calling thread, BLAS at one thread
        one = fastest(lambda: alone.map(whole, 1))
    with inference.RowPool(threads) as pool:
        heads = fastest(lambda: pool.map(per_head, 12, min_rows=1))
        split = fastest(lambda: pool.map(per_range, len(ranges), min_rows=1))
    return one, heads, split


def timed_maps(pool, totals: dict):
    """``pool`` with its ``map`` timed: the seconds inside each kind of map (named by the
    function mapped) add up in ``totals``."""
    plain = pool.map

    def map(fn, n, **kw):
        start = time.perf_counter()
        plain(fn, n, **kw)
        name = getattr(fn, "__qualname__", "?").replace(".<locals>", "").split(".")
        totals[name[-2] if name[-1] in ("rows", "<lambda>", "some") and len(name) > 1 else name[-1]] += (
            time.perf_counter() - start)

    pool.map = map
    return pool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=THREADS, help="BLAS threads and the pool's (default: all cores)")
    parser.add_argument("--repeats", type=int, default=3, help="passes of each forward; the fastest counts (default 3)")
    args = parser.parse_args()
    common.use_reference_solutions()
    import gpt
    import inference

    from gptkit.checkpoints import GPT2_SMALL, random_gpt2_state

    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "not set")
    common.print_machine(THREADS, f"; OPENBLAS_THREAD_TIMEOUT {timeout}; load average {os.getloadavg()[0]:.1f} "
                                  "at the start")
    print(f"CPU time in a 0.3 s sleep after one (512, 512) product at {common.threads(THREADS)}: "
          f"{cpu_after_product(THREADS):.0f} ms")
    model = gpt.GPTModel(**GPT2_SMALL.model_kwargs()).load_state_dict(
        random_gpt2_state(GPT2_SMALL, np.random.default_rng(2024))).eval()
    print()
    print("| product, one BLAS thread | one call (ms) | 16 column blocks ÷ one call | 64-row blocks ÷ one call |")
    print("| --- | --- | --- | --- |")
    for shape, ms, cols, rows in split_costs(model):
        print(f"| {shape} | {ms:.1f} | {cols:.2f}× | {rows:.2f}× |")
    print()

    one, heads, split = attention_split(inference, THREADS, 5 * args.repeats)
    print(f"One layer's attention (12 heads, T = 1024): one thread, one call {one:.1f} ms; RowPool({THREADS}), "
          f"a call per head {heads:.1f} ms ({heads / one:.2f}×), a call per query range of every head {split:.1f} ms "
          f"({split / one:.2f}×)")
    print()
    ids = np.random.default_rng(1024).integers(0, model.vocab_size, (1, 1024))
    out = np.empty((1, 1024, model.vocab_size), np.float32)
    pooled_product, pooled_head = inference._product, inference._head

    def through_blas(layer, x, o, pool=None):  # as before: the product between the maps
        return pooled_product(layer, x, o)

    def head_through_blas(model, x, o=None, pool=None):
        return pooled_head(model, x, o)

    results = []
    for label, threads in ((f"RowPool({THREADS})", THREADS), ("RowPool(1)", 1)):
        for products in ("in the pool", "BLAS's threads"):
            totals = defaultdict(float)
            with inference.RowPool(threads) as pool:
                timed_maps(pool, totals)
                best, maps = float("inf"), {}
                for _ in range(args.repeats + 1):  # the first pass is a warm-up
                    totals.clear()
                    time.sleep(0.3)
                    if products == "BLAS's threads":
                        inference._product, inference._head = through_blas, head_through_blas
                    try:
                        start = time.perf_counter()
                        inference.threaded_forward(model, ids, pool, out=out)
                        took = time.perf_counter() - start
                    finally:
                        inference._product, inference._head = pooled_product, pooled_head
                    if took < best:
                        best, maps = took, dict(totals)
            results.append((label, products, best, maps))
    fast = []
    for _ in range(args.repeats + 1):
        time.sleep(0.3)
        start = time.perf_counter()
        inference.fast_forward(model, ids, out=out)
        fast.append(time.perf_counter() - start)
    kinds = ["attend", "gelu", "residual_then_norm", "to_heads", "layer_norm"]
    print(f"threaded_forward, GPT-2 small, T = 1024, BLAS at {common.threads(THREADS)} outside the maps; "
          f"fast_forward {min(fast[1:]) * 1e3:.0f} ms")
    print()
    print("| pool | products | the pass (ms) | inside the products' maps (ms) | "
          + " | ".join(f"`{k}` maps (ms)" for k in kinds) + " |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in kinds) + " |")
    for label, products, best, maps in results:
        product_maps = sum(v for k, v in maps.items() if k not in kinds)
        print(f"| {label} | {products} | {best * 1e3:.0f} | {product_maps * 1e3:.0f} | "
              + " | ".join(f"{maps.get(k, 0.0) * 1e3:.0f}" for k in kinds) + " |")


if __name__ == "__main__":
    main()
