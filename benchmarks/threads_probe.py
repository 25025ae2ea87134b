"""Small probes of what threads give NumPy, at the thread count of OPENBLAS_NUM_THREADS
(run it once per count: the variable must be set before NumPy loads):

    OPENBLAS_NUM_THREADS=16 python benchmarks/threads_probe.py

- ``x**3`` against ``x*x*x`` on a (1024, 3072) float32 array;
- a softmax over (12·1024, 1024) float32 rows and an in-place GELU on (1024, 3072), on the
  calling thread and over N row blocks in a pool of N Python threads (N the BLAS count);
- one layer's per-head products of a decoding step, (12, 1, 64) @ (12, 64, S) @ (12, S, 64);
- lab 12's ``profile_decode_step`` for GPT-2 small (random weights, one stream at
  position 64), summed by part;
- each of GPT-2 small's weight products on 1 and on 8 rows, alone (each 50 times over the
  same weight, so partly from the cache);
- the stripped decoding step (``stripped.gpt2_step``, GPT-2 small, 16 steps from position
  64) taken apart: the whole step; its weight products alone, the same inputs in the same
  order; its other work alone (each product's result handed back ready-made), once with
  BLAS's helper threads asleep and once with them polling (a product on every thread just
  before). Where the whole step takes longer than its two parts added, the cost is in
  running them one after the other; where the other work takes longer with the helpers
  polling, they slow the calling thread;
- lab 12's ``BatchedDecoder`` with 1 and with 8 streams (16 steps after 32-token
  prompts), each step taken apart with clocks around the reference's ``_linear``,
  ``_head`` and ``attend_rows``: the weight products (the head's included), the attention
  without its two products, and the rest;
- that attention alone for 8 rows at 64 cached positions (``attend_rows``'s scores,
  softmax and weighted sum, over buffers shaped as a ``SlotCache``'s, (8, 12, 1024, 64)),
  with the buffers in the processor's
  caches ("warm") and after 256 MB have streamed through them, as the weights do in a step
  ("cold"); and, cold, split by rows over a ``RowPool`` of N threads.

Every time is the fastest of its repeats. It prints; it asserts nothing. docs/performance.md
("Scaling with cores") quotes what it printed on a 16-core machine (before the decoding
parts were added), and "Where a decoding step's time goes" its decoding parts on the kit's
2-core machine.
"""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import numpy as np  # noqa: E402

N = int(os.environ.get("OPENBLAS_NUM_THREADS", "1"))


def best(fn, repeats: int = 7) -> float:
    """Milliseconds: the fastest of ``repeats`` calls after one untimed call."""
    import common

    return common.best_of(fn, repeats) * 1e3


def softmax(a):
    a -= a.max(-1, keepdims=True)
    np.exp(a, out=a)
    a /= a.sum(-1, keepdims=True)


def gelu(a):  # lab 12's fast_gelu: x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715 x^3)
    z = a * a
    z *= -0.0713548
    z -= 1.5957691
    z *= a
    np.minimum(z, 88.0, out=z)
    np.exp(z, out=z)
    z += 1.0
    np.divide(a, z, out=a)


