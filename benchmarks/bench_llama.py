"""Llama decoding speed: lab 08's reference NumPy Llama with its cache against HuggingFace
``LlamaForCausalLM.generate()`` on PyTorch (CPU).

    uv run --extra torch python benchmarks/bench_llama.py [--threads N] [--prompt 32]
        [--new-tokens 128] [--repeats 3]

One Llama-shaped checkpoint of about 100M parameters (vocabulary 32000, width 768, 12
blocks of 12 query heads over 4 key/value heads, SwiGLU width 2048, head tied to the
embedding; every parameter random, float32) is loaded into the reference ``LlamaModel``
(solutions/) and into HuggingFace's model. Each generates ``--new-tokens`` tokens greedily
after the same prompt: NumPy with ``llama.generate`` (its cache), HuggingFace with
``generate(do_sample=False)`` and its own cache, never stopping early.

Threads and the bound are as in ``bench_generation.py`` (lab 06), whose bandwidth
measurement this script repeats: each token reads every weight once (the tied embedding
whole, as the output head), so tokens/s ≤ mat-vec bandwidth ÷ those bytes.

Each time is the best of ``--repeats`` runs after a warm-up run, for the whole task
(prompt + n tokens) and for the prompt + 1 token; their difference is the decoding of
tokens 2 … n, which is what the bound bounds (the prompt's forward pass is not one
token's mat-vecs). With one thread every time is also taken as the process's CPU time,
which leaves out the time other processes held the core: on a shared machine the
wall-clock figures move with the load (a 3 s generation is interrupted far more often
than a 30 ms mat-vec), the CPU-time ones much less.

Targets: NumPy ≥ 1× HuggingFace and ≥ 80% of the bound, decoding. This script prints;
it asserts nothing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_generation as bg  # noqa: E402  (sets the BLAS threads before NumPy loads)
import common  # noqa: E402

import numpy as np  # noqa: E402

THREADS = bg.THREADS


def best_of(fn, repeats: int) -> tuple[float, float]:
    """(wall, CPU) seconds: the fastest of ``repeats`` calls by each clock, after one
    untimed warm-up call."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return min(walls), min(cpus)


