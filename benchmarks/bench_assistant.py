"""The assistant (lab 11): the pipeline's accuracies, and the time of one RL step in NumPy
against the same step in PyTorch CPU eager, on the same thread count.

    uv run --extra torch python benchmarks/bench_assistant.py [--threads N] [--rl-steps 150] [--steps 10] [--tiny]

First it runs ``python -m gptkit.assistant``'s pipeline on the reference code, at its
default sizes (``--rl-steps`` and ``--sft-steps`` change those two): SFT from random
weights, RL (GRPO's form) and DPO from the SFT model, each scored on the same held-out
addition problems, greedy. Then it times RL steps from the SFT model: the reference's step
(``gptkit.assistant.rl_batch`` and ``rl_update``: a group sampled per question with lab 06's
cached generation, rewards, advantages, the reference model's and the sampling policy's
log-probabilities, the GRPO loss, lab 07's backward, clipping and AdamW) against the same
step written here in PyTorch (the same GPT, a KV cache of its own, ``torch.multinomial``,
autograd, ``clip_grad_norm_``, ``torch.optim.AdamW``), on the same questions, with the same
settings. The two take turns, step by step, each after ``common.PAUSE`` of idle, and the
median of ``--steps`` steps counts. Their samples differ (two random generators), so a
step's time includes however many tokens its own samples took.
"""

from __future__ import annotations

