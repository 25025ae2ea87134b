"""Turn a small GPT into an assistant that adds numbers, with *your* lab 11 (and labs 01–10):
supervised fine-tuning, then reinforcement learning from a verifiable reward (GRPO's form),
and DPO from the same fine-tuned model, each measured on held-out problems.

    uv run python -m gptkit.assistant                    # your code, the default sizes (below)
    uv run python -m gptkit.assistant --impl solutions   # the reference code
    uv run python -m gptkit.assistant --tiny             # a run of seconds: checks the plumbing only

The task is ``gptkit.arithmetic``'s: ``<|user|>What is 347+85?<|assistant|>432<|end|>``,
numbers up to 99, through a byte-level lab-10 tokenizer with the chat tokens.

1. **SFT.** A GPT (lab 04) starts from random weights and learns from ``render_chat``'s
   conversations with ``sft_loss_and_grads`` (only the answer's tokens count), lab 07's
   AdamW and clipping. It stops early on purpose (``--sft-steps``), when it is right on
   some of the held-out problems but far from all, so that RL has room.
2. **RL.** From the SFT model: each step samples ``--group`` answers to each of
   ``--prompts`` training questions (``sample_group``, lab 06's cached generation at
   temperature ``--temperature``), scores them (``reward``), normalises the rewards within
   each question's group (``group_advantages``), and takes ``--epochs`` AdamW steps on
   ``rl_loss_and_grads`` (clipped ratio to the sampling policy, k3 KL to the frozen SFT
   model).
3. **DPO.** From the same SFT model: pairs of a correct and a wrong answer sampled from it
   to the same question, and ``dpo_loss_and_grads`` against the frozen SFT model.

Accuracy is the share of the held-out problems (``gptkit.arithmetic.held_out``, never
trained on) answered exactly, greedy (temperature 0). The run prints the accuracy curves,
the time of each phase and the peak memory, and writes ``sft/``, ``rl/`` and ``dpo/`` (each
a GPT-2 checkpoint: ``model.safetensors`` and ``config.json``) with ``results.json`` to
``--out`` (default ``runs/assistant``), where ``python -m gptkit.chat`` finds the RL model.
Every random draw comes from ``--seed``: a run repeats exactly on the same machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from gptkit import arithmetic
from gptkit.command import run_command, use_impl
from gptkit.testing.layout import KIT_ROOT

OUT = KIT_ROOT / "runs" / "assistant"
MAX_NEW_TOKENS = 4  # the longest answer, 198, is three digits, then END


@dataclass(frozen=True)
class Settings:
    """Every size and rate of a run (the command line's defaults)."""

    seed: int = 0
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    max_seq_len: int = 24
    held_out: int = 400
    sft_examples: int = 0
    sft_steps: int = 600
    sft_batch: int = 32
    sft_lr: float = 3e-3
    rl_steps: int = 150
    prompts: int = 32
    group: int = 8
    temperature: float = 1.0
    epochs: int = 1
    rl_lr: float = 3e-4
    clip_eps: float = 0.2
    kl_coef: float = 0.04
    dpo_questions: int = 800
    dpo_steps: int = 40
    dpo_batch: int = 32
    dpo_lr: float = 1e-4
    beta: float = 0.2
    eval_every: int = 25


TINY = Settings(d_model=16, layers=1, heads=2, held_out=12, sft_steps=4, sft_batch=8, rl_steps=2, prompts=2,
                group=3, dpo_questions=8, dpo_steps=2, dpo_batch=4, eval_every=1)


class Labs:
    """The bound tree's modules the pipeline uses, imported once ``use_impl`` has run."""

    def __init__(self):
        import assistant
        import generation
        import gpt
        import tokenizer
        import training

        self.assistant, self.generation, self.gpt, self.training = assistant, generation, gpt, training
        self.tok = arithmetic.tokenizer(tokenizer.Tokenizer)
        self.end_id = assistant.special_id(self.tok, assistant.END)
        self._prompts: dict[arithmetic.Problem, np.ndarray] = {}
        self._chats: dict[arithmetic.Problem, tuple[np.ndarray, np.ndarray]] = {}

    def prompt(self, problem: arithmetic.Problem) -> np.ndarray:
        """``render_prompt`` of the problem's question (remembered: lab 10's encoder is slow)."""
        if problem not in self._prompts:
            self._prompts[problem] = self.assistant.render_prompt(self.tok, problem.messages(with_answer=False))
        return self._prompts[problem]

    def chat(self, problem: arithmetic.Problem) -> tuple[np.ndarray, np.ndarray]:
        """``render_chat`` of the question and its answer (remembered)."""
        if problem not in self._chats:
            self._chats[problem] = self.assistant.render_chat(self.tok, problem.messages())
        return self._chats[problem]


def new_model(labs: Labs, s: Settings):
    return labs.gpt.GPTModel(labs.tok.vocab_size, s.d_model, s.layers, s.heads, 4 * s.d_model, s.max_seq_len,
                             rng=np.random.default_rng([s.seed, 10]))


def answers(labs: Labs, model, problems, *, temperature: float = 0.0, rng=None) -> list[float]:
    """Each problem's reward for one answer of ``model`` (greedy by default), batched by
    prompt length (lab 06's ``generate`` takes prompts of one length at a time)."""
    A = labs.assistant
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(problems):
        by_length.setdefault(len(labs.prompt(p)), []).append(i)
    rewards = [0.0] * len(problems)
    for length, rows in sorted(by_length.items()):
        prompts = np.stack([labs.prompt(problems[i]) for i in rows])
        out = labs.generation.generate(model, prompts, MAX_NEW_TOKENS, temperature=temperature, rng=rng,
                                       eos_token_id=labs.end_id)
        for row, i in enumerate(rows):
            rewards[i] = A.reward(labs.tok, length, out[row], problems[i].answer)
    return rewards


def accuracy(labs: Labs, model, problems) -> float:
    return 100.0 * float(np.mean(answers(labs, model, problems)))


def _step(labs: Labs, opt, grads, lr: float) -> float:
    grads, norm = labs.training.clip_grad_norm(grads, 1.0)
    opt.lr = lr
    opt.step(grads)
    return norm


def sft(labs: Labs, s: Settings, model, held, log) -> list[tuple[int, float]]:
    """Supervised fine-tuning from scratch: ``s.sft_steps`` AdamW steps on batches drawn from
    ``s.sft_examples`` training problems (0: fresh problems every step)."""
    A, tr = labs.assistant, labs.training
    stream = arithmetic.TrainingProblems(s.seed, 1, held)
    pool = stream.draw(s.sft_examples) if s.sft_examples else None
    rng = np.random.default_rng([s.seed, 11])
    opt = tr.AdamW(model.state_dict(), lr=s.sft_lr, betas=(0.9, 0.99), weight_decay=0.0)
    curve = [(0, accuracy(labs, model, held))]
    for step in range(1, s.sft_steps + 1):
        problems = [pool[i] for i in rng.choice(len(pool), s.sft_batch)] if pool else stream.draw(s.sft_batch)
        batch = [labs.chat(p) for p in problems]
        ids, mask = A.pad_batch(batch, labs.end_id)
        loss, grads = A.sft_loss_and_grads(model, ids, mask)
        lr = s.sft_lr * min(1.0, step / 20)  # a short warm-up, then constant: SFT is cut off, not finished
        _step(labs, opt, grads, lr)
        if step % s.eval_every == 0 or step == s.sft_steps:
            curve.append((step, accuracy(labs, model, held)))
            log(f"  sft step {step:4d}  loss {float(loss):.3f}  held-out accuracy {curve[-1][1]:5.1f} %")
    return curve


def rl(labs: Labs, s: Settings, policy, reference, held, log) -> tuple[list[tuple[int, float]], list[float]]:
    """GRPO from the SFT model; returns the accuracy curve and the seconds of each step."""
    A, tr = labs.assistant, labs.training
    stream = arithmetic.TrainingProblems(s.seed, 2, held)
    rng = np.random.default_rng([s.seed, 20])
    opt = tr.AdamW(policy.state_dict(), lr=s.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)
    curve, times = [(0, accuracy(labs, policy, held))], []
    for step in range(1, s.rl_steps + 1):
        start = time.perf_counter()
        ids, mask, adv, mean_reward = rl_batch(labs, s, policy, stream.draw(s.prompts), rng)
        rl_update(labs, s, policy, reference, opt, ids, mask, adv)
        times.append(time.perf_counter() - start)
        if step % s.eval_every == 0 or step == s.rl_steps:
            curve.append((step, accuracy(labs, policy, held)))
            log(f"  rl step {step:4d}  mean reward {mean_reward:.2f}  held-out accuracy {curve[-1][1]:5.1f} %")
    return curve, times


def rl_batch(labs: Labs, s: Settings, policy, problems, rng):
    """Sample a group per problem; ``(ids, mask, advantages, mean reward)`` padded together."""
    A = labs.assistant
    groups, rewards = [], []
    for p in problems:
        prompt = labs.prompt(p)
        seqs = A.sample_group(policy, prompt, s.group, MAX_NEW_TOKENS, temperature=s.temperature, rng=rng,
                              end_id=labs.end_id)
        rewards.append([A.reward(labs.tok, len(prompt), row, p.answer) for row in seqs])
        mask = A.completion_mask(seqs, len(prompt), labs.end_id)
        groups.extend(zip(seqs, mask))
    adv = A.group_advantages(np.array(rewards, dtype=np.float32)).reshape(-1)
    ids, mask = A.pad_batch(groups, labs.end_id)
    return ids, mask, adv, float(np.mean(rewards))


def rl_update(labs: Labs, s: Settings, policy, reference, opt, ids, mask, adv) -> None:
    """``s.epochs`` AdamW steps of GRPO on one sampled batch."""
    A = labs.assistant
    logp_old = A.token_logprobs(policy, ids)  # the sampling policy, fixed for this batch
    logp_ref = A.token_logprobs(reference, ids)
    for _ in range(s.epochs):
        _, grads = A.rl_loss_and_grads(policy, ids, mask, logp_old, logp_ref, adv, clip_eps=s.clip_eps,
                                       kl_coef=s.kl_coef)
        _step(labs, opt, grads, s.rl_lr)


def dpo(labs: Labs, s: Settings, policy, reference, held, log) -> tuple[list[tuple[int, float]], int]:
    """DPO from the SFT model on (correct, wrong) pairs it samples itself; returns the
    accuracy curve and the number of pairs."""
    A, tr = labs.assistant, labs.training
    stream = arithmetic.TrainingProblems(s.seed, 3, held)
    rng = np.random.default_rng([s.seed, 30])
    chosen, rejected = [], []
    for p in stream.draw(s.dpo_questions):
        prompt = labs.prompt(p)
        seqs = A.sample_group(reference, prompt, s.group, MAX_NEW_TOKENS, temperature=s.temperature, rng=rng,
                              end_id=labs.end_id)
        good = [i for i, row in enumerate(seqs) if A.reward(labs.tok, len(prompt), row, p.answer) == 1.0]
        bad = [i for i in range(len(seqs)) if i not in good]
        if good and bad:
            mask = A.completion_mask(seqs, len(prompt), labs.end_id)
            chosen.append((seqs[good[0]], mask[good[0]]))
            rejected.append((seqs[bad[0]], mask[bad[0]]))
    log(f"  dpo: {len(chosen)} pairs (a correct and a wrong answer) from {s.dpo_questions} questions")
    curve = [(0, accuracy(labs, policy, held))]
    if not chosen:
        return curve, 0
    ids, mask = A.pad_batch(chosen + rejected, labs.end_id)
    n = len(chosen)
    ref_seq = A.sequence_logprobs(reference, ids, mask)
    opt = tr.AdamW(policy.state_dict(), lr=s.dpo_lr, betas=(0.9, 0.99), weight_decay=0.0)
    for step in range(1, s.dpo_steps + 1):
        rows = rng.choice(n, size=min(s.dpo_batch, n), replace=False)
        loss, grads = A.dpo_loss_and_grads(policy, ids[rows], mask[rows], ids[n + rows], mask[n + rows],
                                           ref_seq[rows], ref_seq[n + rows], beta=s.beta)
        _step(labs, opt, grads, s.dpo_lr)
        if step % s.eval_every == 0 or step == s.dpo_steps:
            curve.append((step, accuracy(labs, policy, held)))
            log(f"  dpo step {step:4d}  loss {float(loss):.3f}  held-out accuracy {curve[-1][1]:5.1f} %")
    return curve, n


def peak_memory_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports KiB, macOS bytes;
    NaN where the ``resource`` module is missing, as on Windows)."""
    try:
        import resource
    except ImportError:
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


def pipeline(s: Settings, out: Path | None, log=print) -> dict:
    """SFT, then RL and DPO from the SFT model; the results (and checkpoints in ``out``)."""
    labs = Labs()
    held = arithmetic.held_out(s.seed, s.held_out)
    model = new_model(labs, s)
    log(f"SFT: {s.sft_steps} steps of {s.sft_batch} problems, from random weights "
        f"({s.layers} layers, width {s.d_model}, {model.num_parameters():,} parameters)")
    t0 = time.perf_counter()
    sft_curve = sft(labs, s, model, held, log)
    sft_s = time.perf_counter() - t0
    reference = copy.deepcopy(model)  # frozen: never given to an optimizer
    if out is not None:
        labs.training.save_checkpoint(out / "sft", model)

    log(f"RL: {s.rl_steps} steps of {s.prompts} questions × {s.group} answers")
    policy = copy.deepcopy(model)
    t0 = time.perf_counter()
    rl_curve, step_times = rl(labs, s, policy, reference, held, log)
    rl_s = time.perf_counter() - t0
    if out is not None:
        labs.training.save_checkpoint(out / "rl", policy)

    log("DPO: from the same SFT model")
    dpo_policy = copy.deepcopy(model)
    t0 = time.perf_counter()
    dpo_curve, pairs = dpo(labs, s, dpo_policy, reference, held, log)
    dpo_s = time.perf_counter() - t0
    if out is not None:
        labs.training.save_checkpoint(out / "dpo", dpo_policy)

    results = {"settings": asdict(s), "held_out": len(held), "sft_accuracy": sft_curve[-1][1],
               "rl_accuracy": rl_curve[-1][1], "dpo_accuracy": dpo_curve[-1][1], "sft_curve": sft_curve,
               "rl_curve": rl_curve, "dpo_curve": dpo_curve, "dpo_pairs": pairs, "sft_seconds": sft_s,
               "rl_seconds": rl_s, "dpo_seconds": dpo_s, "rl_step_seconds": float(np.median(step_times)),
               "peak_memory_mb": peak_memory_mb()}
    if out is not None:
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return results


def report(r: dict) -> str:
    a, b, c = r["sft_accuracy"], r["rl_accuracy"], r["dpo_accuracy"]
    lines = [f"held-out accuracy (greedy, {r['held_out']} problems): SFT {a:.1f} %, RL {b:.1f} % ({b - a:+.1f} points), "
             f"DPO {c:.1f} % ({c - a:+.1f} points)",
             f"time: SFT {r['sft_seconds']:.0f} s, RL {r['rl_seconds']:.0f} s ({r['rl_step_seconds'] * 1000:.0f} ms a step), "
             f"DPO {r['dpo_seconds']:.0f} s; peak memory {r['peak_memory_mb']:.0f} MB"]
    for name in ("sft", "rl", "dpo"):
        lines.append(f"{name} curve (step: accuracy %): "
                     + ", ".join(f"{step}: {acc:.1f}" for step, acc in r[f"{name}_curve"]))
    return "\n".join(lines)


def settings_from(args) -> Settings:
    s = TINY if args.tiny else Settings()
    changes = {k: v for k, v in vars(args).items() if k in Settings.__dataclass_fields__ and v is not None}
    return replace(s, **changes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gptkit.assistant", description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="labs", help="whose code runs: labs (yours), solutions, or a path")
    p.add_argument("--out", default=str(OUT), help="where to write the models (default: runs/assistant)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: a run of seconds that checks the plumbing")
    for name, field in Settings.__dataclass_fields__.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(field.default), default=None,
                       help=f"(default {field.default}; --tiny: {getattr(TINY, name)})")
    args = p.parse_args(argv)

    def run() -> int:
        use_impl(args.impl)
        s = settings_from(args)
        out = Path(args.out)
        r = pipeline(s, out)
        print(report(r))
        print(f"wrote {out}/sft, rl, dpo; talk to the RL model: uv run python -m gptkit.chat"
              + (f" --impl {args.impl}" if args.impl != "labs" else "") + (f" --model {out}/rl" if out != OUT else ""))
        return 0

    return run_command("assistant", run, also=(ValueError,))


if __name__ == "__main__":
    sys.exit(main())
