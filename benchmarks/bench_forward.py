"""Forward pass: the reference NumPy GPT (lab 04) against HuggingFace GPT2LMHeadModel on
PyTorch's CPU path, same random GPT-2-small-shaped weights, same thread count.

    uv run --extra torch python benchmarks/bench_forward.py [--threads N] [--repeats R]

For T = 256 and T = 1024 (batch 1), at 1 thread, 2 threads and ``--threads`` (default:
every core), the same count for NumPy's BLAS and for PyTorch in each row, it prints both
times, their ratio (NumPy ÷ PyTorch: below 1 means NumPy is faster) and the achieved
GFLOP/s of each, beside the GFLOP/s of a plain float32 matrix product (1024 × 768 by
768 × 3072) measured at the same count. FLOPs
count the multiply-adds of every matrix product, attention's causal half included
(T·(T+1)/2 query-key pairs), as 2 per multiply-add.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (sets the BLAS threads before NumPy loads)

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402


def flops(T: int, D: int = 768, L: int = 12, V: int = 50257) -> float:
    per_layer = 2 * T * 12 * D * D + 2 * 2 * (T * (T + 1) / 2) * D  # projections + causal attention
    return L * per_layer + 2 * T * D * V  # + the tied output head


def matmul_gflops(repeats: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1024, 768), dtype=np.float32)
    b = rng.standard_normal((768, 3072), dtype=np.float32)
    return 2 * 1024 * 768 * 3072 / common.best_of(lambda: a @ b, repeats * 5) / 1e9


def main() -> None:
    import torch

    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
    ours, theirs, n_params = common.gpt2_small_pair(THREADS)
    common.print_machine(THREADS, f"; {n_params / 1e6:.1f}M parameters")
    counts = common.thread_counts(THREADS)
    print(f"Each row at one thread count, the same for NumPy's BLAS and for PyTorch: {', '.join(map(str, counts))} "
          f"(threadpoolctl and torch.set_num_threads).")
    print()
    rows, ratio = [], {}
    for n in counts:
        with common.at_threads(n):
            peak = matmul_gflops(repeats)
            for T in (256, 1024):
                ids = np.random.default_rng(T).integers(0, 50257, (1, T))
                t_ids = torch.from_numpy(ids)
                with torch.inference_mode():
                    t_np = common.best_of(lambda: ours(ids), repeats)
                    t_pt = common.best_of(lambda: theirs(t_ids), repeats)
                    diff = float(np.abs(ours(ids) - theirs(t_ids).logits.numpy()).max())
                f = flops(T)
                ratio[n, T] = (t_np, t_np / t_pt)
                rows.append([n, T, f"{t_np:.3f}", f"{t_pt:.3f}", f"{t_np / t_pt:.2f}", f"{f / t_np / 1e9:.1f}",
                             f"{f / t_pt / 1e9:.1f}", f"{peak:.1f}", f"{diff:.2e}"])
    common.print_table(["threads", "T", "NumPy s", "PyTorch s", "NumPy ÷ PyTorch", "NumPy GFLOP/s", "PyTorch GFLOP/s",
                        "plain matmul GFLOP/s", "max abs Δ logits"], rows)
    print("The plain matmul is one float32 product, (1024 × 768) @ (768 × 3072), at the row's thread count. The "
          "ratios change with the thread count: BLAS spreads the products over every thread on both sides, while "
          "lab 04's softmax, GELU and LayerNorms run on one core.")
    print()
    top = counts[-1]
    others = ", ".join(f"{ratio[n, 1024][1]:.2f}× at {common.threads(n)}" for n in counts[:-1])
    common.print_summary(f"a forward pass of GPT-2 small over 1024 tokens takes {ratio[top, 1024][0]:.3f} s in NumPy, "
                         f"{ratio[top, 1024][1]:.2f}× PyTorch's time at {common.threads(top)}"
                         + (f" ({others})" if others else ""))


if __name__ == "__main__":
    main()
