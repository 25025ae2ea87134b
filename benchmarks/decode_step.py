"""Where one decoding step of GPT-2 small goes, at a given thread count: lab 12's
``profile_decode_step`` (one stream, after a 64-token prompt) summed by kind, and beside
it one layer's per-head products, (12, 1, 64) @ (12, 64, S) and back, at the full BLAS
count and at one thread: whether waking every BLAS thread for such small products costs
more than it gives (then a per-size thread limit would pay).

    uv run python benchmarks/decode_step.py [--threads N] [--repeats 30]

It prints milliseconds; it asserts nothing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (sets the BLAS threads before NumPy loads)

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402


def by_kind(table) -> dict:
    kinds = {"attention": 0.0, "MLP": 0.0, "LayerNorms": 0.0, "head": 0.0, "embeddings": 0.0}
    for name, seconds in table:
        if name == "total":
            continue
        kind = ("embeddings" if name == "embeddings" else "head" if name == "head" else "attention"
                if name.endswith(".attn") else "MLP" if name.endswith(".mlp") else "LayerNorms")
        kinds[kind] += seconds
    return kinds


def main() -> None:
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 30
    common.use_reference_solutions()
    import gpt
    import inference

    from gptkit.checkpoints import GPT2_SMALL, random_gpt2_state

    model = gpt.GPTModel(**GPT2_SMALL.model_kwargs()).load_state_dict(
        random_gpt2_state(GPT2_SMALL, np.random.default_rng(2024))).eval()
    common.print_machine(None, f"; {THREADS} BLAS thread(s)")
    prompt = np.random.default_rng(7).integers(0, model.vocab_size, (1, 64))
    cache = inference.SlotCache(model, 1)
    inference.forward_slots(model, prompt, cache, np.zeros(1, np.int64))
    token = prompt[:, -1:]
    kinds = by_kind(inference.profile_decode_step(model, token, cache, repeats=repeats))
    rows = [[f"{THREADS} BLAS threads", *(f"{1e3 * v:.2f}" for v in kinds.values()), f"{1e3 * sum(kinds.values()):.2f}"]]
    print(f"One decoding step, 1 stream at position 64, each part's fastest of {repeats} (ms, summed over the 12 "
          "blocks by kind; attention includes c_attn and c_proj):")
    print()
    common.print_table(["", "attention", "MLP", "LayerNorms", "head", "embeddings", "total"], rows)
    rng = np.random.default_rng(0)
    products = []
    for S in (64, 256, 1024):
        q = rng.standard_normal((12, 1, 64), dtype=np.float32)
        k = rng.standard_normal((12, 64, S), dtype=np.float32)
        v = rng.standard_normal((12, S, 64), dtype=np.float32)

        def pair():
            (q @ k) @ v

        cells = [S]
        for threads in (THREADS, 1):
            inference.blas_threads(threads)
            pair()
            best = np.inf
            for _ in range(repeats):
                start = time.perf_counter()
                pair()
                best = min(best, time.perf_counter() - start)
            cells.append(f"{1e6 * best:.1f}")
        inference.blas_threads(THREADS)
        products.append(cells)
    print("One layer's per-head products of a step, (12, 1, 64) @ (12, 64, S) then (12, 1, S) @ (12, S, 64), "
          "µs, fastest of the repeats:")
    print()
    common.print_table(["S (keys)", f"{THREADS} BLAS threads", "1 BLAS thread"], products)
    common.print_summary(f"a decoding step of GPT-2 small at {common.threads(THREADS)}: {rows[0][-1]} ms; one layer's "
                         f"per-head products at S = 64: {products[0][1]} µs on {common.threads(THREADS)}, "
                         f"{products[0][2]} µs on 1")


if __name__ == "__main__":
    main()