def matvec_bandwidth(repeats: int = 7) -> dict[str, tuple[float, float]]:
    """GB/s (wall, CPU) of W @ x and of x @ W for a 512 MB float32 W (16384 × 8192), as
    ``bench_generation.matvec_bandwidth`` measures them."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((16384, 8192), dtype=np.float32)
    x_right = rng.standard_normal(8192, dtype=np.float32)
    x_left = rng.standard_normal(16384, dtype=np.float32)
    return {name: tuple(W.nbytes / t / 1e9 for t in best_of(fn, repeats))
            for name, fn in (("W @ x", lambda: W @ x_right), ("x @ W", lambda: x_left @ W))}


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    import torch

    args = bg._args()
    n, T = args.new_tokens, args.prompt
    if n < 2:
        raise SystemExit("--new-tokens must be at least 2: decoding is timed from the second token on")
    common.use_reference_solutions()
    import llama
    from gptkit.llama_checkpoints import LlamaShape, hf_llama, random_llama_state

    shape = LlamaShape(vocab_size=32000, d_model=768, num_layers=12, num_heads=12, num_kv_heads=4, d_ff=2048,
                       max_seq_len=1024, tie_word_embeddings=True)
    torch.set_num_threads(THREADS)
    state = random_llama_state(shape, np.random.default_rng(2025), scale=1.0)
    model = llama.LlamaModel(**shape.model_kwargs(), rng=np.random.default_rng(0))
    model.load_state_dict({llama.model_name(k): llama.to_model_layout(llama.model_name(k), v)
                           for k, v in state.items()})
    hf = hf_llama(state, shape)
    n_params = sum(v.size for v in state.values())
    del state

    print(f"machine: {common.machine()}; {THREADS} thread(s) for NumPy's BLAS and for PyTorch "
          f"(torch {torch.__version__}, threads {torch.get_num_threads()}; numpy {np.__version__})")
    print(f"task: {n} new tokens after a {T}-token prompt, greedy, batch 1, Llama shape "
          f"({n_params / 1e6:.1f}M parameters, float32, GQA 12/4 heads, tied head)")
    print(f"load average (1, 5, 15 min) at the start: {load()}")

    read_per_token = 4 * n_params
    prompt = np.random.default_rng(7).integers(0, shape.vocab_size, (1, T))
    ids = torch.from_numpy(prompt)
    outputs = {}

    def numpy_cached(m):
        outputs["numpy", m] = llama.generate(model, prompt, m)

    def huggingface(m):
        with torch.inference_mode():
            outputs["hf", m] = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                                           eos_token_id=None, pad_token_id=0, max_new_tokens=m,
                                           min_new_tokens=m).numpy()

    runs = {"NumPy Llama + cache": numpy_cached, "HuggingFace generate()": huggingface}
    whole = {name: best_of(lambda: fn(n), args.repeats) for name, fn in runs.items()}
    first = {name: best_of(lambda: fn(1), args.repeats) for name, fn in runs.items()}
    bandwidth = matvec_bandwidth()
    print(f"load average at the end: {load()}")

    clocks = ["wall"] + (["CPU"] if THREADS == 1 else [])
    decode = {}  # (name, clock) -> decoding tokens/s
    print()
    print(f"{'':30s}{f'prompt + {n} tokens':>20s}{f'decoding tokens 2…{n}':>24s}")
    print(f"{'':30s}{'seconds':>10s}{'tokens/s':>10s}{'ms/token':>14s}{'tokens/s':>10s}")
    for c, clock in enumerate(clocks):
        print(f"  by {clock} time" + (" (the process's own; other processes' share of the core left out)"
                                      if clock == "CPU" else ""))
        for name in runs:
            t, t1 = whole[name][c], first[name][c]
            per_token = (t - t1) / (n - 1)
            decode[name, clock] = 1 / per_token
            print(f"    {name:26s}{t:10.2f}{n / t:10.1f}{1e3 * per_token:14.2f}{1 / per_token:10.1f}")
    print()
    print(f"weights read per token: {read_per_token / 1e6:.0f} MB (every parameter, float32)")
    ours = "NumPy Llama + cache"
    for c, clock in enumerate(clocks):
        gb_s, gb_s_left = bandwidth["W @ x"][c], bandwidth["x @ W"][c]
        bound, bound_left = gb_s * 1e9 / read_per_token, gb_s_left * 1e9 / read_per_token
        print(f"by {clock} time: mat-vec bandwidth, 512 MB float32: W @ x {gb_s:.1f} GB/s (x @ W: {gb_s_left:.1f} "
              f"GB/s); bound {gb_s:.1f} GB/s ÷ {read_per_token / 1e6:.0f} MB = {bound:.1f} tokens/s "
              f"(from x @ W: {bound_left:.1f})")
        speed = decode[ours, clock]
        for label, value, target, pct in [
                ("NumPy ÷ HuggingFace", speed / decode["HuggingFace generate()", clock], 1.0, False),
                ("NumPy ÷ bound (W @ x)", speed / bound, 0.8, True),
                ("NumPy ÷ bound (x @ W)", speed / bound_left, 0.8, True)]:
            shown, goal = ((f"{100 * value:.0f}%", f"{100 * target:.0f}%") if pct
                           else (f"{value:.2f}×", f"{target:g}×"))
            print(f"  {label:30s}{shown:>8s}   target ≥ {goal}: {'met' if value >= target else 'NOT met'}")
    same = all(np.array_equal(outputs["numpy", m], outputs["hf", m]) for m in (1, n))
    print(f"\nsame {n} tokens from NumPy and HuggingFace: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
