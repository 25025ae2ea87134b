"""Seq2seq decoding speed: lab 09's reference NumPy greedy decoding against HuggingFace's
MarianMTModel ``generate()`` on PyTorch (CPU), the same random weights and threads.

    uv run --extra torch python benchmarks/bench_seq2seq.py [--threads N] [--source 32]
        [--new-tokens 64] [--repeats 3] [--small]

The shape is MarianMT's (opus-mt): D = 512, 6 encoder and 6 decoder layers, 8 heads,
F = 2048, a 58101-token shared vocabulary (74M parameters, float32), every parameter
random. ``--small`` uses a 4× narrower model for a quick look. Batch 1, one source of
``--source`` tokens, ``--new-tokens`` tokens decoded greedily (no EOS, so all run to the
end). Timed:

- NumPy, both caches: ``seq2seq.greedy_decode(...)`` (encoder once, self-attention KV
  cache, cross-attention keys/values computed once per layer);
- NumPy without the cross-attention cache: ``cache_cross=False`` (the self-attention
  cache kept, the cross-attention keys/values of the source recomputed at every step);
- NumPy without any cache: ``use_cache=False`` (the whole prefix decoded at every step);
- HuggingFace ``generate()`` with its cache (it caches both, as ours does) and with
  ``use_cache=False``.

Each timing is the best of ``--repeats`` runs after a warm-up run (the uncached ones:
one run). Times include the encoder. This script prints; it asserts nothing.

On a shared, busy machine use ``--threads 1``: OpenBLAS threads that wait for a busy
core spin, and a 2-thread run there was ten times slower than a 1-thread one.
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

    args = common.decoding_args(__doc__, THREADS, seq2seq=True, new_tokens=64,
                                small="D = 128, F = 512, V = 8000: a quick look")
    common.use_reference_solutions()
    import seq2seq
    from gptkit.testing.seq2seq import Seq2SeqShape, hf_marian, random_seq2seq_state

    torch.set_num_threads(THREADS)
    if args.small:
        shape = Seq2SeqShape(vocab_size=8000, d_model=128, num_layers=6, num_heads=8, d_ff=512, max_seq_len=512)
    else:
        shape = Seq2SeqShape(vocab_size=58101, d_model=512, num_layers=6, num_heads=8, d_ff=2048, max_seq_len=512,
                             pad_id=58100, eos_id=0)
    state = random_seq2seq_state(shape, np.random.default_rng(2025))
    n_params = sum(v.size for v in state.values())
    model = seq2seq.EncoderDecoderModel(**shape.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()
    hf = hf_marian(state, shape)
    hf.generation_config.eos_token_id = None  # never stop early: every decoder makes all the tokens
    n = args.new_tokens
    src = np.random.default_rng(7).integers(0, shape.vocab_size - 1, (1, args.source))
    ids = torch.from_numpy(src)

    common.print_machine(THREADS)
    print(f"task: {n} new tokens from a {args.source}-token source, greedy, batch 1, MarianMT shape "
          f"(D={shape.d_model}, {shape.num_layers}+{shape.decoder_layers} layers, V={shape.vocab_size}; "
          f"{n_params / 1e6:.1f}M parameters, float32)")
    print()

    def ours(**kw):
        return lambda: seq2seq.greedy_decode(model, src, n, **kw)

    def theirs(use_cache):
        def run():
            with torch.inference_mode():
                return hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                                   max_new_tokens=n, eos_token_id=None, use_cache=use_cache).numpy()
        return run

    times, outputs = common.time_runs({"NumPy, both caches": (ours(), args.repeats),
                                       "NumPy, no cross-attn cache": (ours(cache_cross=False), args.repeats),
                                       "NumPy, no cache": (ours(use_cache=False), 1),
                                       "HF generate(), cache": (theirs(True), args.repeats),
                                       "HF generate(), no cache": (theirs(False), 1)})
    speed = common.print_speeds(times, n, digits=3)
    ours, cached_hf = speed["NumPy, both caches"], speed["HF generate(), cache"]
    print(f"- NumPy both caches ÷ HF generate() with cache: {ours / cached_hf:.2f}× (target > 1)")
    print(f"- NumPy both caches ÷ NumPy without the cross-attention cache: "
          f"{ours / speed['NumPy, no cross-attn cache']:.2f}×")
    print(f"- NumPy no cache ÷ HF no cache: {speed['NumPy, no cache'] / speed['HF generate(), no cache']:.2f}×")
    print(f"- same {n} tokens from all five: {common.all_same(outputs.values())}")
    print()
    common.print_summary(f"lab 09's encoder–decoder decodes at width {shape.d_model} (V = {shape.vocab_size}) at {ours:.1f} tokens/s with both "
                         f"caches, {ours / cached_hf:.2f}× HuggingFace's `generate()` ({common.threads(THREADS)})")

if __name__ == "__main__":
    main()
