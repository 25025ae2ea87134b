"""Training: the reference NumPy code of lab 07 against the same model trained by PyTorch
CPU eager (HuggingFace GPT2LMHeadModel), in one run, on the same thread count.

    uv run --extra torch python benchmarks/bench_training.py [--threads N] [--steps 2000]

The configuration is the classic small character-level one: 4 layers, 4 heads, width 128,
context 64, batch 12, on the kit's Shakespeare; lr 1e-3 with 100 warm-up steps and a
cosine decay to 1e-4, AdamW (betas 0.9/0.99, weight decay 0.1), clipping at 1.0, no
dropout. Both start from the same weights and see the same batches (drawn by lab 07's
``get_batch`` from a generator seeded with (seed, step)); PyTorch's dropout is set to 0.

With more than one thread NumPy trains twice: lab 07's ``train_step`` as it is (BLAS on
N threads, everything else on one core), and the kit trainer's data-parallel step
(``gptkit.parallel``: the batch's rows in N shards on N threads, one BLAS thread each),
each from the same start. The contestants alternate in chunks of ``--eval-every`` steps,
each chunk after ``common.PAUSE`` of idle, so a change in the machine's load falls on all.
Tokens/s counts the training steps alone (forward, backward, clipping, optimizer), not
batch drawing or evaluation. Every ``--eval-every`` steps each contestant reports its
validation loss on the same fixed validation batches.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (sets the BLAS threads before NumPy loads)

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(THREADS)
    common.use_reference_solutions()
    import gpt
    import training as tr

    from gptkit.checkpoints import GPT2Shape, hf_model
    from gptkit.parallel import DataParallel

    text = (common.ROOT / "labs" / "07_training" / "data" / "shakespeare.txt").read_text()
    tok = tr.CharTokenizer(text)
    train, val = tr.train_val_split(tok.encode(text), 0.1)
    B, T, steps = 12, 64, args.steps
    shape = GPT2Shape(vocab_size=tok.vocab_size, d_model=128, num_layers=4, num_heads=4, max_seq_len=T)
    model = gpt.GPTModel(**shape.model_kwargs(), rng=np.random.default_rng(args.seed)).train()
    hf = hf_model({k: v.copy() for k, v in model.state_dict().items()}, shape).train()
    for module in hf.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    opt_kw = dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    opt = tr.AdamW(model, **opt_kw)
    contestants = [("NumPy", model, opt, tr.train_step)]
    if THREADS > 1:
        sharded = gpt.GPTModel(**shape.model_kwargs(), rng=np.random.default_rng(args.seed)).train()
        contestants.append(("NumPy shards", sharded, tr.AdamW(sharded, **opt_kw),
                            DataParallel(tr, THREADS).train_step))
    topt = torch.optim.AdamW(hf.parameters(), **opt_kw, eps=1e-8)

    def schedule(step):
        return tr.lr_schedule(step, max_lr=1e-3, min_lr=1e-4, warmup_steps=100, total_steps=steps)

    def batch(step):
        return tr.get_batch(train, B, T, np.random.default_rng([args.seed, step]))

    def numpy_steps(lo, hi, model, opt, train_step):
        spent = 0.0
        for step in range(lo, hi):
            x, y = batch(step)
            t0 = time.perf_counter()
            train_step(model, opt, x, y, lr=schedule(step), max_norm=1.0)
            spent += time.perf_counter() - t0
        return spent

    def torch_steps(lo, hi):
        spent = 0.0
        for step in range(lo, hi):
            x, y = (torch.from_numpy(a) for a in batch(step))
            t0 = time.perf_counter()
            for group in topt.param_groups:
                group["lr"] = schedule(step)
            topt.zero_grad(set_to_none=True)
            logits = hf(x).logits
            F.cross_entropy(logits.reshape(-1, shape.vocab_size), y.reshape(-1)).backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
            topt.step()
            spent += time.perf_counter() - t0
        return spent

    def val_losses():
        ours = [tr.estimate_loss(m, val, batch_size=B, block_size=T, iters=args.eval_iters,
                                 rng=np.random.default_rng(args.seed + 1)) for _, m, _, _ in contestants]
        rng, total = np.random.default_rng(args.seed + 1), 0.0
        hf.eval()
        with torch.no_grad():
            for _ in range(args.eval_iters):
                x, y = tr.get_batch(val, B, T, rng)
                logits = hf(torch.from_numpy(x)).logits
                total += F.cross_entropy(logits.reshape(-1, shape.vocab_size), torch.from_numpy(y).reshape(-1)).item()
        hf.train()
        return ours + [total / args.eval_iters]

    common.print_machine(THREADS)
    print(f"model: {shape.num_layers} layers, {shape.num_heads} heads, width {shape.d_model}, context {T}, "
          f"batch {B}: {model.num_parameters() / 1e6:.2f}M parameters; {steps} steps")
    print()
    names = [name for name, *_ in contestants] + ["PyTorch"]
    header = ["step"] + [f"{n} val loss" for n in names] + [f"{n} tokens/s" for n in names]
    common.print_row(header)
    common.print_row(["---"] * len(header))
    spent = [0.0] * len(names)
    done = 0
    while done < steps:
        nxt = min(done + args.eval_every, steps)
        chunk_s = []
        for _, m, o, step_fn in contestants:
            time.sleep(common.PAUSE)
            chunk_s.append(numpy_steps(done, nxt, m, o, step_fn))
        time.sleep(common.PAUSE)
        chunk_s.append(torch_steps(done, nxt))
        spent = [a + b for a, b in zip(spent, chunk_s)]
        tokens = B * T * (nxt - done)
        done = nxt
        common.print_row([done] + [f"{v:.4f}" for v in val_losses()] + [f"{tokens / t:,.0f}" for t in chunk_s])
    total = B * T * steps
    common.print_row([f"all {steps} steps"] + [""] * len(names) + [f"{total / t:,.0f} ({t:.0f} s)" for t in spent])
    print()
    for n, t in zip(names[:-1], spent[:-1]):
        print(f"- {n} ÷ PyTorch time: {t / spent[-1]:.2f}")
    print()
    best = min(spent[:-1])
    common.print_summary(f"training the character-level GPT of lab 07 takes {best / spent[-1]:.2f}× PyTorch's time "
                         f"({common.threads(THREADS)}, the faster NumPy step)")

if __name__ == "__main__":
    main()
