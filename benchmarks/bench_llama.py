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

Threads, timing and the bound are as in ``bench_generation.py`` (lab 06), whose
bandwidth measurement this script reuses: each token reads every weight once (the tied
embedding whole, as the output head), so tokens/s ≤ mat-vec bandwidth ÷ those bytes.
Targets: NumPy ≥ 1× HuggingFace and ≥ 80% of the bound. This script prints; it asserts nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_generation as bg  # noqa: E402  (sets the BLAS threads before NumPy loads)
import common  # noqa: E402

import numpy as np  # noqa: E402

THREADS = bg.THREADS


def main() -> None:
    import torch

    args = bg._args()
    n, T = args.new_tokens, args.prompt
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

    read_per_token = 4 * n_params
    prompt = np.random.default_rng(7).integers(0, shape.vocab_size, (1, T))
    ids = torch.from_numpy(prompt)
    hf_kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1, eos_token_id=None,
                     pad_token_id=0, max_new_tokens=n, min_new_tokens=n)
    outputs = {}

    def numpy_cached():
        outputs["numpy"] = llama.generate(model, prompt, n)

    def huggingface():
        with torch.inference_mode():
            outputs["hf"] = hf.generate(ids, **hf_kwargs).numpy()

    times = {"NumPy Llama + cache": common.best_of(numpy_cached, args.repeats),
             "HuggingFace generate()": common.best_of(huggingface, args.repeats)}
    gb_s, gb_s_left = bg.matvec_bandwidth()
    bound, bound_left = gb_s * 1e9 / read_per_token, gb_s_left * 1e9 / read_per_token
    speed = {name: n / t for name, t in times.items()}

    print()
    print(f"{'':28s}{'seconds':>9s}{'tokens/s':>10s}")
    for name, t in times.items():
        print(f"  {name:26s}{t:9.2f}{speed[name]:10.1f}")
    print()
    print(f"weights read per token: {read_per_token / 1e6:.0f} MB (every parameter, float32)")
    print(f"mat-vec bandwidth, 512 MB float32: W @ x {gb_s:.1f} GB/s (x @ W: {gb_s_left:.1f} GB/s)")
    print(f"bound: {gb_s:.1f} GB/s ÷ {read_per_token / 1e6:.0f} MB = {bound:.1f} tokens/s (from x @ W: {bound_left:.1f})")
    print()
    ours = speed["NumPy Llama + cache"]
    for name, value, target, pct in [("NumPy ÷ HuggingFace", ours / speed["HuggingFace generate()"], 1.0, False),
                                     ("NumPy ÷ bound (W @ x)", ours / bound, 0.8, True),
                                     ("NumPy ÷ bound (x @ W)", ours / bound_left, 0.8, True)]:
        shown, goal = (f"{100 * value:.0f}%", f"{100 * target:.0f}%") if pct else (f"{value:.2f}×", f"{target:g}×")
        print(f"  {name:30s}{shown:>8s}   target ≥ {goal}: {'met' if value >= target else 'NOT met'}")
    same = outputs["numpy"].shape == outputs["hf"].shape and np.array_equal(outputs["numpy"], outputs["hf"])
    print(f"\nsame {n} tokens from NumPy and HuggingFace: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