import argparse
import copy
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
    """The pipeline's RL step in PyTorch: the same sampling, reward, advantages, loss and
    optimizer settings as ``gptkit.assistant`` with the reference labs."""

    def __init__(self, labs, s, policy_state: dict, reference_state: dict, num_heads: int, eps: float, seed: int):
        import torch

        self.labs, self.s = labs, s
        self.policy = TorchGPT(policy_state, num_heads, eps)
        self.reference = TorchGPT(reference_state, num_heads, eps)
        self.opt = torch.optim.AdamW(list(self.policy.p.values()), lr=s.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(seed)

    def sample_group(self, prompt: np.ndarray, max_new: int):
        import torch

        G, end = self.s.group, self.labs.end_id
        out = torch.from_numpy(np.repeat(prompt[None, :], G, axis=0))
        finished = torch.zeros(G, dtype=torch.bool)
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

    def step(self, problems, max_new: int) -> None:
        import torch

        A, labs, s = self.labs.assistant, self.labs, self.s
        rows, masks, rewards = [], [], []
        for prob in problems:
            prompt = labs.prompt(prob)
            seqs = self.sample_group(prompt, max_new)
            group = []
            for row in seqs:  # the reward: the answer up to the first END, exactly
                said = [int(t) for t in row[len(prompt):]]
                done = labs.end_id in said
                group.append(float(done and labs.tok.decode(said[:said.index(labs.end_id)]) == prob.answer))
            rewards.append(group)
            keep = np.zeros(seqs.shape, dtype=bool)  # the answer, up to and with its first END
            for g, row in enumerate(seqs):
                ends = np.flatnonzero(row[len(prompt):] == labs.end_id)
                keep[g, len(prompt):len(prompt) + (ends[0] + 1 if len(ends) else seqs.shape[1])] = True
            rows.extend(seqs)
            masks.extend(keep)
        r = torch.tensor(rewards)
        std = r.std(dim=1, unbiased=False, keepdim=True)
        adv = torch.where(std > 0, (r - r.mean(dim=1, keepdim=True)) / (std + 1e-6), torch.zeros_like(r)).reshape(-1)
        T = max(len(x) for x in rows)
        ids = torch.full((len(rows), T), labs.end_id, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.bool)
        for i, (x, m) in enumerate(zip(rows, masks)):
            ids[i, :len(x)] = torch.from_numpy(x)
            mask[i, :len(m)] = torch.from_numpy(m)
        with torch.no_grad():
            logp_old, logp_ref = self.logp(self.policy, ids), self.logp(self.reference, ids)
        for _ in range(s.epochs):
            loss = self.loss(ids, mask, adv, logp_old, logp_ref)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: the pipeline's)")
    p.add_argument("--rl-steps", type=int, default=None, help="RL steps (default: the pipeline's)")
    p.add_argument("--steps", type=int, default=10, help="RL steps timed in each implementation (default 10)")
    p.add_argument("--tiny", action="store_true", help="the pipeline's --tiny sizes: checks this script, measures nothing")
    args = p.parse_args()

    common.use_reference_solutions()
    from gptkit import assistant as pipe

    s = pipe.TINY if args.tiny else pipe.Settings()
    s = replace(s, **{k: v for k, v in (("sft_steps", args.sft_steps), ("rl_steps", args.rl_steps)) if v is not None})
    load_before = _load()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        r = pipe.pipeline(s, Path(tmp), log=lambda line: print(line, file=sys.stderr, flush=True))
        total = time.perf_counter() - start  # the peak memory above is the pipeline's: PyTorch is not loaded yet
        import gpt2_weights

        model = gpt2_weights.load_gpt2(Path(tmp) / "sft").eval()  # the RL steps timed below start from it

    import torch

    torch.set_num_threads(args.threads)
    common.print_machine(args.threads)

    a, b, c = r["sft_accuracy"], r["rl_accuracy"], r["dpo_accuracy"]
    print(f"Addition of two numbers up to {pipe.arithmetic.MAX_OPERAND} as chat, {r['held_out']} held-out problems "
          f"scored greedily; a GPT of {s.layers} layers, width {s.d_model}, {s.heads} heads.")
    print()
    common.print_table(["phase", "held-out accuracy", "change from SFT", "steps", "time"], [
        ["SFT from random weights", f"{a:.1f} %", "", f"{s.sft_steps} of {s.sft_batch} problems",
         f"{r['sft_seconds']:.0f} s"],
        ["RL (GRPO form) from SFT", f"{b:.1f} %", f"{b - a:+.1f} points",
         f"{s.rl_steps} of {s.prompts} questions × {s.group} answers", f"{r['rl_seconds']:.0f} s"],
        ["DPO from SFT", f"{c:.1f} %", f"{c - a:+.1f} points",
         f"{s.dpo_steps} of {s.dpo_batch} pairs ({r['dpo_pairs']} pairs)", f"{r['dpo_seconds']:.0f} s"],
    ])
    print("Accuracy curves (step: held-out accuracy %):")
    print()
    for name in ("sft", "rl", "dpo"):
        print(f"- {name.upper()}: " + ", ".join(f"{step}: {acc:.1f}" for step, acc in r[f"{name}_curve"]))
    print()
    print(f"Peak memory of the pipeline's process: {r['peak_memory_mb']:.0f} MB; the whole pipeline took "
          f"{total / 60:.1f} minutes (load average {load_before} before it started).")
    print()

    # -- one RL step, NumPy against PyTorch, from the SFT model ---------------------------------
    labs = pipe.Labs()
    held = pipe.arithmetic.held_out(s.seed, s.held_out)
    reference = copy.deepcopy(model)
    policy = copy.deepcopy(model)
    opt = labs.training.AdamW(policy.state_dict(), lr=s.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)
    theirs = TorchRL(labs, s, model.state_dict(), reference.state_dict(), s.heads, model.ln_f.eps, s.seed)
    stream = pipe.arithmetic.TrainingProblems(s.seed, 2, held)
    rng = np.random.default_rng([s.seed, 20])

    def ours_step(problems):
        ids, mask, adv, _ = pipe.rl_batch(labs, s, policy, problems, rng)
        pipe.rl_update(labs, s, policy, reference, opt, ids, mask, adv)

    # The same loss and gradients on one batch, before either side has stepped.
    ids, mask, adv, _ = pipe.rl_batch(labs, s, policy, stream.draw(s.prompts), rng)
    A = labs.assistant
    logp_old, logp_ref = A.token_logprobs(policy, ids), A.token_logprobs(reference, ids)
    loss, grads = A.rl_loss_and_grads(policy, ids, mask, logp_old, logp_ref, adv, clip_eps=s.clip_eps,
                                      kl_coef=s.kl_coef)
    their_loss = theirs.loss(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(adv),
                             torch.from_numpy(logp_old), torch.from_numpy(logp_ref))
    their_loss.backward()
    diff = max(float(np.abs(g - theirs.policy.p[k].grad.numpy()).max()) for k, g in grads.items())
    scale = max(float(np.abs(g).max()) for g in grads.values())
    theirs.opt.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {"NumPy (reference labs)": [], "PyTorch eager": []}
    for i in range(args.steps + 1):  # the first step of each is a warm-up
        problems = stream.draw(s.prompts)
        for name, fn in (("NumPy (reference labs)", lambda: ours_step(problems)),
                         ("PyTorch eager", lambda: theirs.step(problems, pipe.MAX_NEW_TOKENS))):
            time.sleep(common.PAUSE)
            t0 = time.perf_counter()
            fn()
            if i:
                times[name].append(time.perf_counter() - t0)
    med = {name: float(np.median(t)) for name, t in times.items()}
    ratio = med["NumPy (reference labs)"] / med["PyTorch eager"]
    print(f"One RL step ({s.prompts} questions × {s.group} sampled answers, then {s.epochs} update), median of "
          f"{args.steps} steps each, taking turns, {common.threads(args.threads)}:")
    print()
    common.print_table(["implementation", "ms per RL step", "× PyTorch"],
                       [[name, f"{1000 * t:.0f}", f"{t / med['PyTorch eager']:.2f}"] for name, t in med.items()])
    gap = f"{diff / scale:.1e} of the largest gradient" if scale > 0 else f"{diff:.1e} (every gradient is 0)"
    print(f"The two steps compute the same thing: on one batch ({ids.shape[0]} sequences) the losses are "
          f"{float(loss):.6f} (NumPy) and {float(their_loss):.6f} (PyTorch), and the gradients differ by at most "
          f"{gap}.")
    print()
    common.print_summary(f"lab 11's assistant learns addition: SFT {a:.1f} % → RL {b:.1f} % ({b - a:+.1f} points), "
                         f"DPO {c:.1f} %; an RL step takes {ratio:.2f}× PyTorch's time "
                         f"({common.threads(args.threads)})")


def _load() -> str:
    try:
        return ", ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
