"""Generation speed: lab 06's reference NumPy decoding against HuggingFace on PyTorch (CPU).

    uv run --extra torch python benchmarks/bench_generation.py [--threads N] [--prompt 32]
        [--new-tokens 128] [--repeats 3]

One GPT-2-small-shaped checkpoint (124M parameters, every one random, float32) is loaded
into both the reference ``GPTModel`` (solutions/) and HuggingFace's ``GPT2LMHeadModel``
(``benchmarks/common.py``, shared with ``bench_forward.py``). Each generates ``--new-tokens`` tokens greedily after the same ``--prompt``-token prompt:

- NumPy with the KV cache: ``generation.generate(..., temperature=0)``;
- NumPy without a cache: the same with ``use_cache=False`` (the whole sequence every step);
- HuggingFace ``generate()`` with its cache (``do_sample=False``, no EOS and
  ``min_new_tokens = max_new_tokens``, so it never stops early).

NumPy's BLAS and PyTorch use the same number of threads (``--threads``, default: every
core), set before either library is imported. Each timing is the best of ``--repeats``
runs after a warm-up run (NumPy without a cache: one run after its warm-up). A time
includes the prompt's forward pass; tokens/s = new tokens ÷ seconds.

The bound: decoding one token reads every weight once (the embedding tables aside: one
row each, but the token embedding is read whole as the tied output head), so tokens/s
can be at most (memory bandwidth ÷ those bytes). The bandwidth is measured here, in the
same run and with the same threads, as the speed of a 512 MB float32 matrix-vector
product ``W @ x``; the other orientation, ``x @ W``, is printed beside it.

Targets: NumPy with cache ≥ 1.1× HuggingFace, ≥ 80% of the bound, ≥ 5× NumPy without
a cache. This script prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (sets the BLAS threads before NumPy loads)

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402


def _args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=THREADS, help="BLAS and torch threads (default: all cores)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt length (default 32)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens to generate (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each cached generator (best counts)")
    return parser.parse_args()


def matvec_bandwidth(repeats: int = 7) -> tuple[float, float]:
    """GB/s of W @ x and of x @ W for a 512 MB float32 W (16384 × 8192), read once per product."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((16384, 8192), dtype=np.float32)
    x_right = rng.standard_normal(8192, dtype=np.float32)
    x_left = rng.standard_normal(16384, dtype=np.float32)
    return (W.nbytes / common.best_of(lambda: W @ x_right, repeats) / 1e9,
            W.nbytes / common.best_of(lambda: x_left @ W, repeats) / 1e9)


def main() -> None:
    import torch

    args = _args()
    n, T = args.new_tokens, args.prompt
    model, hf, n_params = common.gpt2_small_pair(THREADS, seed=2024)
    import generation  # the reference lab 06, importable once gpt2_small_pair has set the path

    print(f"machine: {common.machine()}; {THREADS} thread(s) for NumPy's BLAS and for PyTorch "
          f"(torch {torch.__version__}, threads {torch.get_num_threads()}; numpy {np.__version__})")
    print(f"task: {n} new tokens after a {T}-token prompt, greedy, batch 1, GPT-2-small shape "
          f"({n_params / 1e6:.1f}M parameters, float32)")

    read_per_token = 4 * (n_params - model.wpe.weight.size)  # every weight but the position table
    prompt = np.random.default_rng(7).integers(0, model.vocab_size, (1, T))
    ids = torch.from_numpy(prompt)
    hf_kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1, eos_token_id=None,
                     pad_token_id=0, max_new_tokens=n, min_new_tokens=n)
    outputs = {}

    def numpy_cached():
        outputs["cache"] = generation.generate(model, prompt, n, temperature=0)

    def numpy_uncached():
        outputs["no cache"] = generation.generate(model, prompt, n, temperature=0, use_cache=False)

    def huggingface():
        with torch.inference_mode():
            outputs["hf"] = hf.generate(ids, **hf_kwargs).numpy()

    times = {"NumPy + KV cache": common.best_of(numpy_cached, args.repeats),
             "NumPy, no cache": common.best_of(numpy_uncached, 1),
             "HuggingFace generate()": common.best_of(huggingface, args.repeats)}
    gb_s, gb_s_left = matvec_bandwidth()
    bound = gb_s * 1e9 / read_per_token
    speed = {name: n / t for name, t in times.items()}

    print()
    print(f"{'':28s}{'seconds':>9s}{'tokens/s':>10s}")
    for name, t in times.items():
        print(f"  {name:26s}{t:9.2f}{speed[name]:10.1f}")
    print()
    print(f"weights read per token: {read_per_token / 1e6:.0f} MB (every parameter but the position table, float32)")
    print(f"mat-vec bandwidth, 512 MB float32: W @ x {gb_s:.1f} GB/s (x @ W: {gb_s_left:.1f} GB/s)")
    print(f"bound: {gb_s:.1f} GB/s ÷ {read_per_token / 1e6:.0f} MB = {bound:.1f} tokens/s "
          f"(from x @ W: {gb_s_left * 1e9 / read_per_token:.1f})")
    print()
    ours = speed["NumPy + KV cache"]
    checks = [
        ("NumPy + cache ÷ HuggingFace", ours / speed["HuggingFace generate()"], 1.1, "×"),
        ("NumPy + cache ÷ bound", ours / bound, 0.8, "%"),
        ("NumPy + cache ÷ NumPy without cache", ours / speed["NumPy, no cache"], 5.0, "×"),
    ]
    for name, value, target, unit in checks:
        shown = f"{100 * value:.0f}%" if unit == "%" else f"{value:.2f}×"
        goal = f"{100 * target:.0f}%" if unit == "%" else f"{target:g}×"
        print(f"  {name:38s}{shown:>8s}   target ≥ {goal}: {'met' if value >= target else 'NOT met'}")
    same = all(o.shape == outputs["hf"].shape and np.array_equal(o, outputs["hf"])
               for o in (outputs["cache"], outputs["no cache"]))
    print(f"\nsame {n} tokens from NumPy (cache), NumPy (no cache) and HuggingFace: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