def main() -> None:
    rng = np.random.default_rng(0)
    pool = ThreadPoolExecutor(N)

    def in_pool(fn, a):
        n = len(a)
        blocks = [(i * n // N, (i + 1) * n // N) for i in range(N)]
        list(pool.map(lambda p: fn(a[p[0]:p[1]]), blocks))

    x = rng.standard_normal((1024, 3072), dtype=np.float32)
    print(f"N={N} x**3 {best(lambda: x**3):.2f} ms, x*x*x {best(lambda: x * x * x):.2f} ms")
    scores = rng.standard_normal((12 * 1024, 1024), dtype=np.float32)
    y = x.copy()
    print(f"softmax (12,1024,1024): 1 thread {best(lambda: softmax(scores), 3):.1f} ms, pool {N} "
          f"{best(lambda: in_pool(softmax, scores), 3):.1f} ms; gelu (1024,3072): {best(lambda: gelu(y)):.2f} ms, "
          f"pool {best(lambda: in_pool(gelu, y)):.2f} ms")
    for S in (64, 256, 1024):
        q = rng.standard_normal((12, 1, 64), dtype=np.float32)
        k = rng.standard_normal((12, 64, S), dtype=np.float32)
        v = rng.standard_normal((12, S, 64), dtype=np.float32)
        print(f"per-head products S={S}: {1e3 * best(lambda: (q @ k) @ v, 30):.1f} us")

    import common

    common.use_reference_solutions()
    import gpt
    import inference

    from gptkit.checkpoints import GPT2_SMALL, random_gpt2_state

    model = gpt.GPTModel(**GPT2_SMALL.model_kwargs()).load_state_dict(
        random_gpt2_state(GPT2_SMALL, np.random.default_rng(1))).eval()
    prompt = rng.integers(0, 50257, (1, 64))
    cache = inference.SlotCache(model, 1)
    inference.forward_slots(model, prompt, cache, np.zeros(1, np.int64))
    table = inference.profile_decode_step(model, prompt[:, -1:], cache, repeats=15)
    parts = {}
    for name, seconds in table[:-1]:
        part = name.split(".")[-1]
        parts[part] = parts.get(part, 0) + seconds
    print("step ms", {k: round(s * 1e3, 2) for k, s in parts.items()}, "total", round(table[-1][1] * 1e3, 2))

    cells = []
    for shape in ((768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50257)):
        W = rng.standard_normal(shape, dtype=np.float32)
        for rows in (1, 8):
            a = rng.standard_normal((rows, shape[0]), dtype=np.float32)
            cells.append(f"{rows}x{shape}:{1e3 * best(lambda: a @ W, 50):.0f}")
    print("threads", N, " ".join(cells), "(us)")
    decode_parts(model, rng)
    for streams in (1, 8):
        decoder_parts(model, inference, rng, streams)
    cached_attention(inference, rng)


def decode_parts(model, rng, steps: int = 16, repeats: int = 7) -> None:
    """Print the stripped step's parts (see the module's docstring), ms per step."""
    import common
    import generation
    import stripped

    prompt = rng.integers(0, model.vocab_size, (1, 64))
    tokens = rng.integers(0, model.vocab_size, steps).tolist()
    cache = generation.KVCache(model, 1)
    generation.forward_with_cache(model, prompt, cache)
    made = []  # (x, W, x @ W) of every weight product of the steps, in order

    def record(x, W):
        made.append((x.copy(), W, x @ W))
        return made[-1][2]

    def steps_of(step):
        def run():
            for i, token in enumerate(tokens):
                step(token, 64 + i)
        return run

    steps_of(stripped.gpt2_step(model, cache, record))()
    given = iter(())

    def ready(x, W):
        return next(given)

    def other():
        nonlocal given
        given = iter([y for _, _, y in made])
        steps_of(stripped.gpt2_step(model, cache, ready))()

    wake_x = rng.standard_normal((256, 768), dtype=np.float32)
    wake_W = rng.standard_normal((768, 3072), dtype=np.float32)
    runs = {
        "whole step": (steps_of(stripped.gpt2_step(model, cache)), None),
        "weight products alone": (lambda: [x @ W for x, W, _ in made], None),
        "other work alone, BLAS helpers asleep": (other, None),
        "other work alone, BLAS helpers polling": (other, lambda: wake_x @ wake_W),
    }
    best = {}
    for _ in range(repeats):  # the runs take turns, each after a pause (helpers asleep)
        for name, (fn, before) in runs.items():
            time.sleep(common.PAUSE)
            if before is not None:
                before()
            start = time.perf_counter()
            fn()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    ms = {name: 1e3 * t / steps for name, t in best.items()}
    parts = ms["weight products alone"] + ms["other work alone, BLAS helpers asleep"]
    print(f"stripped step, threads {N}, ms per step (best of {repeats}, {steps} steps from position 64): "
          + ", ".join(f"{name} {t:.2f}" for name, t in ms.items())
          + f"; whole ÷ the two parts added {ms['whole step'] / parts:.2f}; products alone ÷ whole "
          f"{ms['weight products alone'] / ms['whole step']:.0%}")


def decoder_parts(model, inference, rng, streams: int, steps: int = 16, repeats: int = 3, prompt: int = 32) -> None:
    """Print lab 12's decoder's step taken apart (see the module's docstring), ms per step."""
    spent = dict.fromkeys(("products", "attention", "attention's products"), 0.0)
    linear, head, attend = inference._linear, inference._head, inference.attend_rows
    inside = [False]

    def timed(fn, name):
        def call(*args, **kwargs):
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            took = time.perf_counter() - start
            spent[name] += took
            if name == "products" and inside[0]:
                spent["attention's products"] += took
            return result
        return call

    timed_attend = timed(attend, "attention")

    def attention(*args, **kwargs):
        inside[0] = True
        try:
            return timed_attend(*args, **kwargs)
        finally:
            inside[0] = False

    prompts = rng.integers(0, model.vocab_size, (streams, prompt))
    decoder = inference.BatchedDecoder(model, streams)
    found = None
    inference._linear, inference._head = timed(linear, "products"), timed(head, "products")
    inference.attend_rows = attention
    try:
        for run in range(repeats + 1):  # run 0 is not counted: it touches the cache's buffers first
            for p in prompts:
                decoder.submit(p, steps + 1)
            decoder.step()  # the prefill and the first token
            spent.update(dict.fromkeys(spent, 0.0))
            start = time.perf_counter()
            for _ in range(steps):
                decoder.step()
            took = time.perf_counter() - start
            if run > 0 and (found is None or took < found[0]):
                found = (took, dict(spent))
            decoder.run()
    finally:
        inference._linear, inference._head, inference.attend_rows = linear, head, attend
    took, parts = found
    body = parts["attention"] - parts["attention's products"]
    ms = {"step": took, "weight products": parts["products"], "attention without its products": body,
          "the rest": took - parts["products"] - body}
    print(f"lab 12 decoder, {streams} stream{'s' if streams > 1 else ''}, threads {N}, ms per step (best of "
          f"{repeats}, {steps} steps after {prompt}-token prompts): "
          + ", ".join(f"{name} {1e3 * t / steps:.2f}" for name, t in ms.items())
          + f"; products ÷ step {parts['products'] / took:.0%}")


def cached_attention(inference, rng, B: int = 8, S: int = 64, repeats: int = 20) -> None:
    """Print one layer's attention for B rows at S cached positions, warm, cold and pooled
    (see the module's docstring), in µs."""
    import math

    H, L, d = 12, 1024, 64
    keys, values = (rng.standard_normal((B, H, L, d), dtype=np.float32) for _ in range(2))
    q = rng.standard_normal((B, H, 1, d), dtype=np.float32)
    out = np.empty((B, H, 1, d), np.float32)
    flood = np.ones(64 << 20, np.float32)  # 256 MB

    def rows(a, b):
        scores = (q[a:b] * (1.0 / math.sqrt(d))) @ keys[a:b, :, :S].swapaxes(-1, -2)  # (b-a, H, 1, S)
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        np.matmul(scores, values[a:b, :, :S], out=out[a:b])

    def timed(fn, cold: bool) -> float:
        fn()
        times = []
        for _ in range(repeats):
            if cold:
                flood.sum()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e6 * min(times)

    with inference.RowPool(N, min_rows=1, blocks_per_thread=1) as pool:
        pooled = timed(lambda: pool.map(rows, B), True)
    print(f"attention of {B} rows over {S} cached positions, one layer, threads {N} (µs, best of {repeats}): "
          f"warm {timed(lambda: rows(0, B), False):.0f}, cold {timed(lambda: rows(0, B), True):.0f}, "
          f"cold in RowPool({N}) by rows {pooled:.0f}")


if __name__ == "__main__":
    main()
