"""Turn a small GPT into an assistant that adds numbers, with *your* lab 11 (and labs 01–10):
supervised fine-tuning on a few demonstrations, then reinforcement learning from a
verifiable reward (GRPO's form), and DPO from the same fine-tuned model with the same
budget, each measured on held-out problems.

    uv run python -m gptkit.assistant                    # your code, the default sizes (below)
    uv run python -m gptkit.assistant --impl solutions   # the reference code
    uv run python -m gptkit.assistant --quick            # smaller sizes: shows the same story sooner
    uv run python -m gptkit.assistant --tiny             # a run of seconds: checks the plumbing only

The task is ``gptkit.arithmetic``'s: additions of numbers up to 49 asked in many
phrasings built from pieces (``What is 27 + 15?``, ``27+15``, ``add 27 and 15``, ``27 plus 15``, …) and, for
anything else, one fixed sentence (``I only add numbers.``), through a byte-level
lab-10 tokenizer with the chat tokens.

1. **SFT.** A GPT (lab 04) starts from random weights and learns from ``render_chat``'s
   conversations with ``sft_loss_and_grads`` (only the answer's tokens count), lab 07's
   AdamW and clipping, on a fixed, small set of demonstrations (``--demos`` additions and
   ``--off-task-demos`` off-task questions), for ``--sft-steps`` steps. At the default
   sizes its held-out accuracy still rises slowly at the end: docs/11_assistant.md gives
   the curve's trend, and how close designs with fewer demonstrations came to a plateau.
2. **RL.** From the SFT model: each step asks ``--prompts`` fresh training additions and
   ``--rl-off-task`` off-task questions (no written answers: only the checker), samples
   ``--group`` answers to each (lab 06's cached generation at ``--temperature``, one call
   per prompt length and answer room), scores them (``reward``),
   normalises the rewards within each question's group (``group_advantages``), and takes an
   AdamW step on ``rl_loss_and_grads`` (clipped ratio to the sampling policy, k3 KL to the
   frozen SFT model) at ``--rl-lr`` after a 10-step warm-up, down a cosine to a tenth of it
   at the last step (``decay``).
3. **DPO.** From the same SFT model, with the same budget: as many answers sampled from
   the SFT model (to as many fresh questions) as RL samples in all, paired into (right,
   wrong) answers to the same question, and as many AdamW steps on
   ``dpo_loss_and_grads`` as RL takes, each on as many sequences as an RL step.

Accuracy is the share of the held-out problems (``gptkit.arithmetic.held_out``, never
trained on, asked in every phrasing, the held-out phrasings included) answered exactly,
greedy (temperature 0); off-task is the share of held-out off-task questions answered with
the fixed sentence. The run prints a progress line at least every ``PROGRESS_S`` seconds
(stage, step, reward or accuracy, elapsed time, an estimate of the time left), then the
curves, per-phrasing accuracies, the time of each phase and the peak memory, and writes
``sft/``, ``rl/`` and ``dpo/`` (each a GPT-2 checkpoint: ``model.safetensors`` and
``config.json``) with ``results.json`` to ``--out`` (default ``runs/assistant``), where
``python -m gptkit.chat`` finds the RL model. Every random draw comes from ``--seed``: a
run repeats exactly on the same machine with the same BLAS thread count.
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from gptkit import arithmetic
from gptkit.command import run_command, use_impl
from gptkit.testing.layout import KIT_ROOT

OUT = KIT_ROOT / "runs" / "assistant"
MAX_NEW_TOKENS = 4  # room for a three-digit sum (numbers up to 99 with --max-operand), then END
PROGRESS_S = 20.0  # the longest quiet spell between progress lines (plus one step or evaluation)


@dataclass(frozen=True)
class Settings:
    """Every size and rate of a run (the command line's defaults)."""

    seed: int = 0
    max_operand: int = arithmetic.MAX_OPERAND
    d_model: int = 64
    layers: int = 4
    heads: int = 4
    max_seq_len: int = 64
    held_out: int = 270
    off_task_held_out: int = 60
    demos: int = 1000
    off_task_demos: int = 300
    sft_steps: int = 3000
    sft_batch: int = 64
    sft_lr: float = 3e-3
    rl_steps: int = 500
    prompts: int = 32
    rl_off_task: int = 8
    group: int = 8
    temperature: float = 1.0
    rl_lr: float = 1e-3
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    dpo_lr: float = 1e-4
    beta: float = 0.1
    eval_every: int = 100


QUICK = replace(Settings(), sft_steps=800, rl_steps=60, held_out=180, eval_every=100)
TINY = Settings(d_model=16, layers=1, heads=2, held_out=18, off_task_held_out=4, demos=16, off_task_demos=4,
                sft_steps=4, sft_batch=8, rl_steps=2, prompts=2, rl_off_task=1, group=3, eval_every=1)


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
        self._prompts: dict = {}
        self._chats: dict = {}

    def prompt(self, problem) -> np.ndarray:
        """``render_prompt`` of the problem's question (remembered: lab 10's encoder is slow)."""
        if problem not in self._prompts:
            self._prompts[problem] = self.assistant.render_prompt(self.tok, problem.messages(with_answer=False))
        return self._prompts[problem]

    def chat(self, problem) -> tuple[np.ndarray, np.ndarray]:
        """``render_chat`` of the question and its answer (remembered)."""
        if problem not in self._chats:
            self._chats[problem] = self.assistant.render_chat(self.tok, problem.messages())
        return self._chats[problem]


class Progress:
    """Progress lines for one stage: ``stage step/total  what  elapsed  ETA``, printed when
    asked (``force``) or when ``PROGRESS_S`` seconds have passed since the last one."""

    def __init__(self, log, stage: str, total: int, start: float):
        self.log, self.stage, self.total, self.start = log, stage, total, start
        self.t0 = self.last = time.perf_counter()

    def __call__(self, step: int, what: str, force: bool = False) -> None:
        now = time.perf_counter()  # when this step ended
        if not force and now - self.last < PROGRESS_S:
            return
        self.last = now
        eta = (now - self.t0) / max(step, 1) * (self.total - step)
        self.log(f"  [{self.stage} {step:4d}/{self.total}]  {what}  elapsed {_clock(now - self.start)}  "
                 f"{self.stage} ETA {_clock(eta)}")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def new_model(labs: Labs, s: Settings):
    return labs.gpt.GPTModel(labs.tok.vocab_size, s.d_model, s.layers, s.heads, 4 * s.d_model, s.max_seq_len,
                             rng=np.random.default_rng([s.seed, 10]))


def room(labs: Labs, problem) -> int:
    """The most tokens an answer to ``problem`` may take: ``MAX_NEW_TOKENS`` for an addition,
    the fixed sentence and its ``<|end|>`` for an off-task question."""
    return MAX_NEW_TOKENS if isinstance(problem, arithmetic.Problem) else len(labs.tok.encode(arithmetic.REFUSAL)) + 1


def generate_all(labs: Labs, model, problems, copies: int, *, temperature: float = 0.0, rng=None):
    """``copies`` answers to each problem (at most ``room`` tokens each), as sequences in
    problem order (``copies`` rows per problem): lab 06's ``generate`` once per prompt length
    and room (it takes prompts of one length at a time), ``<|end|>`` as the end token."""
    by_length: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(problems):
        by_length.setdefault((len(labs.prompt(p)), room(labs, p)), []).append(i)
    rows: list = [None] * len(problems)
    for (_, max_new), members in sorted(by_length.items()):
        prompts = np.repeat(np.stack([labs.prompt(problems[i]) for i in members]), copies, axis=0)
        out = labs.generation.generate(model, prompts, max_new, temperature=temperature, rng=rng,
                                       eos_token_id=labs.end_id)
        for k, i in enumerate(members):
            rows[i] = out[k * copies:(k + 1) * copies]
    return rows


def answers(labs: Labs, model, problems) -> list[float]:
    """Each problem's reward for the greedy answer of ``model``."""
    A = labs.assistant
    rows = generate_all(labs, model, problems, 1)
    return [A.reward(labs.tok, len(labs.prompt(p)), seqs[0], p.answer) for p, seqs in zip(problems, rows)]


def accuracy(labs: Labs, model, problems) -> float:
    return 100.0 * float(np.mean(answers(labs, model, problems)))


def evaluate(labs: Labs, model, held, off) -> dict:
    """Held-out accuracy overall and per phrasing, and the off-task share, greedy."""
    right = answers(labs, model, held)
    per = {ph: 100.0 * float(np.mean([r for p, r in zip(held, right) if p.phrasing == ph]))
           for ph in arithmetic.PHRASINGS if any(p.phrasing == ph for p in held)}
    unseen = [r for p, r in zip(held, right) if p.phrasing in arithmetic.HELD_OUT_PHRASINGS]
    refusal = answers(labs, model, off)
    return {"accuracy": 100.0 * float(np.mean(right)), "phrasings": per,
            "held_out_phrasings": 100.0 * float(np.mean(unseen)) if unseen else float("nan"),
            "off_task": 100.0 * float(np.mean(refusal))}


def decay(step: int, total: int, warmup: int = 10) -> float:
    """The learning rate's factor at ``step`` (1 … total): a linear warm-up over ``warmup``
    steps, then a cosine from 1 down to 0.1 at the last step."""
    if step <= warmup:
        return step / warmup
    return 0.1 + 0.45 * (1.0 + np.cos(np.pi * (step - warmup) / max(1, total - warmup)))


def _step(labs: Labs, opt, grads, lr: float) -> float:
    grads, norm = labs.training.clip_grad_norm(grads, 1.0)
    opt.lr = lr
    opt.step(grads)
    return norm


def length_buckets(lengths) -> list[tuple[np.ndarray, int]]:
    """The rows of a right-padded batch in at most two groups by length, ``(rows, T)`` each
    (every row of the group ends by ``T``), cut where the fewest padded positions remain, if
    that saves a quarter of them.

    A batch is padded to its longest row, and the model's cost grows with the padded
    positions: an off-task question with the sentence is about twice as long as an
    addition with its sum, so one batch of both spends most of its work on padding. Since
    the model is causal and the padding comes last, ``ids[rows, :T]`` gives every kept
    position the logits it had in the whole batch (up to float rounding: the products
    have other shapes)."""
    lengths = np.asarray(lengths)
    order = np.argsort(lengths, kind="stable")
    ends = lengths[order]  # (B,) ascending
    B = len(ends)
    cost = [B * ends[-1]] + [k * ends[k - 1] + (B - k) * ends[-1] for k in range(1, B)]
    k = int(np.argmin(cost))  # 0: one group
    if k == 0 or 4 * cost[k] > 3 * cost[0]:  # a second call has its own cost: cut only to save a quarter
        return [(order, int(ends[-1]))]
    return [(order[:k], int(ends[k - 1])), (order[k:], int(ends[-1]))]


def row_ends(mask: np.ndarray) -> np.ndarray:
    """One past each row's last True (at least 2: a row of logprobs needs two tokens)."""
    T = mask.shape[1]
    return np.maximum(T - np.argmax(mask[:, ::-1], axis=1), 2)


def _weighted(parts) -> tuple[float, dict]:
    """Σ w·loss and Σ w·grads over ``(w, loss, grads)`` parts: the whole batch's mean loss and
    gradient from its groups' means, each weighted by its share of what the mean counts."""
    loss, grads = 0.0, {}
    for w, part_loss, part_grads in parts:
        loss += w * float(part_loss)
        for name, g in part_grads.items():
            grads[name] = grads[name] + np.float32(w) * g if name in grads else np.float32(w) * g
    return loss, grads


def sft_loss_and_grads(labs: Labs, model, ids, mask):
    """Lab 11's ``sft_loss_and_grads`` on a padded batch, run on its ``length_buckets``: the
    same mean over the counted tokens, with less padding."""
    groups = length_buckets(row_ends(mask))
    counted = mask[:, 1:].sum()
    return _weighted((mask[rows, 1:T].sum() / counted,
                      *labs.assistant.sft_loss_and_grads(model, ids[rows, :T], mask[rows, :T])) for rows, T in groups)


def demonstrations(s: Settings, held) -> list:
    """The SFT set: ``s.demos`` additions (training phrasings) and ``s.off_task_demos``
    off-task questions, fixed for the run."""
    pool: list = arithmetic.TrainingProblems(s.seed, 1, held, s.max_operand).draw(s.demos)
    pool += arithmetic.off_task(np.random.default_rng([s.seed, 4]), s.off_task_demos)
    return pool


def sft(labs: Labs, s: Settings, model, held, log, start) -> list[tuple[int, float]]:
    """Supervised fine-tuning from scratch: ``s.sft_steps`` AdamW steps on batches drawn from
    the fixed demonstrations."""
    A, tr = labs.assistant, labs.training
    pool = demonstrations(s, held)
    rng = np.random.default_rng([s.seed, 11])
    opt = tr.AdamW(model.state_dict(), lr=s.sft_lr, betas=(0.9, 0.99), weight_decay=0.0)
    curve = [(0, accuracy(labs, model, held))]
    progress = Progress(log, "sft", s.sft_steps, start)
    loss = float("nan")
    for step in range(1, s.sft_steps + 1):
        batch = [labs.chat(pool[i]) for i in rng.choice(len(pool), s.sft_batch)]
        ids, mask = A.pad_batch(batch, labs.end_id)
        loss, grads = sft_loss_and_grads(labs, model, ids, mask)
        _step(labs, opt, grads, s.sft_lr * min(1.0, step / 20))  # a short warm-up, then constant
        if step % s.eval_every == 0 or step == s.sft_steps:
            curve.append((step, accuracy(labs, model, held)))
            progress(step, f"loss {float(loss):.3f}  held-out accuracy {curve[-1][1]:5.1f} %", force=True)
        else:
            progress(step, f"loss {float(loss):.3f}")
    return curve


def dpo_loss_and_grads(labs: Labs, model, chosen_ids, chosen_mask, rejected_ids, rejected_mask, ref_chosen,
                       ref_rejected, *, beta: float):
    """Lab 11's ``dpo_loss_and_grads`` on pairs, run on the pairs' ``length_buckets`` (a pair
    as long as its longer answer): the same mean over pairs, with less padding."""
    ends = np.maximum(row_ends(chosen_mask), row_ends(rejected_mask))
    return _weighted((len(rows) / len(ends), *labs.assistant.dpo_loss_and_grads(
        model, chosen_ids[rows, :T], chosen_mask[rows, :T], rejected_ids[rows, :T], rejected_mask[rows, :T],
        ref_chosen[rows], ref_rejected[rows], beta=beta)) for rows, T in length_buckets(ends))


def rl(labs: Labs, s: Settings, policy, reference, held, log, start):
    """GRPO from the SFT model; returns the accuracy curve, the mean reward of each step and
    the seconds of each step."""
    stream = arithmetic.TrainingProblems(s.seed, 2, held, s.max_operand)
    off_rng = np.random.default_rng([s.seed, 2, 2])
    rng = np.random.default_rng([s.seed, 20])
    opt = labs.training.AdamW(policy.state_dict(), lr=s.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)
    curve, rewards, times = [(0, accuracy(labs, policy, held))], [], []
    progress = Progress(log, "rl", s.rl_steps, start)
    for step in range(1, s.rl_steps + 1):
        t0 = time.perf_counter()
        questions = stream.draw(s.prompts) + arithmetic.off_task(off_rng, s.rl_off_task)
        ids, mask, adv, mean_reward = rl_batch(labs, s, policy, questions, rng)
        rl_update(labs, s, policy, reference, opt, ids, mask, adv, s.rl_lr * decay(step, s.rl_steps))
        times.append(time.perf_counter() - t0)
        rewards.append(mean_reward)
        recent = float(np.mean(rewards[-10:]))
        if step % s.eval_every == 0 or step == s.rl_steps:
            curve.append((step, accuracy(labs, policy, held)))
            progress(step, f"mean reward {recent:.2f}  held-out accuracy {curve[-1][1]:5.1f} %", force=True)
        else:
            progress(step, f"mean reward {recent:.2f}")
    return curve, rewards, times


def sample_groups(labs: Labs, s: Settings, model, problems, rng):
    """A group of ``s.group`` sampled answers per problem: the (P·G, S) sequences padded
    together with their answer masks, and the (P, G) rewards."""
    A = labs.assistant
    groups, rewards = [], []
    for p, seqs in zip(problems, generate_all(labs, model, problems, s.group, temperature=s.temperature, rng=rng)):
        n = len(labs.prompt(p))
        rewards.append([A.reward(labs.tok, n, row, p.answer) for row in seqs])
        groups.extend(zip(seqs, A.completion_mask(seqs, n, labs.end_id)))
    return groups, np.array(rewards, dtype=np.float32)


def rl_batch(labs: Labs, s: Settings, policy, problems, rng):
    """Sample a group per problem; ``(ids, mask, advantages, mean reward)`` padded together."""
    A = labs.assistant
    groups, rewards = sample_groups(labs, s, policy, problems, rng)
    adv = A.group_advantages(rewards).reshape(-1)
    ids, mask = A.pad_batch(groups, labs.end_id)
    return ids, mask, adv, float(rewards.mean())


def rl_update(labs: Labs, s: Settings, policy, reference, opt, ids, mask, adv, lr: float) -> None:
    """One AdamW step of GRPO on one sampled batch.

    Without the KL term (``kl_coef`` 0), a row whose advantage is 0 (its question's group
    all right or all wrong) adds exactly nothing to the gradient, so only the other rows
    run, in their ``length_buckets``; each part is weighted by its share of the whole
    batch's answer tokens, which the loss's mean counts. The step is the whole batch's."""
    A = labs.assistant
    scored = mask[:, 1:].sum()
    live = np.flatnonzero(adv != 0) if s.kl_coef == 0 else np.arange(len(adv))
    parts = []
    for group, T in length_buckets(row_ends(mask[live])) if len(live) else []:
        rows = live[group]
        g_ids, g_mask = ids[rows, :T], mask[rows, :T]  # each group padded only to its own longest row
        logp_old = A.token_logprobs(policy, g_ids)  # the sampling policy, fixed for this batch
        logp_ref = A.token_logprobs(reference, g_ids) if s.kl_coef > 0 else logp_old
        parts.append((g_mask[:, 1:].sum() / scored,
                      *A.rl_loss_and_grads(policy, g_ids, g_mask, logp_old, logp_ref, adv[rows], clip_eps=s.clip_eps,
                                           kl_coef=s.kl_coef)))
    if parts:
        _, grads = _weighted(parts)
    else:  # nothing to learn from: a zero gradient (AdamW's moments still carry the step)
        grads = {name: np.zeros_like(value) for name, value in policy.state_dict().items()}
    _step(labs, opt, grads, lr)


def dpo(labs: Labs, s: Settings, policy, reference, held, log, start):
    """DPO from the SFT model with RL's budget: ``s.rl_steps · (s.prompts + s.rl_off_task)``
    fresh questions (additions and off-task, as RL asks them), ``s.group`` answers sampled
    from the SFT model to each; each question's right and wrong answers paired off;
    ``s.rl_steps`` AdamW steps of ``s.prompts · s.group / 2`` pairs (as many sequences as
    an RL step samples for its additions). Returns the curve and the number of pairs."""
    A, tr = labs.assistant, labs.training
    stream = arithmetic.TrainingProblems(s.seed, 3, held, s.max_operand)
    off_rng = np.random.default_rng([s.seed, 3, 2])
    rng = np.random.default_rng([s.seed, 30])
    chosen, rejected = [], []
    progress = Progress(log, "dpo-sampling", s.rl_steps, start)
    for step in range(1, s.rl_steps + 1):
        questions = stream.draw(s.prompts) + arithmetic.off_task(off_rng, s.rl_off_task)
        groups, rewards = sample_groups(labs, s, reference, questions, rng)
        for q, r in enumerate(rewards):
            good = [groups[q * s.group + i] for i in np.flatnonzero(r == 1.0)]
            bad = [groups[q * s.group + i] for i in np.flatnonzero(r != 1.0)]
            chosen += good[:len(bad)]
            rejected += bad[:len(good)]
        progress(step, f"{len(chosen)} pairs", force=step == s.rl_steps)
    curve = [(0, accuracy(labs, policy, held))]
    if not chosen:
        log("  dpo: no pairs (no question got both a right and a wrong answer)")
        return curve, 0
    ids, mask = A.pad_batch(chosen + rejected, labs.end_id)
    n = len(chosen)
    ends = row_ends(mask)
    ref_seq = np.empty(len(ids), dtype=np.float32)
    by_length = np.argsort(ends, kind="stable")
    for i in range(0, len(ids), 1024):  # 1,024 rows of like length at a time, each padded to its longest
        rows = by_length[i:i + 1024]
        T = int(ends[rows].max())
        ref_seq[rows] = A.sequence_logprobs(reference, ids[rows, :T], mask[rows, :T])
    opt = tr.AdamW(policy.state_dict(), lr=s.dpo_lr, betas=(0.9, 0.99), weight_decay=0.0)
    batch = max(1, s.prompts * s.group // 2)
    progress = Progress(log, "dpo", s.rl_steps, start)
    for step in range(1, s.rl_steps + 1):
        rows = rng.choice(n, size=min(batch, n), replace=False)
        loss, grads = dpo_loss_and_grads(labs, policy, ids[rows], mask[rows], ids[n + rows], mask[n + rows],
                                         ref_seq[rows], ref_seq[n + rows], beta=s.beta)
        _step(labs, opt, grads, s.dpo_lr)
        if step % s.eval_every == 0 or step == s.rl_steps:
            curve.append((step, accuracy(labs, policy, held)))
            progress(step, f"loss {float(loss):.3f}  held-out accuracy {curve[-1][1]:5.1f} %", force=True)
        else:
            progress(step, f"loss {float(loss):.3f}")
    return curve, n


def _megabytes(maxrss: int) -> float:
    """``ru_maxrss`` in MB: Linux reports KiB, macOS bytes."""
    return maxrss / 1e6 if sys.platform == "darwin" else maxrss * 1024 / 1e6


def peak_memory_mb() -> float:
    """This process's peak resident memory so far, in MB (NaN where the ``resource``
    module is missing, as on Windows)."""
    try:
        import resource
    except ImportError:
        return float("nan")
    return _megabytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _dpo_stage(labs: Labs, s: Settings, model, held, off, log, start) -> dict:
    """DPO from the SFT ``model`` (left unchanged): its curve, pairs, seconds, evaluation
    and tuned model."""
    log(f"DPO: from the same SFT model, {s.rl_steps * (s.prompts + s.rl_off_task) * s.group:,} sampled answers and "
        f"{s.rl_steps} steps (RL's budget)")
    policy = copy.deepcopy(model)
    t0 = time.perf_counter()
    curve, pairs = dpo(labs, s, policy, model, held, log, start)
    seconds = time.perf_counter() - t0
    return {"curve": curve, "pairs": pairs, "seconds": seconds, "eval": evaluate(labs, policy, held, off),
            "model": policy}


def _dpo_child(tree: str, blob: bytes, s: Settings, started: float, conn) -> None:
    """``_dpo_stage`` in a process of its own: lines and the result go back through ``conn``
    (``("log", line)``, then ``("done", result)`` or ``("error", exception, traceback)``)."""
    import traceback

    from gptkit.command import keep_freed_memory
    from gptkit.testing.layout import bind_tree

    keep_freed_memory()
    try:
        bind_tree(Path(tree))
        labs = Labs()
        model = pickle.loads(blob)
        held = arithmetic.held_out(s.seed, s.held_out, top=s.max_operand)
        off = arithmetic.held_out_off_task(s.seed, s.off_task_held_out)
        start = time.perf_counter() - (time.time() - started)  # the pipeline's start, on this process's clock
        result = _dpo_stage(labs, s, model, held, off, lambda line: conn.send(("log", line)), start)
        result["model"] = pickle.dumps(result["model"])
        conn.send(("done", result))
    except BaseException as exc:  # noqa: BLE001 (everything goes back to the pipeline, which raises it)
        try:
            conn.send(("error", exc, traceback.format_exc()))
        except Exception:  # noqa: BLE001 (an exception that does not pickle)
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}"), traceback.format_exc()))
    finally:
        conn.close()


class SideBySide:
    """DPO in a second process while this one runs RL: both start from the SFT model and are
    independent, so on two cores they take about the time of the longer one, not the sum.
    Each gets half of this process's BLAS threads (at least one), so the two do not fight
    over cores. ``result()`` waits for DPO and raises what it raised."""

    def __init__(self, labs: Labs, s: Settings, model, log, start: float):
        import multiprocessing
        import os
        import threading

        from gptkit.parallel import blas_threads

        self.threads = max(1, blas_threads() // 2)
        ctx = multiprocessing.get_context("spawn")  # the same on Linux, macOS and Windows; no forked BLAS state
        receive, send = ctx.Pipe(duplex=False)
        tree = str(Path(labs.assistant.__file__).resolve().parents[1])  # the tree use_impl bound
        names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update({name: str(self.threads) for name in names})  # read by the child's NumPy as it loads
        try:
            self.process = ctx.Process(target=_dpo_child, daemon=True, name="gptkit-dpo",
                                       args=(tree, pickle.dumps(model), s, time.time() - (time.perf_counter() - start),
                                             send))
            self.process.start()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        send.close()
        self.message = None

        def relay():  # the child's progress lines, as they come
            try:
                while True:
                    message = receive.recv()
                    if message[0] != "log":
                        self.message = message
                        return
                    log(message[1])
            except EOFError:
                return

        self.reader = threading.Thread(target=relay, daemon=True)
        self.reader.start()

    def result(self) -> dict:
        self.reader.join()
        self.process.join()
        if self.message is None:
            raise RuntimeError(f"the DPO process ended without a result (exit code {self.process.exitcode})")
        if self.message[0] == "error":
            raise self.message[1]
        result = self.message[1]
        result["model"] = pickle.loads(result["model"])
        return result


def _children_usage() -> tuple[float, float]:
    """CPU seconds and peak resident MB of this process's finished children (0 where the
    ``resource`` module is missing)."""
    try:
        import resource
    except ImportError:
        return 0.0, 0.0
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime, _megabytes(use.ru_maxrss)


def pipeline(s: Settings, out: Path | None, log=print, stages=("rl", "dpo"), side_by_side: bool | None = None) -> dict:
    """SFT, then RL and DPO from the SFT model; the results (and checkpoints in ``out``).

    ``side_by_side``: DPO in a second process while RL runs (``SideBySide``); by default
    when both stages run and the machine has two cores or more."""
    import os

    start, cpu = time.perf_counter(), time.process_time()
    children_cpu = _children_usage()[0]
    labs = Labs()
    held = arithmetic.held_out(s.seed, s.held_out, top=s.max_operand)
    off = arithmetic.held_out_off_task(s.seed, s.off_task_held_out)
    model = new_model(labs, s)
    log(f"SFT: {s.sft_steps} steps of {s.sft_batch} from {s.demos} additions and {s.off_task_demos} off-task "
        f"demonstrations, from random weights ({s.layers} layers, width {s.d_model}, "
        f"{model.num_parameters():,} parameters)")
    t0 = time.perf_counter()
    curves, evals, seconds = {}, {}, {}
    curves["sft"] = sft(labs, s, model, held, log, start)
    seconds["sft"] = time.perf_counter() - t0
    evals["sft"] = evaluate(labs, model, held, off)
    reference = copy.deepcopy(model)  # frozen: never given to an optimizer
    if out is not None:
        labs.training.save_checkpoint(out / "sft", model)
    step_times, rewards, pairs = [float("nan")], [], 0
    if side_by_side is None:
        side_by_side = "rl" in stages and "dpo" in stages and (os.cpu_count() or 1) >= 2
    side = None
    if side_by_side and "dpo" in stages:
        try:
            side = SideBySide(labs, s, reference, log, start)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # a model that does not pickle
            log(f"DPO runs after RL in this process: the SFT model could not be sent to a second one ({exc})")
    if side is not None:
        log(f"DPO runs in a second process beside RL ({side.threads} BLAS thread{'s' if side.threads > 1 else ''} "
            f"each)")

    if "rl" in stages:
        from threadpoolctl import threadpool_limits

        log(f"RL: {s.rl_steps} steps of {s.prompts} fresh additions and {s.rl_off_task} off-task questions × "
            f"{s.group} sampled answers")
        policy = copy.deepcopy(model)
        t0 = time.perf_counter()
        with threadpool_limits(side.threads if side is not None else None, user_api="blas"):
            curves["rl"], rewards, step_times = rl(labs, s, policy, reference, held, log, start)
        seconds["rl"] = time.perf_counter() - t0
        evals["rl"] = evaluate(labs, policy, held, off)
        if out is not None:
            labs.training.save_checkpoint(out / "rl", policy)

    if "dpo" in stages:
        d = side.result() if side is not None else _dpo_stage(labs, s, reference, held, off, log, start)
        curves["dpo"], pairs, seconds["dpo"], evals["dpo"] = d["curve"], d["pairs"], d["seconds"], d["eval"]
        if out is not None:
            labs.training.save_checkpoint(out / "dpo", d["model"])

    results = {"settings": asdict(s), "held_out": len(held), "off_task_held_out": len(off),
               "held_out_phrasings": list(arithmetic.HELD_OUT_PHRASINGS), "dpo_pairs": pairs,
               "rl_rewards": rewards, "rl_step_seconds": float(np.median(step_times)),
               "seconds": seconds, "total_seconds": time.perf_counter() - start,
               "cpu_seconds": time.process_time() - cpu + _children_usage()[0] - children_cpu,
               "peak_memory_mb": max(peak_memory_mb(), _children_usage()[1]), "side_by_side": side is not None}
    for name in curves:
        results[f"{name}_curve"] = curves[name]
        results[name] = evals[name]
        results[f"{name}_accuracy"] = evals[name]["accuracy"]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return results


def report(r: dict) -> str:
    a = r["sft_accuracy"]
    names = [n for n in ("sft", "rl", "dpo") if n in r]
    lines = [f"held-out accuracy (greedy, {r['held_out']} problems): "
             + ", ".join(f"{n.upper()} {r[n]['accuracy']:.1f} %" + (f" ({r[n]['accuracy'] - a:+.1f} points)"
                                                                    if n != "sft" else "") for n in names)]
    for n in names:
        e = r[n]
        lines.append(f"{n}: held-out phrasings {e['held_out_phrasings']:.1f} %, off-task answered with the sentence "
                     f"{e['off_task']:.1f} % ({r['off_task_held_out']} questions); per phrasing: "
                     + ", ".join(f"{ph!r} {acc:.0f} %" for ph, acc in e["phrasings"].items()))
    sec = r["seconds"]
    lines.append("time: " + ", ".join(f"{n.upper()} {sec[n]:.0f} s" for n in names)
                 + f" (RL {r['rl_step_seconds'] * 1000:.0f} ms a step), total {r['total_seconds']:.0f} s; "
                 f"peak memory {r['peak_memory_mb']:.0f} MB" + (f"; DPO pairs {r['dpo_pairs']}" if "dpo" in r else ""))
    for n in names:
        lines.append(f"{n} curve (step: accuracy %): " + ", ".join(f"{st}: {acc:.1f}" for st, acc in r[f"{n}_curve"]))
    return "\n".join(lines)


def settings_from(args) -> Settings:
    s = TINY if args.tiny else QUICK if args.quick else Settings()
    changes = {k: v for k, v in vars(args).items() if k in Settings.__dataclass_fields__ and v is not None}
    return replace(s, **changes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gptkit.assistant", description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="labs", help="whose code runs: labs (yours), solutions, or a path")
    p.add_argument("--out", default=str(OUT), help="where to write the models (default: runs/assistant)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes: the same story in less time")
    size.add_argument("--tiny", action="store_true", help="tiny sizes: a run of seconds that checks the plumbing")
    p.add_argument("--only", choices=("rl", "dpo"), default=None, help="run SFT and this stage only")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="run DPO after RL in this process (default: beside RL, in a second process, on 2+ cores)")
    for name, field in Settings.__dataclass_fields__.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(field.default), default=None,
                       help=f"(default {field.default}; --quick: {getattr(QUICK, name)}; --tiny: {getattr(TINY, name)})")
    args = p.parse_args(argv)

    def run() -> int:
        use_impl(args.impl)
        s = settings_from(args)
        out = Path(args.out)
        r = pipeline(s, out, log=lambda line: print(line, flush=True),
                     stages=(args.only,) if args.only else ("rl", "dpo"),
                     side_by_side=False if args.one_at_a_time else None)
        print(report(r))
        print(f"wrote {out}/sft, rl, dpo; talk to the RL model: uv run python -m gptkit.chat"
              + (f" --impl {args.impl}" if args.impl != "labs" else "") + (f" --model {out}/rl" if out != OUT else ""))
        return 0

    return run_command("assistant", run, also=(ValueError,))


if __name__ == "__main__":
    sys.exit(main())
