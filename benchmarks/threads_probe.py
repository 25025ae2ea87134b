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
  same weight, so partly from the cache).

Every time is the fastest of its repeats. It prints; it asserts nothing. docs/performance.md
("Scaling with cores") quotes what it printed on a 16-core machine.
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


if __name__ == "__main__":
    main()
