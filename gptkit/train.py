"""Train a character-level GPT on the kit's Shakespeare with *your* lab code (lab 07's
backward, AdamW, clipping and schedule, on your labs 01–06), then sample from it with
your lab 06 sampler.

    uv run python -m gptkit.train                       # your code, the default settings (below)
    uv run python -m gptkit.train --steps 200           # a short run
    uv run python -m gptkit.train --tokenizer bpe --vocab-size 512   # BPE tokens from your lab 10
    uv run python -m gptkit.train --resume              # go on from runs/shakespeare's checkpoint
    uv run python -m gptkit.train --impl solutions      # the reference code (instructors)

The defaults are the classic small character-level configuration: 4 layers, 4 heads,
width 128, context 64, batch 12, 2000 steps, lr 1e-3 with 100 warm-up steps and a cosine
decay to 1e-4, AdamW (betas 0.9/0.99, weight decay 0.1), gradients clipped at 1.0. Every
``--eval-every`` steps it prints the validation loss (on the same fixed validation
batches each time) and writes a checkpoint to ``--out``: ``model.safetensors`` and
``config.json`` (a GPT-2 that lab 05 and HuggingFace load), ``optimizer.safetensors``
(AdamW's moments and step) and ``history.json``. Batches are drawn from a generator seeded
with (seed, step), so a resumed run sees the batches an uninterrupted one would have.
With matplotlib installed (``uv sync --extra plot``) it also draws ``loss.png``.

Tokens: characters (lab 07's ``CharTokenizer``), or with ``--tokenizer bpe`` byte-level
BPE from lab 10: ``train_bpe`` learns ``--vocab-size`` tokens on the training part of the
text (the first 90 %, the part the model trains on), and ``Tokenizer`` encodes it all. A
loss per token depends on what a token is, so the validation loss is also reported in
bits per byte (nats per token / ln 2 / the validation text's bytes per token): that
number compares a character run with a BPE run.

Threads: the environment sets NumPy's BLAS threads (``OMP_NUM_THREADS=2 uv run python -m
…``), and with more than one the trainer splits each batch by rows into that many shards,
run at once on threads with one BLAS thread each (``--workers`` sets the count; 1 runs
lab 07's ``train_step`` as it is). The shards' gradients are averaged, so the step is the
same up to float rounding, and faster: NumPy's elementwise work runs on one core per call,
and shards use them all (``gptkit.parallel``). Before the first step it checks that your
code gives the same gradients as shards as in one call, and trains one batch at a time if not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from gptkit.checkpoints import read_safetensors
from gptkit.command import CommandError, run_command, use_impl
from gptkit.parallel import DataParallel, blas_threads
from gptkit.testing.layout import KIT_ROOT

CORPUS = KIT_ROOT / "labs" / "07_training" / "data" / "shakespeare.txt"


def _bar(step: int, total: int, loss: float, tok_s: float, eta: float, width: int = 24) -> str:
    done = int(width * step / max(total, 1))
    return (f"\r[{'#' * done}{'.' * (width - done)}] step {step}/{total}  loss {loss:.4f}  "
            f"{tok_s:,.0f} tok/s  eta {eta / 60:.1f} min ")


def _save(out: Path, tr, model, opt, step: int, history: list) -> None:
    tr.save_checkpoint(out, model, {"step": str(step)})
    moments = {f"m.{k}": v for k, v in opt.m.items()} | {f"v.{k}": v for k, v in opt.v.items()}
    tr.write_safetensors(out / "optimizer.safetensors", moments, {"step": str(step), "t": str(opt.t)})
    (out / "history.json").write_text(json.dumps(history, indent=0))


def _resume(out: Path, gpt2_weights, model, opt) -> tuple[int, list]:
    """Load model and optimizer state from ``out``; returns (next step, history)."""
    if not (out / "model.safetensors").is_file() or not (out / "optimizer.safetensors").is_file():
        raise CommandError(f"--resume: no checkpoint in {out} (model.safetensors and optimizer.safetensors)")
    model.load_state_dict(gpt2_weights.read_checkpoint(out / "model.safetensors"))
    moments, meta = read_safetensors(out / "optimizer.safetensors")
    for name, arr in moments.items():
        kind, param = name.split(".", 1)
        (opt.m if kind == "m" else opt.v)[param][...] = arr
    opt.t = int(meta["t"])
    history = json.loads((out / "history.json").read_text()) if (out / "history.json").is_file() else []
    return int(meta["step"]), history


def _plot(out: Path, history: list) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no loss.png: matplotlib is not installed (`uv sync --extra plot`)"
    fig, ax = plt.subplots(figsize=(6, 4))
    train = [(h["step"], h["train"]) for h in history if "train" in h]
    val = [(h["step"], h["val"]) for h in history if "val" in h]
    if train:
        ax.plot(*zip(*train), label="train (smoothed)", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=120)
    plt.close(fig)
    return f"loss curve: {out / 'loss.png'}"


def make_tokenizer(args, text: str, tr):
    """The run's tokenizer: lab 07's characters, or lab 10's BPE trained on the text's first
    90 % (the training part; the validation part is its last 10 %)."""
    if args.tokenizer == "char":
        return tr.CharTokenizer(text)
    if args.vocab_size < 257:
        raise CommandError(f"--vocab-size must be at least 257 (the 256 bytes and one merge), got {args.vocab_size}")
    import tokenizer as bpe  # lab 10

    start = time.perf_counter()
    vocab, merges = bpe.train_bpe(text[:int(0.9 * len(text))], args.vocab_size)
    tok = bpe.Tokenizer(vocab, merges)
    print(f"tokenizer: byte-level BPE from your lab 10, {len(merges)} merges learned on the training text in "
          f"{time.perf_counter() - start:.1f} s")
    return tok


def bytes_per_token(tok, ids) -> float:
    """UTF-8 bytes of text per token in ``ids`` (what turns nats per token into bits per byte)."""
    return len(tok.decode([int(i) for i in ids]).encode("utf-8")) / max(len(ids), 1)


def bits_per_byte(loss: float, per_token: float) -> float:
    return loss / np.log(2) / per_token


def sample(model, tok, gen, *, prompt: str, n: int, temperature: float, top_k: int | None,
           rng: np.random.Generator) -> str:
    """``n`` tokens (characters, or BPE tokens) after ``prompt``, one at a time with lab 06's ``sample_next``; the
    context slides once it fills the model's ``max_seq_len`` positions."""
    ids = list(tok.encode(prompt))
    for _ in range(n):
        context = np.array([ids[-model.max_seq_len:]], dtype=np.int64)
        logits = model(context)[:, -1]
        ids.append(int(gen.sample_next(logits, temperature=temperature, top_k=top_k, rng=rng)[0]))
    return tok.decode(np.array(ids))


