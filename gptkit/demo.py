"""See your GPT work end to end: load a GPT-2 checkpoint into *your* lab-04 model (with
your lab-05 reader) and generate greedily.

    uv run python -m gptkit.demo                         # real GPT-2 small, if on this machine
    uv run python -m gptkit.demo PATH --prompt "The dog" # a checkpoint folder, text in and out
    uv run python -m gptkit.demo PATH --ids 464,3290     # token ids in and out (no tokenizer needed)
    uv run python -m gptkit.demo --random --prompt "To be"  # a small random checkpoint: no download at all
    uv run python -m gptkit.demo --marian [PATH] --ids 5,9  # translate with your lab-09 model

Text goes in and out through *your* lab 10 tokenizer, reading GPT-2's vocabulary and
merges that the kit ships (``gptkit/data/gpt2``): no network, no ``transformers``. Until
lab 10 is done, use ``--ids``. ``--impl solutions`` runs the reference code instead of
yours (instructors, or to try the demo before your labs are finished).

``--marian`` loads a MarianMT (opus-mt) checkpoint into *your* lab-09 EncoderDecoderModel and
translates greedily. Reading its weights needs the torch extra; text needs MarianTokenizer,
which also needs the ``sentencepiece`` package and the checkpoint's ``source.spm`` /
``target.spm``; otherwise give source token ids with ``--ids``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gptkit.checkpoints import HOW_TO_GET_GPT2, GPT2Shape, find_real_gpt2, random_gpt2_state, write_checkpoint
from gptkit.command import CommandError, lab_gpt2_tokenizer, run_command, use_impl

# GPT-2's vocabulary, so that the ids of GPT-2's tokenizer fit; small otherwise.
SMALL_RANDOM = GPT2Shape(vocab_size=50257, d_model=64, num_layers=2, num_heads=4, max_seq_len=64)


def _parse_ids(text: str) -> np.ndarray:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise CommandError(f"--ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise CommandError("--ids needs at least one token id")
    return np.array([ids], dtype=np.int64)


def run(args) -> int:
    use_impl(args.impl)
    import gpt2_weights  # the student's lab 05 (which builds the student's lab 04 model)

    with tempfile.TemporaryDirectory() as tmp:
        if args.random:
            folder = write_checkpoint(Path(tmp) / "random-gpt2", random_gpt2_state(SMALL_RANDOM, np.random.default_rng(0)),
                                      SMALL_RANDOM)
            print(f"a random GPT-2 ({SMALL_RANDOM.num_layers} layers, {SMALL_RANDOM.d_model} wide, GPT-2's vocabulary "
                  f"of {SMALL_RANDOM.vocab_size}): its weights are random, so the text it generates is gibberish, "
                  "but every lab's code runs")
        else:
            folder = Path(args.checkpoint) if args.checkpoint else find_real_gpt2()
            if folder is None:
                raise CommandError(HOW_TO_GET_GPT2 + "; or try `--random`")
        start = time.perf_counter()
        model = gpt2_weights.load_gpt2(folder)
        print(f"loaded {'the random checkpoint' if args.random else folder} into your GPTModel in {time.perf_counter() - start:.1f} s "
              f"({model.num_parameters() / 1e6:.1f}M parameters)")
        tok = None
        if args.ids:
            ids = _parse_ids(args.ids)
        else:
            tok = lab_gpt2_tokenizer()
            ids = np.array([tok.encode(args.prompt)], dtype=np.int64)
            if ids.size == 0:
                raise CommandError("--prompt is empty: give some text to continue")
            print(f"prompt {args.prompt!r} → {ids.shape[1]} tokens through your tokenizer: {ids[0].tolist()} → "
                  f"{tok.decode(ids[0].tolist())!r}")
            if int(ids.max()) >= model.vocab_size:
                raise CommandError(f"the prompt has token id {int(ids.max())}, past this model's vocabulary of "
                                   f"{model.vocab_size}: GPT-2's tokenizer needs a GPT-2 vocabulary")
        n = min(args.tokens, model.max_seq_len - ids.shape[1])
        start = time.perf_counter()
        out = gpt2_weights.generate_greedy(model, ids, n)
        seconds = time.perf_counter() - start
    print(f"prompt ids:    {ids[0].tolist()}")
    print(f"generated ids: {out[0, ids.shape[1]:].tolist()}")
    if tok is not None:
        print(f"text: {tok.decode(out[0].tolist())!r}" + ("  (random weights: gibberish)" if args.random else ""))
    print(f"{n} tokens in {seconds:.2f} s ({n / seconds if seconds else 0:.1f} tokens/s, greedy, no KV cache)")
    return 0


def run_marian(args) -> int:
    use_impl(args.impl)
    import seq2seq  # the student's lab 09

    from gptkit.testing.seq2seq import HOW_TO_GET_MARIAN, find_real_marian, marian_as_lab09

    folder = Path(args.checkpoint) if args.checkpoint else find_real_marian()
    if folder is None:
        raise CommandError(HOW_TO_GET_MARIAN)
    try:
        import torch
        from transformers import MarianMTModel
    except ImportError:
        raise CommandError("reading a MarianMT checkpoint needs the torch extra: `uv sync --extra torch`") from None
    hf = MarianMTModel.from_pretrained(str(folder), torch_dtype=torch.float32, local_files_only=True)
    kwargs, state = marian_as_lab09(hf)
    model = seq2seq.EncoderDecoderModel(**kwargs, rng=np.random.default_rng(0)).load_state_dict(state).eval()
    print(f"loaded {folder} into your EncoderDecoderModel ({model.num_parameters() / 1e6:.1f}M parameters, "
          f"activation {kwargs['activation']!r})")
    tok = None
    try:
        from transformers import MarianTokenizer

        tok = MarianTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception:  # noqa: BLE001 - no sentencepiece, or no tokenizer files: ids still work
        tok = None
    if args.ids:
        src = _parse_ids(args.ids)
    elif tok is not None:
        src = np.array([tok(args.prompt)["input_ids"]], dtype=np.int64)
    else:
        raise CommandError("no Marian tokenizer here (MarianTokenizer needs the sentencepiece package and the "
                           "checkpoint's source.spm and target.spm): give source token ids with --ids, ending with "
                           f"the EOS id {hf.config.eos_token_id}")
    start = time.perf_counter()
    out = np.asarray(seq2seq.greedy_decode(model, src, args.tokens, eos_id=int(hf.config.eos_token_id)))
    seconds = time.perf_counter() - start
    print(f"source ids:     {src[0].tolist()}")
    print(f"translated ids: {out[0, 1:].tolist()}")
    if tok is not None:
        print(f"translation: {tok.decode(out[0].tolist(), skip_special_tokens=True)!r}")
    print(f"{out.shape[1] - 1} tokens in {seconds:.2f} s (greedy, the encoder run once, cross-attention cached)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gptkit.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?", help="a folder with config.json and model.safetensors "
                                                 "(default: real GPT-2 small from $GPT2_DIR or the HuggingFace cache)")
    p.add_argument("--prompt", default="The dog", help="text to continue (through your lab 10 tokenizer)")
    p.add_argument("--ids", help="token ids to continue, e.g. 464,3290 (no tokenizer needed)")
    p.add_argument("--tokens", type=int, default=20, help="how many tokens to generate (default 20)")
    p.add_argument("--random", action="store_true", help="use a small random checkpoint instead of real weights")
    p.add_argument("--impl", default="labs", help="whose code: labs (yours, default), solutions, or a path")
    p.add_argument("--marian", action="store_true",
                   help="translate with a MarianMT checkpoint in your lab-09 model (default: $MARIAN_DIR or the "
                        "HuggingFace cache; needs the torch extra)")
    args = p.parse_args(argv)
    return run_command("demo", lambda: run_marian(args) if args.marian else run(args),
                       also=(ValueError, FileNotFoundError, TypeError))


if __name__ == "__main__":
    sys.exit(main())
