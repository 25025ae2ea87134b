"""Make the small GPT the notebooks look inside: lab 07's trainer on the kit's Shakespeare,
through lab 10's byte-level BPE, written to ``gptkit/data/shakespeare_bpe/``.

    uv run python -m gptkit.shakespeare_model --impl solutions     # how the shipped model was made

It runs ``python -m gptkit.train`` with the settings below (``--tokenizer bpe
--vocab-size 1024``, 4 layers, 4 heads, width 128, context 64), then keeps from its run
folder ``model.safetensors``, ``config.json`` and ``history.json`` and adds:

- ``tokenizer.json``: the BPE the trainer learned (``train_bpe`` is deterministic, so it is
  learned again here on the same text): ``vocab`` id → the token's bytes in hex, ``merges``
  as pairs of hex byte strings in rank order. ``Tokenizer(vocab, merges)`` of lab 10 takes
  them as they are (``gptkit.notebook.TrainedModel`` reads them);
- ``lines.json``: a few lines of the plays with their token ids, so that the notebooks of
  labs 04–06 can show the model at work before lab 10's encoder is written;
- ``README.md``: the command, the settings, the validation loss reached and the time taken.

The weights and ``config.json`` are a GPT-2 checkpoint: lab 05's ``load_gpt2`` and
HuggingFace's ``GPT2LMHeadModel.from_pretrained`` both load the folder.

With ``--draft`` it makes the draft model of lab 12's speculative decoding instead: the same
trainer, corpus and BPE (the tokens are those of ``shakespeare_bpe/tokenizer.json``, checked
here), 1 layer, 2 heads, width 64, written to ``gptkit/data/shakespeare_bpe_draft/`` with
``model.safetensors``, ``config.json``, ``history.json`` and its ``README.md``:

    uv run python -m gptkit.shakespeare_model --draft --impl solutions
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gptkit.command import CommandError, run_command, use_impl
from gptkit.train import CORPUS
from gptkit.train import main as train_main

OUT = Path(__file__).resolve().parent / "data" / "shakespeare_bpe"
DRAFT_OUT = OUT.with_name("shakespeare_bpe_draft")
SETTINGS = ["--tokenizer", "bpe", "--vocab-size", "1024", "--layers", "4", "--heads", "4", "--d-model", "128",
            "--block-size", "64", "--batch-size", "16", "--lr", "2e-3", "--min-lr", "2e-4", "--warmup", "50",
            "--eval-every", "200", "--eval-iters", "20", "--seed", "1337", "--samples", "1", "--sample-tokens", "60"]
# The draft: the same tokens and context, a model small enough that proposing costs little.
DRAFT_SIZE = {"--layers": "1", "--heads": "2", "--d-model": "64", "--lr": "3e-3", "--min-lr": "3e-4"}


def settings(draft: bool) -> list[str]:
    """The trainer's arguments for the target model, or with ``draft`` for the draft model."""
    out = list(SETTINGS)
    for flag, value in (DRAFT_SIZE.items() if draft else ()):
        out[out.index(flag) + 1] = value
    return out
# Lines the notebooks use (all in the corpus), stored with their ids.
LINES = [
    "To be, or not to be,--that is the question:--",
    "But soft! what light through yonder window breaks?",
    "Friends, Romans, countrymen, lend me your ears;",
    "O, she doth teach the torches to burn bright!",
    "piece of work is man! How noble in reason! how infinite in",
]


def hexed(b: bytes) -> str:
    return bytes(b).hex()