def run(args) -> int:
    use_impl(args.impl)
    import generation  # lab 06
    import gpt  # lab 04
    import gpt2_weights  # lab 05
    import training as tr  # lab 07

    text = Path(args.data).read_text(encoding="utf-8")
    tok = make_tokenizer(args, text, tr)
    train, val = tr.train_val_split(np.asarray(tok.encode(text), dtype=np.int64), 0.1)
    val_bytes_per_token = bytes_per_token(tok, val)
    unit = "characters" if args.tokenizer == "char" else "tokens"
    print(f"corpus: {Path(args.data).name}, {len(text):,} characters, vocabulary {tok.vocab_size}; "
          f"{len(train):,} {unit} for training, {len(val):,} for validation ({val_bytes_per_token:.2f} bytes each)")
    model = gpt.GPTModel(tok.vocab_size, args.d_model, args.layers, args.heads, 4 * args.d_model, args.block_size,
                         dropout=args.dropout, rng=np.random.default_rng(args.seed))
    model.train()
    opt = tr.AdamW(model, lr=args.lr, betas=(0.9, 0.99), weight_decay=args.weight_decay)
    out = Path(args.out)
    start, history = _resume(out, gpt2_weights, model, opt) if args.resume else (0, [])
    print(f"model: {args.layers} layers, {args.heads} heads, width {args.d_model}, context {args.block_size}: "
          f"{model.num_parameters() / 1e6:.2f}M parameters; steps {start} … {args.steps}, batch {args.batch_size}")

    def evaluate() -> float:
        return tr.estimate_loss(model, val, batch_size=args.batch_size, block_size=args.block_size,
                                iters=args.eval_iters, rng=np.random.default_rng(args.seed + 1))

    if args.workers < 0:
        raise CommandError(f"--workers must be 1 or more (0: NumPy's BLAS thread count), got {args.workers}")
    workers = min(args.workers or blas_threads(), args.batch_size)
    parallel = DataParallel(tr, workers) if workers > 1 else None
    if parallel is not None and start < args.steps:
        x, y = tr.get_batch(train, args.batch_size, args.block_size, np.random.default_rng([args.seed, start]))
        problem = parallel.agrees(model, x, y)
        if problem is None:
            print(f"threads: each batch in {workers} shards at once, one BLAS thread each (--workers 1: one at a time)")
        else:
            print(f"threads: your loss_and_grads gives other gradients when {workers} shards of a batch run at once "
                  f"({problem}); does it keep state on the model between calls? Training one batch at a time.")
            parallel.close()
            parallel = None
    step_fn = parallel.train_step if parallel is not None else tr.train_step

    tokens, t0, smooth, clock = 0, time.perf_counter(), None, 0.0
    for step in range(start, args.steps):
        rng = np.random.default_rng([args.seed, step])
        lr = tr.lr_schedule(step, max_lr=args.lr, min_lr=args.min_lr, warmup_steps=args.warmup,
                            total_steps=args.steps)
        x, y = tr.get_batch(train, args.batch_size, args.block_size, rng)
        tick = time.perf_counter()
        loss, _ = step_fn(model, opt, x, y, lr=lr, max_norm=args.grad_clip, rng=rng)
        clock += time.perf_counter() - tick
        tokens += x.size
        smooth = loss if smooth is None else 0.9 * smooth + 0.1 * loss
        elapsed = time.perf_counter() - t0
        if not args.quiet:
            rate = tokens / clock if clock else 0.0
            print(_bar(step + 1, args.steps, smooth, rate, (args.steps - step - 1) * elapsed / (step + 1 - start)),
                  end="", file=sys.stderr, flush=True)
        entry = {"step": step + 1, "train": smooth}
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            entry["val"] = evaluate()
            entry["val_bpb"] = bits_per_byte(entry["val"], val_bytes_per_token)
            print(f"\nstep {step + 1}: train loss {smooth:.4f}, validation loss {entry['val']:.4f} "
                  f"({entry['val_bpb']:.3f} bits per byte), {tokens / clock:,.0f} tokens/s in the training steps, "
                  f"{elapsed:.0f} s so far", flush=True)
            history.append(entry)
            _save(out, tr, model, opt, step + 1, history)
        elif (step + 1) % 10 == 0:
            history.append(entry)
    if parallel is not None:
        parallel.close()
        if not parallel.sharding:
            print("threads: your train_step does not call loss_and_grads, so the shards went unused")
    if start >= args.steps:
        print(f"nothing to train: the checkpoint is at step {start}, --steps is {args.steps}")
    else:
        print(f"trained {args.steps - start} steps in {time.perf_counter() - t0:.0f} s; checkpoint: {out}")
    print(_plot(out, history))
    model.eval()
    rng = np.random.default_rng(args.seed + 2)
    for i in range(args.samples):
        print(f"\n--- sample {i + 1} (temperature {args.temperature}, top-k {args.top_k}) ---")
        print(sample(model, tok, generation, prompt="\n", n=args.sample_tokens, temperature=args.temperature,
                     top_k=args.top_k, rng=rng).strip())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gptkit.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="labs", help="whose code: labs (yours, default), solutions, or a path")
    p.add_argument("--data", default=str(CORPUS), help="a text file (default: the kit's Shakespeare)")
    p.add_argument("--tokenizer", choices=("char", "bpe"), default="char",
                   help="characters (lab 07, default) or byte-level BPE trained with your lab 10")
    p.add_argument("--vocab-size", type=int, default=512, help="BPE's vocabulary size (default 512)")
    p.add_argument("--out", default="runs/shakespeare", help="the checkpoint folder (default runs/shakespeare)")
    p.add_argument("--resume", action="store_true", help="go on from the checkpoint in --out")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--block-size", type=int, default=64, help="context length (the model's max_seq_len)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--samples", type=int, default=2, help="samples printed at the end")
    p.add_argument("--sample-tokens", "--sample-chars", type=int, default=300,
                   help="tokens per sample (characters with --tokenizer char)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--workers", type=int, default=0,
                   help="shards of each batch run at once on threads (default: NumPy's BLAS thread count)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    return run_command("train", lambda: run(args), after_progress=True)


if __name__ == "__main__":
    sys.exit(main())
