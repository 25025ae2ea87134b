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

Threads, timing and the bound are as in ``bench_generation.py`` (lab 06), both from
``benchmarks/common.py``: each token reads every weight once (the tied embedding whole,
as the output head), so tokens/s ≤ mat-vec bandwidth ÷ those bytes. Beside it, as there:
the products alone, and the stripped step (``stripped.py``).
Targets: NumPy ≥ 1× HuggingFace and ≥ 80% of the bound. This script prints; it asserts nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (sets the BLAS threads before NumPy loads)

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402


def main() -> None:
    import torch

    args = common.decoding_args(__doc__, THREADS)
    n, T = args.new_tokens, args.prompt
    common.use_reference_solutions()
    import llama
    import stripped
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

    common.print_machine(THREADS)
    print(f"task: {n} new tokens after a {T}-token prompt, greedy, batch 1, Llama shape "
          f"({n_params / 1e6:.1f}M parameters, float32, GQA 12/4 heads, tied head)")
    print()

    read_per_token = 4 * n_params
    prompt = np.random.default_rng(7).integers(0, shape.vocab_size, (1, T))
    times, outputs = common.time_runs({
        "NumPy Llama + cache": (lambda: llama.generate(model, prompt, n), args.repeats),
        common.STRIPPED: (lambda: stripped.llama_generate(model, prompt, n, llama), args.repeats),
        "HuggingFace generate()": (common.hf_greedy(hf, prompt, n), args.repeats),
        **common.bandwidth_runs(args.repeats),
        **common.matvecs_run([p.weight for layer in model.layers
                              for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                                        layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                                        layer.mlp.down_proj)]
                             + [model.embed_tokens.weight.T], n, args.repeats)})
    speed, bound = common.print_speeds_and_bound(times, n, read_per_token, "every parameter")
    ours = speed["NumPy Llama + cache"]
    common.print_target("NumPy ÷ HuggingFace", ours / speed["HuggingFace generate()"], 1.0)
    common.print_target("NumPy ÷ bound", ours / bound, 0.8, percent=True)
    print(f"- same {n} tokens from NumPy, the stripped step and HuggingFace: {common.all_same(outputs.values())}")
    print()
    common.print_summary(f"lab 08's Llama ({n_params / 1e6:.0f}M parameters) decodes at {ours:.1f} tokens/s, "
                         f"{ours / speed['HuggingFace generate()']:.2f}× HuggingFace and {100 * ours / bound:.0f}% "
                         f"of the memory-bandwidth bound ({common.threads(THREADS)})")


if __name__ == "__main__":
    main()