def run(args) -> int:
    out = Path(args.out or (DRAFT_OUT if args.draft else OUT))
    steps = args.steps or (DRAFT_STEPS if args.draft else STEPS)
    chosen = settings(args.draft)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        start = time.perf_counter()
        status = train_main([*chosen, "--steps", str(steps), "--impl", args.impl, "--out", str(run_dir),
                             "--quiet", "--data", str(CORPUS)])
        seconds = time.perf_counter() - start
        if status:
            return status
        use_impl(args.impl)
        import tokenizer as bpe  # lab 10 of the same tree

        text = CORPUS.read_text(encoding="utf-8")
        vocab_size = int(chosen[chosen.index("--vocab-size") + 1])
        vocab, merges = bpe.train_bpe(text[:int(0.9 * len(text))], vocab_size)
        tok = bpe.Tokenizer(vocab, merges)
        config = json.loads((run_dir / "config.json").read_text())
        if config["vocab_size"] != tok.vocab_size:
            raise CommandError(f"the BPE learned again has {tok.vocab_size} tokens, the model {config['vocab_size']}")
        for line in LINES:
            if line not in text:
                raise CommandError(f"not in the corpus: {line!r}")
        stored = {"vocab": {str(i): hexed(b) for i, b in sorted(tok.vocab.items())},
                  "merges": [[hexed(a), hexed(b)] for a, b in tok.merges]}
        if args.draft:
            shipped = OUT / "tokenizer.json"
            if not shipped.is_file() or json.loads(shipped.read_text(encoding="utf-8")) != stored:
                raise CommandError(f"the draft's BPE differs from the target's {shipped}: make the target first "
                                   "(python -m gptkit.shakespeare_model) with the same code")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name in ("model.safetensors", "config.json", "history.json"):
            shutil.copy2(run_dir / name, out / name)
    if args.draft:
        return write_draft_readme(args, out, chosen, steps, config, seconds)
    (out / "tokenizer.json").write_text(json.dumps(stored, indent=0) + "\n", encoding="utf-8")
    rows = [json.dumps({"text": line, "ids": [int(i) for i in tok.encode(line)]}) for line in LINES]
    (out / "lines.json").write_text("[\n" + ",\n".join(rows) + "\n]\n", encoding="utf-8")
    history = json.loads((out / "history.json").read_text())
    last = [h for h in history if "val" in h][-1]
    size = sum(p.stat().st_size for p in out.iterdir())
    command = _command(args, steps)
    (out / "README.md").write_text(f"""# A small GPT trained on the kit's Shakespeare

Made by the kit itself, with:

```bash
{command}
```

which runs lab 07's trainer (`python -m gptkit.train {' '.join(chosen)} --steps {steps}`)
on `labs/07_training/data/shakespeare.txt` through lab 10's byte-level BPE ({vocab_size} tokens
learned on the first 90 % of the text). {config['n_layer']} layers, {config['n_head']} heads, width
{config['n_embd']}, context {config['n_positions']}; {steps} steps of batch 16.

Validation loss after step {last['step']}: {last['val']:.3f} nats per token, {last['val_bpb']:.3f} bits per byte
(train loss, smoothed: {last['train']:.3f}). Training took {seconds / 60:.1f} minutes on {args.machine}.

Files ({size / 1e6:.1f} MB): `model.safetensors` and `config.json` (a GPT-2 checkpoint: lab 05's
`load_gpt2` and HuggingFace's `GPT2LMHeadModel.from_pretrained` load this folder), `history.json`
(the trainer's losses), `tokenizer.json` (id → token bytes in hex, merges as hex pairs in rank order),
`lines.json` (the lines the notebooks show, with their ids). The text is public domain; so is this model.
""", encoding="utf-8")
    print(f"wrote {out} ({size / 1e6:.1f} MB): validation loss {last['val']:.3f} ({last['val_bpb']:.3f} bits per "
          f"byte) after {last['step']} steps, {seconds / 60:.1f} minutes")
    return 0


STEPS = 1500
DRAFT_STEPS = 2000


def _command(args, steps: int) -> str:
    return ("uv run python -m gptkit.shakespeare_model" + (" --draft" if args.draft else "")
            + (f" --impl {args.impl}" if args.impl != "labs" else "")
            + (f" --steps {steps}" if steps != (DRAFT_STEPS if args.draft else STEPS) else ""))


def write_draft_readme(args, out: Path, chosen: list[str], steps: int, config: dict, seconds: float) -> int:
    history = json.loads((out / "history.json").read_text())
    last = [h for h in history if "val" in h][-1]
    size = sum(p.stat().st_size for p in out.iterdir())
    (out / "README.md").write_text(f"""# The draft model: a smaller GPT on the same Shakespeare and tokens

The draft of lab 12's speculative decoding, whose target is `../shakespeare_bpe/`. Made by the kit
itself, with:

```bash
{_command(args, steps)}
```

which runs lab 07's trainer (`python -m gptkit.train {' '.join(chosen)} --steps {steps}`)
on `labs/07_training/data/shakespeare.txt` through lab 10's byte-level BPE. The BPE is learned
again and checked equal to the target's (`../shakespeare_bpe/tokenizer.json`), so both models
speak the same {config['vocab_size']} tokens. {config['n_layer']} layer, {config['n_head']} heads, width
{config['n_embd']}, context {config['n_positions']}; {steps} steps of batch 16.

Validation loss after step {last['step']}: {last['val']:.3f} nats per token, {last['val_bpb']:.3f} bits per byte
(train loss, smoothed: {last['train']:.3f}). Training took {seconds / 60:.1f} minutes on {args.machine}.

Files ({size / 1e6:.2f} MB): `model.safetensors` and `config.json` (a GPT-2 checkpoint: lab 05's
`load_gpt2` and HuggingFace's `GPT2LMHeadModel.from_pretrained` load this folder), `history.json`
(the trainer's losses). The tokens are the target's `tokenizer.json`. The text is public domain;
so is this model.
""", encoding="utf-8")
    print(f"wrote {out} ({size / 1e6:.2f} MB): validation loss {last['val']:.3f} ({last['val_bpb']:.3f} bits per "
          f"byte) after {last['step']} steps, {seconds / 60:.1f} minutes")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gptkit.shakespeare_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="labs", help="whose code trains it: labs (yours), solutions, or a path")
    p.add_argument("--draft", action="store_true",
                   help="make the draft model of lab 12 (1 layer, width 64) in gptkit/data/shakespeare_bpe_draft")
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps (default {STEPS}, with --draft {DRAFT_STEPS})")
    p.add_argument("--out", default=None,
                   help="where to write it (default: gptkit/data/shakespeare_bpe, with --draft …_draft)")
    p.add_argument("--machine", default="this machine", help="what to call the machine in README.md")
    args = p.parse_args(argv)
    return run_command("shakespeare_model", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
