"""The assistant (lab 11): the pipeline's figures over several seeds and BLAS thread
counts, each as a mean and a range, and the time of one RL step in NumPy against the same
step in PyTorch CPU eager, measured in the same run.

    uv run --extra torch python benchmarks/bench_assistant.py [--seeds 0,1,2] [--thread-counts 1,2]
        [--quick | --tiny] [--steps 10] [--write]

For each thread count and seed, a process of its own (its BLAS threads set before NumPy
loads) runs ``python -m gptkit.assistant``'s pipeline on the reference code at its default
sizes (``--quick``: the pipeline's ``--quick`` sizes; ``--tiny``: checks this script,
measures nothing): SFT on the fixed demonstrations, then RL and DPO from the SFT model,
each scored greedily on the same held-out problems, phrasings and off-task questions. Then,
in the same process, it times RL steps from the SFT model: the pipeline's step
(``gptkit.assistant.rl_batch`` and ``rl_update``: answers sampled with lab 06's cached
generation, one batch per prompt length, rewards, advantages, the sampling policy's
log-probabilities, the GRPO loss, lab 07's backward, clipping and AdamW) against the same
step written here in PyTorch (the same GPT, a KV cache of its own, ``torch.multinomial``,
autograd, ``clip_grad_norm_``, ``torch.optim.AdamW``), on the same questions, with the same
settings, on the same thread count. The two take turns, step by step, each after
``common.PAUSE`` of idle, and the median of ``--steps`` steps counts. Their samples differ
(two random generators), so a step's time includes however many tokens its own samples
took.

The report's table gives each figure's mean and range (lowest – highest) over the seeds,
per thread count; ``--write`` also puts that table into docs/11_assistant.md between its
``bench_assistant`` markers (the default sizes' or ``--quick``'s), which is where the lab's
docs quote their figures from.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (sets the BLAS threads before NumPy loads)

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402


class TorchGPT:
    """GPT-2 (pre-norm blocks, fused q/k/v, tanh GELU, tied head) in PyTorch, with a KV cache
    for sampling; its parameters are leaf tensors named as lab 04's state dict."""

    def __init__(self, state: dict, num_heads: int, eps: float):
        import torch

        self.p = {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in state.items()}
        self.H, self.eps = num_heads, eps
        self.L = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("h."))

    def forward(self, ids, cache=None):
        """logits (B, T, V) of ids (B, T) that follow the cache's positions; the cache (a list
        of (k, v) per block) grows when given."""
        import torch
        import torch.nn.functional as F

        p, H = self.p, self.H
        B, T = ids.shape
        start = 0 if not cache else cache[0][0].shape[2]
        x = p["wte.weight"][ids] + p["wpe.weight"][start:start + T]
        D = x.shape[-1]
        for i in range(self.L):
            n = f"h.{i}."
            h = F.layer_norm(x, (D,), p[n + "ln_1.weight"], p[n + "ln_1.bias"], self.eps)
            q, k, v = (h @ p[n + "attn.c_attn.weight"] + p[n + "attn.c_attn.bias"]).split(D, dim=-1)
            q, k, v = (a.view(B, T, H, D // H).transpose(1, 2) for a in (q, k, v))
            if cache is not None:
                if len(cache) > i:
                    k = torch.cat([cache[i][0], k], dim=2)
                    v = torch.cat([cache[i][1], v], dim=2)
                    cache[i] = (k, v)
                else:
                    cache.append((k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
            x = x + a.transpose(1, 2).reshape(B, T, D) @ p[n + "attn.c_proj.weight"] + p[n + "attn.c_proj.bias"]
            h = F.layer_norm(x, (D,), p[n + "ln_2.weight"], p[n + "ln_2.bias"], self.eps)
            f = F.gelu(h @ p[n + "mlp.c_fc.weight"] + p[n + "mlp.c_fc.bias"], approximate="tanh")
            x = x + f @ p[n + "mlp.c_proj.weight"] + p[n + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (D,), p["ln_f.weight"], p["ln_f.bias"], self.eps)
        return x @ p["wte.weight"].T


class TorchRL:
    """The pipeline's RL step in PyTorch: the same sampling (one batch per prompt length),
    reward, advantages, loss and optimizer settings as ``gptkit.assistant`` with the
    reference labs."""

    def __init__(self, labs, s, policy_state: dict, reference_state: dict, num_heads: int, eps: float, seed: int):
        import torch

        self.labs, self.s = labs, s
        self.policy = TorchGPT(policy_state, num_heads, eps)
        self.reference = TorchGPT(reference_state, num_heads, eps)
        self.opt = torch.optim.AdamW(list(self.policy.p.values()), lr=s.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(seed)

    def sample(self, prompts: np.ndarray, max_new: int):
        """Answers sampled to (B, T) prompts of one length, with a KV cache, ending at END."""
        import torch

        end = self.labs.end_id
        out = torch.from_numpy(prompts)
        finished = torch.zeros(len(prompts), dtype=torch.bool)
        cache: list = []
        new = out
        with torch.no_grad():
            for _ in range(max_new):
                logits = self.policy.forward(new, cache)[:, -1] / self.s.temperature
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=self.gen)[:, 0]
                nxt[finished] = end
                finished |= nxt == end
                out = torch.cat([out, nxt[:, None]], dim=1)
                new = nxt[:, None]
                if bool(finished.all()):
                    break
        return out.numpy()

    def step(self, problems, room) -> None:
        """One step on ``problems``; ``room(problem)``: the most tokens its answers may take."""
        import torch

        from gptkit.assistant import length_buckets, row_ends

        labs, s, G = self.labs, self.s, self.s.group
        by_length: dict[tuple[int, int], list] = {}
        for prob in problems:
            by_length.setdefault((len(labs.prompt(prob)), room(prob)), []).append(prob)
        rows, masks, rewards = [], [], []
        for (n, max_new), probs in sorted(by_length.items()):
            seqs = self.sample(np.repeat(np.stack([labs.prompt(p) for p in probs]), G, axis=0), max_new)
            for k, prob in enumerate(probs):
                group = []
                for row in seqs[k * G:(k + 1) * G]:  # the reward: the answer up to the first END, exactly
                    said = [int(t) for t in row[n:]]
                    done = labs.end_id in said
                    group.append(float(done and labs.tok.decode(said[:said.index(labs.end_id)]) == prob.answer))
                    keep = np.zeros(len(row), dtype=bool)  # the answer, up to and with its first END
                    ends = np.flatnonzero(row[n:] == labs.end_id)
                    keep[n:n + (ends[0] + 1 if len(ends) else len(row))] = True
                    rows.append(row)
                    masks.append(keep)
                rewards.append(group)
        r = torch.tensor(rewards)
        std = r.std(dim=1, unbiased=False, keepdim=True)
        adv = torch.where(std > 0, (r - r.mean(dim=1, keepdim=True)) / (std + 1e-6), torch.zeros_like(r)).reshape(-1)
        T = max(len(x) for x in rows)
        ids = torch.full((len(rows), T), labs.end_id, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.bool)
        for i, (x, m) in enumerate(zip(rows, masks)):
            ids[i, :len(x)] = torch.from_numpy(x)
            mask[i, :len(m)] = torch.from_numpy(m)
        self.opt.zero_grad(set_to_none=True)
        scored = mask[:, 1:].sum()
        live = np.flatnonzero(adv.numpy() != 0) if s.kl_coef == 0 else np.arange(len(adv))  # as rl_update
        for group, T in length_buckets(row_ends(mask.numpy()[live])) if len(live) else []:
            rows = torch.from_numpy(live[group])  # as the pipeline's rl_update: each group padded to its longest
            g_ids, g_mask = ids[rows, :T], mask[rows, :T]
            with torch.no_grad():
                logp_old = self.logp(self.policy, g_ids)
                logp_ref = self.logp(self.reference, g_ids) if s.kl_coef > 0 else logp_old
            loss = self.loss(g_ids, g_mask, adv[rows], logp_old, logp_ref) * (g_mask[:, 1:].sum() / scored)
            loss.backward()  # the gradients add up: the whole batch's mean over its answer tokens
        for p in self.policy.p.values():  # no live row: a zero gradient, and AdamW still steps
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(list(self.policy.p.values()), 1.0)
        self.opt.step()

    @staticmethod
    def logp(model, ids):
        """log p of each next token, (B, T − 1)."""
        import torch

        return torch.log_softmax(model.forward(ids[:, :-1]), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]

    def loss(self, ids, mask, adv, logp_old, logp_ref):
        """GRPO's loss: the clipped ratio term minus β·k3, −mean over the answer tokens."""
        import torch

        s = self.s
        scored = mask[:, 1:].float()
        logp = self.logp(self.policy, ids)
        ratio = torch.exp(logp - logp_old)
        a = adv[:, None]
        d = logp_ref - logp
        objective = torch.minimum(ratio * a, ratio.clamp(1 - s.clip_eps, 1 + s.clip_eps) * a) \
            - s.kl_coef * (torch.exp(d) - d - 1)
        return -(objective * scored).sum() / scored.sum()


DOC = common.ROOT / "docs" / "11_assistant.md"
BEGIN, END = "<!-- BEGIN bench_assistant {}table -->", "<!-- END bench_assistant {}table -->"  # "" or "quick "


def one(seed: int, threads: int, size: str, steps: int) -> dict:
    """The pipeline at ``size`` with ``seed``, then ``steps`` timed RL steps each way, in this
    process (its threads were set before NumPy loaded)."""
    common.use_reference_solutions()
    from gptkit import assistant as pipe

    s = {"default": pipe.Settings(), "quick": pipe.QUICK, "tiny": pipe.TINY}[size]
    s = replace(s, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        r = pipe.pipeline(s, Path(tmp), log=lambda line: print(f"seed {seed}, {threads} thr:{line}", file=sys.stderr,
                                                                 flush=True))
        import gpt2_weights

        model = gpt2_weights.load_gpt2(Path(tmp) / "sft").eval()  # the RL steps timed below start from it

    import torch

    torch.set_num_threads(threads)
    labs = pipe.Labs()
    held = pipe.arithmetic.held_out(s.seed, s.held_out, top=s.max_operand)
    reference, policy = copy.deepcopy(model), copy.deepcopy(model)
    opt = labs.training.AdamW(policy.state_dict(), lr=s.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)
    theirs = TorchRL(labs, s, model.state_dict(), reference.state_dict(), s.heads, model.ln_f.eps, s.seed)
    stream = pipe.arithmetic.TrainingProblems(s.seed, 2, held, s.max_operand)
    off_rng = np.random.default_rng([s.seed, 2, 2])
    rng = np.random.default_rng([s.seed, 20])

    def questions():  # as the pipeline's RL step draws them: additions and off-task questions
        return stream.draw(s.prompts) + pipe.arithmetic.off_task(off_rng, s.rl_off_task)

    # The same loss and gradients on one batch, before either side has stepped.
    ids, mask, adv, _ = pipe.rl_batch(labs, s, policy, questions(), rng)
    A = labs.assistant
    logp_old = A.token_logprobs(policy, ids)
    loss, grads = A.rl_loss_and_grads(policy, ids, mask, logp_old, logp_old, adv, clip_eps=s.clip_eps,
                                      kl_coef=s.kl_coef)
    their_loss = theirs.loss(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(adv),
                             torch.from_numpy(logp_old), torch.from_numpy(logp_old))
    their_loss.backward()
    diff = max(float(np.abs(g - theirs.policy.p[k].grad.numpy()).max()) for k, g in grads.items())
    scale = max(float(np.abs(g).max()) for g in grads.values())
    theirs.opt.zero_grad(set_to_none=True)

    def ours(problems):
        ids, mask, adv, _ = pipe.rl_batch(labs, s, policy, problems, rng)
        pipe.rl_update(labs, s, policy, reference, opt, ids, mask, adv, s.rl_lr)

    times: dict[str, list[float]] = {"numpy": [], "torch": []}
    for i in range(steps + 1):  # the first step of each is a warm-up
        problems = questions()
        for name, fn in (("numpy", lambda: ours(problems)),
                         ("torch", lambda: theirs.step(problems, lambda p: pipe.room(labs, p)))):
            time.sleep(common.PAUSE)
            t0 = time.perf_counter()
            fn()
            if i:
                times[name].append(time.perf_counter() - t0)
    r["step_ms"] = {name: 1000 * float(np.median(t)) for name, t in times.items()}
    r["grad_gap"] = diff / scale if scale > 0 else diff
    r["loss_pair"] = [float(loss), float(their_loss.detach())]
    return r


def _figures(r: dict) -> dict[str, float]:
    """The figures one run gives, by the table's row names."""
    steps, acc = np.array(r["sft_curve"], dtype=float).T
    late = steps >= steps[-1] / 2  # SFT's second half
    plateau = float(acc[late].mean())
    f = {"SFT at its last step: held-out accuracy (%)": r["sft"]["accuracy"],
         "SFT best point of its curve (%)": float(acc.max()),
         "SFT plateau: the mean of its second half's evaluations (%)": plateau,
         "SFT trend over its second half (points per 1,000 steps, least squares)":
             1000 * float(np.polyfit(steps[late], acc[late], 1)[0]) if late.sum() > 1 else float("nan")}
    if "rl" in r:
        f |= {"RL: held-out accuracy (%)": r["rl"]["accuracy"],
              "RL gain over SFT's plateau (points)": r["rl"]["accuracy"] - plateau,
              "RL gain over SFT's last step (points)": r["rl"]["accuracy"] - r["sft"]["accuracy"],
              "RL: held-out phrasings (%)": r["rl"]["held_out_phrasings"],
              "RL: worst single phrasing (%)": min(r["rl"]["phrasings"].values()),
              "RL: off-task answered with the sentence (%)": r["rl"]["off_task"]}
    if "dpo" in r:
        f |= {"DPO: held-out accuracy (%)": r["dpo"]["accuracy"],
              "DPO gain over SFT's last step (points)": r["dpo"]["accuracy"] - r["sft"]["accuracy"],
              "DPO: held-out phrasings (%)": r["dpo"]["held_out_phrasings"],
              "DPO: off-task answered with the sentence (%)": r["dpo"]["off_task"],
              "DPO pairs from the SFT model's samples": r["dpo_pairs"]}
    f |= {"SFT: off-task answered with the sentence (%)": r["sft"]["off_task"],
          "RL step, NumPy (ms)": r["step_ms"]["numpy"], "RL step, PyTorch (ms)": r["step_ms"]["torch"],
          "RL step, NumPy ÷ PyTorch": r["step_ms"]["numpy"] / r["step_ms"]["torch"],
          "whole pipeline (minutes, loaded machine)": r["total_seconds"] / 60,
          "whole pipeline, CPU time of its processes (minutes)": r["cpu_seconds"] / 60}
    return f


def _run_all(seeds: list[int], counts: list[int], args) -> dict[int, list[dict]]:
    """Each (thread count, seed) run in a process of its own, ``--jobs`` at a time at most;
    a run starts only where its cores (its BLAS threads, and two while DPO runs beside RL in
    a second process) and those of the runs already going fit in the machine's cores (BLAS threads that wait on a core another run
    holds spin, and such a run slows many times over). Results by thread count, in seed
    order."""
    cores = os.cpu_count() or 1

    def need(n: int) -> int:  # a run's cores: its threads, and two where DPO runs beside RL
        return min(cores, max(n, 2))

    todo = [(n, seed) for n in counts for seed in seeds]
    running: list[tuple[int, int, subprocess.Popen]] = []
    done: dict[tuple[int, int], dict] = {}
    while todo or running:
        busy = sum(need(n) for n, _, _ in running)
        while todo and len(running) < max(1, args.jobs) and (not running or busy + need(todo[0][0]) <= cores):
            n, seed = todo.pop(0)
            cmd = [sys.executable, __file__, "--one", str(seed), "--threads", str(n), "--steps", str(args.steps)]
            cmd += ["--quick"] if args.quick else ["--tiny"] if args.tiny else []
            running.append((n, seed, subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)))
            busy += need(n)
        n, seed, proc = running.pop(0)
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"the run of seed {seed} at {n} threads failed (exit {proc.returncode})")
        line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
        done[n, seed] = json.loads(line[len("RESULT "):])
    return {n: [done[n, seed] for seed in seeds] for n in counts}


def _cell(values: list[float]) -> str:
    digits = 2 if max(abs(v) for v in values) < 10 else 1 if max(abs(v) for v in values) < 1000 else 0
    mean = f"{np.mean(values):.{digits}f}"
    return mean if len(values) == 1 else f"{mean} ({min(values):.{digits}f} – {max(values):.{digits}f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="the pipeline's seeds (default 0,1,2)")
    p.add_argument("--thread-counts", default="1,2", help="BLAS and PyTorch thread counts (default 1,2)")
    p.add_argument("--threads", type=int, default=THREADS, help="(set by each run's own process)")
    p.add_argument("--steps", type=int, default=10, help="RL steps timed in each implementation (default 10)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the pipeline's --quick sizes")
    size.add_argument("--tiny", action="store_true", help="the pipeline's --tiny sizes: checks this script, measures nothing")
    p.add_argument("--write", action="store_true", help="put the table into docs/11_assistant.md")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once (default 1); a run with several threads waits until they fit in the cores")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # one run, in a process of its own
    args = p.parse_args()
    size = "tiny" if args.tiny else "quick" if args.quick else "default"
    if args.write and size == "tiny":
        p.error("--tiny measures nothing: it has no table to --write")
    if args.one is not None:
        print("RESULT " + json.dumps(one(args.one, args.threads, size, args.steps)), flush=True)
        return

    seeds = [int(x) for x in args.seeds.split(",")]
    counts = [int(x) for x in args.thread_counts.split(",")]
    load_before = _load()
    start = time.perf_counter()
    runs = _run_all(seeds, counts, args)
    total = time.perf_counter() - start
    load_after = _load()

    import torch

    common.print_machine(counts[-1])
    from gptkit import assistant as pipe

    s = runs[counts[0]][0]["settings"]
    flag = {"default": "", "quick": " --quick", "tiny": " --tiny"}[size]
    what = (f"`benchmarks/bench_assistant.py{flag} --seeds {args.seeds} --thread-counts {args.thread_counts} "
            f"--steps {args.steps}`")
    lines = [f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by {what} (in the instructors' kit) in "
             f"{total / 60:.0f} minutes ({args.jobs} run{'s' if args.jobs > 1 else ''} at a time at most), on {common.machine()}, torch {torch.__version__}, numpy {np.__version__}; "
             f"load average {load_before} before, {load_after} after (a run's own processes count in it: two "
             f"while DPO runs beside RL).",
             "",
             f"The pipeline{flag or ''} (`python -m gptkit.assistant --impl solutions{flag} --seed S`), sizes: "
             f"numbers up to {s['max_operand']}, a GPT of {s['layers']} layers, width {s['d_model']}, "
             f"{s['heads']} heads; SFT {s['sft_steps']} steps of {s['sft_batch']} on {s['demos']} additions and "
             f"{s['off_task_demos']} off-task demonstrations; RL and DPO {s['rl_steps']} steps of "
             f"{s['prompts']} additions and {s['rl_off_task']} off-task questions × {s['group']} answers. Held out: {runs[counts[0]][0]['held_out']} "
             f"problems over {len(pipe.arithmetic.PHRASINGS)} phrasings ({len(pipe.arithmetic.HELD_OUT_PHRASINGS)} "
             f"never trained on) and {runs[counts[0]][0]['off_task_held_out']} off-task questions, greedy. "
             f"Each cell: the mean over seeds {args.seeds} (lowest – highest).",
             ""]
    names = list(_figures(runs[counts[0]][0]))
    lines.append("| figure | " + " | ".join(f"{common.threads(n)}" for n in counts) + " |")
    lines.append("| --- |" + " --- |" * len(counts))
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_cell([_figures(r)[name] for r in runs[n]]) for n in counts) + " |")
    table = "\n".join(lines)
    print(table)
    print()
    gaps = [r["grad_gap"] for rs in runs.values() for r in rs]
    print(f"NumPy's and PyTorch's RL step compute the same thing: on one sampled batch per run, the gradients differ "
          f"by at most {max(gaps):.1e} of the largest gradient.")
    print()
    print("Each run's curves (step: held-out accuracy %):")
    print()
    for n in counts:
        for seed, r in zip(seeds, runs[n]):
            for stage in ("sft", "rl", "dpo"):
                if f"{stage}_curve" in r:
                    print(f"- seed {seed}, {common.threads(n)}, {stage.upper()}: "
                          + ", ".join(f"{st}: {acc:.1f}" for st, acc in r[f"{stage}_curve"]))
    print()
    if args.write:
        begin, end = (mark.format("quick " if size == "quick" else "") for mark in (BEGIN, END))
        text = DOC.read_text(encoding="utf-8")
        if begin not in text or end not in text:
            raise SystemExit(f"{DOC.name} has no {begin} … {end} block to write the table into")
        head, rest = text.split(begin, 1)
        DOC.write_text(head + begin + "\n" + table + "\n" + end + rest.split(end, 1)[1], encoding="utf-8")
        print(f"wrote the table into docs/{DOC.name}")
    f = {n: [_figures(r) for r in runs[n]] for n in counts}
    key = counts[0]
    common.print_summary(
        f"lab 11's assistant ({size} sizes, seeds {args.seeds}, {common.threads(key)}): SFT at its last step "
        f"{_cell([x['SFT at its last step: held-out accuracy (%)'] for x in f[key]])} % → RL "
        f"{_cell([x['RL: held-out accuracy (%)'] for x in f[key]])} %, DPO "
        f"{_cell([x['DPO: held-out accuracy (%)'] for x in f[key]])} %; an RL step takes "
        f"{_cell([x['RL step, NumPy ÷ PyTorch'] for x in f[key]])}× PyTorch's time")


def _load() -> str:
    try:
        return ", ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
