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
runs after a warm-up run (NumPy without a cache: one run after its warm-up), the runs
taking turns so that other work on the machine weighs on all of them alike, each after
0.2 s of idle so that no run inherits another library's spinning threads. A time
includes the prompt's forward pass; tokens/s = new tokens ÷ seconds.

The bound: decoding one token reads every weight once (the embedding tables aside: one
row each, but the token embedding is read whole as the tied output head), so tokens/s
can be at most (memory bandwidth ÷ those bytes). The bandwidth is measured here, in the
same run, with the same threads and in turn with the decoders, as the speed of a 512 MB
float32 matrix-vector product, the faster of ``W @ x`` and ``x @ W``. Beside it, the
model's own products alone, back to back (``common.matvecs_run``): how near the bound the
products themselves come, before any other work of a step. And between the two, the same
decoding stripped to its arithmetic (``stripped.py``: no checks, no layers, the fewest
NumPy calls per step): how near the bound NumPy itself comes.

Then a scaling table: lab 06's cached decoding, HuggingFace's ``generate()`` and the
products alone at 1 thread, 2 threads and ``--threads``, the same count on both sides of
each row (threadpoolctl and ``torch.set_num_threads``).

Targets: NumPy with cache ≥ 1.1× HuggingFace, ≥ 80% of the bound, ≥ 5× NumPy without
a cache. This script prints; it asserts nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (sets the BLAS threads before NumPy loads)

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402


def main() -> None:
    args = common.decoding_args(__doc__, THREADS)
    n, T = args.new_tokens, args.prompt
    model, hf, n_params = common.gpt2_small_pair(THREADS, seed=2024)
    import generation  # the reference lab 06, importable once gpt2_small_pair has set the path
    import stripped

    common.print_machine(THREADS)
    print(f"task: {n} new tokens after a {T}-token prompt, greedy, batch 1, GPT-2-small shape "
          f"({n_params / 1e6:.1f}M parameters, float32)")
    print()

    read_per_token = 4 * (n_params - model.wpe.weight.size)  # every weight but the position table
    prompt = np.random.default_rng(7).integers(0, model.vocab_size, (1, T))
    times, outputs = common.time_runs({
        "NumPy + KV cache": (lambda: generation.generate(model, prompt, n, temperature=0), args.repeats),
        "NumPy, no cache": (lambda: generation.generate(model, prompt, n, temperature=0, use_cache=False), 1),
        common.STRIPPED: (lambda: stripped.gpt2_generate(model, prompt, n, generation), args.repeats),
        "HuggingFace generate()": (common.hf_greedy(hf, prompt, n), args.repeats),
        **common.bandwidth_runs(args.repeats),
        **common.matvecs_run([w for b in model.h for w in (b.attn.c_attn.weight, b.attn.c_proj.weight,
                                                             b.mlp.c_fc.weight, b.mlp.c_proj.weight)]
                             + [model.wte.weight.T], n, args.repeats)})
    speed, bound = common.print_speeds_and_bound(times, n, read_per_token, "every parameter but the position table")
    ours = speed["NumPy + KV cache"]
    common.print_target("NumPy + cache ÷ HuggingFace", ours / speed["HuggingFace generate()"], 1.1)
    common.print_target("NumPy + cache ÷ bound", ours / bound, 0.8, percent=True)
    common.print_target("NumPy + cache ÷ NumPy without cache", ours / speed["NumPy, no cache"], 5.0)
    print(f"- same {n} tokens from NumPy (cache), NumPy (no cache), the stripped step and HuggingFace: "
          f"{common.all_same(outputs.values())}")
    print()
    scaled = scaling(args, model, hf, prompt, generation)
    top = THREADS
    others = ", ".join(f"{scaled[c]:.2f}× at {common.threads(c)}" for c in sorted(scaled) if c != top)
    common.print_summary(f"lab 06 decodes GPT-2 small at {ours:.1f} tokens/s with its KV cache at "
                         f"{common.threads(THREADS)}, {ours / speed['HuggingFace generate()']:.2f}× HuggingFace's "
                         f"`generate()` ({others} in the scaling table) and {100 * ours / bound:.0f}% of the "
                         f"memory-bandwidth bound")


def scaling(args, model, hf, prompt, generation) -> dict:
    """The scaling table: lab 06's cached decoding, HuggingFace's ``generate()`` and the
    decoder's products alone at 1, 2 and ``--threads`` threads, the same count on both sides
    of each row; returns {threads: NumPy ÷ HuggingFace}."""
    n = args.new_tokens
    matrices = [w for b in model.h for w in (b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight,
                                             b.mlp.c_proj.weight)] + [model.wte.weight.T]
    rows, ratios = [], {}
    for count in common.thread_counts(THREADS):
        with common.at_threads(count):
            times, _ = common.time_runs({
                "numpy": (lambda: generation.generate(model, prompt, n, temperature=0), args.repeats),
                "hf": (common.hf_greedy(hf, prompt, n), args.repeats),
                **common.matvecs_run(matrices, n, args.repeats)})
        ours, theirs, alone = (n / times[k] for k in ("numpy", "hf", common.PROBE + "products alone"))
        ratios[count] = ours / theirs
        rows.append([count, f"{ours:.1f}", f"{theirs:.1f}", f"{ours / theirs:.2f}", f"{alone:.1f}",
                     f"{100 * ours / alone:.0f}%"])
    print("Scaling: the same task at each thread count (best of the repeats, the runs taking turns):")
    print()
    common.print_scaling(["NumPy + KV cache tokens/s", "HuggingFace tokens/s", "NumPy ÷ HuggingFace",
                          "products alone tokens/s", "NumPy ÷ its products alone"], rows)
    print("The ratios change with the thread count: more threads speed up the products (the mat-vecs read the "
          "weights with more cores' bandwidth) on both sides, while each NumPy step's other calls run on one core.")
    print()
    return ratios


if __name__ == "__main__":
    main()
