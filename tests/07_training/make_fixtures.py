"""Fixtures for lab 07, made by PyTorch autograd and HuggingFace and checked against the
reference solution.

- ``pieces``: each backward on its own (Linear, LayerNorm, tanh GELU at |x| ≈ 1–4, softmax,
  fused softmax cross-entropy, causal attention with d_head = 4, an embedding whose ids
  repeat, the tied head), every gradient from ``torch.autograd``;
- ``model``: a small GPT-2 with every parameter random, HuggingFace's ``labels=`` loss and
  the gradient of every parameter (``grad.<name>``) from ``loss.backward()``;
- ``adamw``: ``torch.optim.AdamW`` over 40 steps of stored gradients, with settings where
  the usual mistakes differ visibly (lr 0.05, betas (0.8, 0.95), eps 1e-3 with gradients
  of size ~0.01, weight decay 0.5), the parameters after every step;
- ``clip``: ``torch.nn.utils.clip_grad_norm_`` on gradients whose global norm is above
  the limit (0.5) while every single tensor's is below it, and on gradients already below it;
- ``train_step``: two whole training steps of a small random GPT-2 in PyTorch (HuggingFace's
  loss and backward, ``clip_grad_norm_`` at a tenth of the first gradients' norm so that clipping
  bites, the learning rate set before each ``torch.optim.AdamW`` step, to a value other than
  the optimizer's own): the losses, the norms, and every parameter and both AdamW moments
  (``exp_avg``, ``exp_avg_sq``) after the two steps. It has its own random generator.

Beside the right answers: what each catalogued mistake of
``solutions/07_training/bugs.toml`` whose ``diagnose`` names the case outputs
(``grader.fixtures.diagnoses``), so a failing test can name the mistake.
"""

import numpy as np

from gptkit.checkpoints import GPT2Shape, hf_model, random_gpt2_state
from grader.fixtures import diagnoses

NEEDS_TORCH = True
LAB = "07_training"

SHAPE = GPT2Shape(vocab_size=13, d_model=16, num_layers=2, num_heads=2, max_seq_len=10)
ADAMW = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.5}
ADAMW_STEPS = 40
MAX_NORM = 0.5


def _t(x, grad=False):
    import torch

    return torch.tensor(np.asarray(x), requires_grad=grad)


def _pieces(tr, rng):
    import torch
    import torch.nn.functional as F

    case = {}
    # Linear
    x, w, b = rng.normal(0, 1, (2, 3, 5)), rng.normal(0, 0.5, (5, 4)), rng.normal(0, 0.1, 4)
    dout = rng.normal(0, 1, (2, 3, 4))
    tx, tw, tb = _t(x, True), _t(w, True), _t(b, True)
    (tx @ tw + tb).backward(_t(dout))
    case.update(lin_x=x, lin_w=w, lin_dout=dout, lin_dx=tx.grad.numpy(), lin_dw=tw.grad.numpy(), lin_db=tb.grad.numpy())
    # LayerNorm (eps large enough to matter)
    x, g, b = rng.normal(0.5, 2, (3, 4, 6)), rng.normal(1, 0.3, 6), rng.normal(0, 0.2, 6)
    dout = rng.normal(0, 1, (3, 4, 6))
    tx, tg, tb = _t(x, True), _t(g, True), _t(b, True)
    F.layer_norm(tx, (6,), tg, tb, eps=1e-3).backward(_t(dout))
    case.update(ln_x=x, ln_w=g, ln_dout=dout, ln_dx=tx.grad.numpy(), ln_dw=tg.grad.numpy(), ln_db=tb.grad.numpy())
    # GELU, tanh form, where it differs from the erf form
    x = rng.uniform(1, 4, (4, 7)) * rng.choice([-1, 1], (4, 7))
    dout = rng.normal(0, 1, (4, 7))
    tx = _t(x, True)
    F.gelu(tx, approximate="tanh").backward(_t(dout))
    case.update(gelu_x=x, gelu_dout=dout, gelu_dx=tx.grad.numpy())
    # softmax
    x, dout = rng.normal(0, 2, (3, 5, 6)), rng.normal(0, 1, (3, 5, 6))
    tx = _t(x, True)
    probs = torch.softmax(tx, -1)
    probs.backward(_t(dout))
    case.update(sm_probs=probs.detach().numpy(), sm_dout=dout, sm_dx=tx.grad.numpy())
    # fused softmax cross-entropy
    logits, targets = rng.normal(0, 3, (3, 4, 9)), rng.integers(0, 9, (3, 4))
    tx = _t(logits, True)
    loss = F.cross_entropy(tx.reshape(-1, 9), torch.from_numpy(targets.reshape(-1)))
    loss.backward()
    case.update(ce_logits=logits, ce_targets=targets, ce_loss=np.float64(loss.item()), ce_dlogits=tx.grad.numpy())
    # causal attention: B=2, H=3, T=5, d_head=4
    q, k, v = (rng.normal(0, 1.5, (2, 3, 5, 4)) for _ in range(3))
    dout = rng.normal(0, 1, (2, 3, 5, 4))
    tq, tk, tv = _t(q, True), _t(k, True), _t(v, True)
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(_t(dout))
    case.update(attn_q=q, attn_k=k, attn_v=v, attn_dout=dout, attn_dq=tq.grad.numpy(), attn_dk=tk.grad.numpy(),
                attn_dv=tv.grad.numpy())
    # embedding with repeated ids
    ids = np.array([[1, 4, 1, 7], [4, 4, 0, 1]])
    table, dout = rng.normal(0, 1, (9, 5)), rng.normal(0, 1, (2, 4, 5))
    tt = _t(table, True)
    F.embedding(torch.from_numpy(ids), tt).backward(_t(dout))
    case.update(emb_ids=ids, emb_dout=dout, emb_dw=tt.grad.numpy())
    # the tied head
    x, wte, dout = rng.normal(0, 1, (2, 3, 5)), rng.normal(0, 1, (9, 5)), rng.normal(0, 1, (2, 3, 9))
    tx, tw = _t(x, True), _t(wte, True)
    (tx @ tw.T).backward(_t(dout))
    case.update(head_x=x, head_w=wte, head_dout=dout, head_dx=tx.grad.numpy(), head_dw=tw.grad.numpy())

    def outputs(m):
        lin = m.linear_backward(case["lin_dout"], case["lin_x"], case["lin_w"])
        ln = m.layernorm_backward(case["ln_dout"], case["ln_x"], case["ln_w"], 1e-3)
        ce = m.softmax_cross_entropy(case["ce_logits"], case["ce_targets"])
        att = m.causal_attention_backward(case["attn_dout"], case["attn_q"], case["attn_k"], case["attn_v"])
        head = m.tied_head_backward(case["head_dout"], case["head_x"], case["head_w"])
        return {"lin_dx": lin[0], "lin_dw": lin[1], "lin_db": lin[2], "ln_dx": ln[0], "ln_dw": ln[1], "ln_db": ln[2],
                "gelu_dx": m.gelu_backward(case["gelu_dout"], case["gelu_x"]),
                "sm_dx": m.softmax_backward(case["sm_dout"], case["sm_probs"]),
                "ce_loss": np.float64(ce[0]), "ce_dlogits": ce[1],
                "attn_dq": att[0], "attn_dk": att[1], "attn_dv": att[2],
                "emb_dw": m.embedding_backward(case["emb_dout"], case["emb_ids"], 9),
                "head_dx": head[0], "head_dw": head[1]}

    mine = outputs(tr)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-7, atol=1e-9), f"the reference's {name} differs from torch's"
    return {**case, **diagnoses(LAB, "pieces", case, outputs, "training")}


def _model_case(tr, ref_gpt, rng):
    import torch

    state = random_gpt2_state(SHAPE, rng)
    hf = hf_model(state, SHAPE)
    ids = rng.integers(0, SHAPE.vocab_size, (3, SHAPE.max_seq_len))
    ids[0, :4] = ids[0, 0]  # a repeated token, so the embedding's gradient must accumulate
    out = hf(torch.from_numpy(ids), labels=torch.from_numpy(ids))
    out.loss.backward()
    named = dict(hf.named_parameters())
    case = {"ids": ids, "loss": np.float32(out.loss.item())}
    case.update({f"param.{k}": v for k, v in state.items()})
    case.update({f"grad.{k}": named["transformer." + k].grad.numpy().copy() for k in state})
    model = ref_gpt.GPTModel(**SHAPE.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()

    def outputs(m):
        loss, grads = m.loss_and_grads(model, ids[:, :-1], ids[:, 1:])
        return {"loss": np.float32(loss), **{f"grad.{k}": g for k, g in grads.items()}}

    mine = outputs(tr)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-3, atol=2e-6), f"the reference's {name} differs from HF's"
    return {**case, **diagnoses(LAB, "model", case, outputs, "training")}


def _adamw_case(tr, rng):
    import torch

    shapes = {"w": (4, 3), "b": (3,), "e": (5, 2)}
    params = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in shapes.items()}
    grads = {k: (rng.normal(0, 0.01, (ADAMW_STEPS, *s)) + 0.005).astype(np.float32) for k, s in shapes.items()}
    tensors = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    opt = torch.optim.AdamW(list(tensors.values()), **ADAMW)
    after = {k: [] for k in shapes}
    for step in range(ADAMW_STEPS):
        for k, t in tensors.items():
            t.grad = torch.from_numpy(grads[k][step].copy())
        opt.step()
        for k, t in tensors.items():
            after[k].append(t.detach().numpy().copy())
    case = {f"param.{k}": v for k, v in params.items()}
    case.update({f"grads.{k}": v for k, v in grads.items()})
    case.update({f"after.{k}": np.stack(v) for k, v in after.items()})
    case.update(lr=np.float64(ADAMW["lr"]), betas=np.array(ADAMW["betas"]), eps=np.float64(ADAMW["eps"]),
                weight_decay=np.float64(ADAMW["weight_decay"]))

    def outputs(m):
        opt = m.AdamW({k: v.copy() for k, v in params.items()}, **ADAMW)
        out = {k: [] for k in shapes}
        for step in range(ADAMW_STEPS):
            opt.step({k: grads[k][step] for k in shapes})
            for k in shapes:
                out[k].append(opt.params[k].copy())
        return {f"after.{k}": np.stack(v) for k, v in out.items()}

    mine = outputs(tr)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-5, atol=1e-6), f"the reference's AdamW ({name}) differs"
    return {**case, **diagnoses(LAB, "adamw", case, outputs, "training")}


def _clip_case(tr, rng):
    import torch

    shapes = {"a": (3, 4), "b": (4,), "c": (3, 3), "d": (2, 5)}
    norms = {"a": 0.4, "b": 0.3, "c": 0.35, "d": 0.25}  # each below 0.5, together 0.66
    big = {}
    for k, s in shapes.items():
        g = rng.normal(0, 1, s)
        big[k] = (g * (norms[k] / np.linalg.norm(g))).astype(np.float32)
    small = {k: (v * 0.2).astype(np.float32) for k, v in big.items()}
    case = {"max_norm": np.float64(MAX_NORM)}
    for label, grads in (("big", big), ("small", small)):
        tensors = [torch.nn.Parameter(torch.zeros(shapes[k])) for k in shapes]
        for t, k in zip(tensors, shapes):
            t.grad = torch.from_numpy(grads[k].copy())
        norm = torch.nn.utils.clip_grad_norm_(tensors, MAX_NORM)
        case[f"{label}_norm"] = np.float64(norm.item())
        case.update({f"{label}.{k}": grads[k] for k in shapes})
        case.update({f"{label}_clipped.{k}": t.grad.numpy().copy() for t, k in zip(tensors, shapes)})
    norms = {k: float(np.linalg.norm(v)) for k, v in big.items()}
    assert case["big_norm"] > MAX_NORM and max(norms.values()) < MAX_NORM, "the big case must need global, not per-tensor, clipping"

    def outputs(m):
        out = {}
        for label in ("big", "small"):
            clipped, norm = m.clip_grad_norm({k: case[f"{label}.{k}"].copy() for k in shapes}, MAX_NORM)
            out[f"{label}_norm"] = np.float64(norm)
            out.update({f"{label}_clipped.{k}": clipped[k] for k in shapes})
        return out

    mine = outputs(tr)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-5, atol=1e-7), f"the reference's clipping ({name}) differs"
    return {**case, **diagnoses(LAB, "clip", case, outputs, "training")}


TRAIN_ADAMW = {"lr": 0.2, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.3}
TRAIN_LRS = (0.03, 0.01)  # set by train_step before each step; the constructor's lr is never used


def _train_step_case(tr, ref_gpt, rng):
    import torch

    state = random_gpt2_state(SHAPE, rng)
    hf = hf_model(state, SHAPE)
    batches = rng.integers(0, SHAPE.vocab_size, (len(TRAIN_LRS), 3, SHAPE.max_seq_len))
    hf(torch.from_numpy(batches[0]), labels=torch.from_numpy(batches[0])).loss.backward()
    max_norm = float(torch.nn.utils.clip_grad_norm_(hf.parameters(), float("inf"))) / 10  # clipping bites
    opt = torch.optim.AdamW(hf.parameters(), **TRAIN_ADAMW)
    losses, norms = [], []
    for batch, lr in zip(batches, TRAIN_LRS):
        opt.zero_grad()
        # labels= is shifted inside: the loss of ids[:, :-1] predicting ids[:, 1:], as train_step's x, y
        out = hf(torch.from_numpy(batch), labels=torch.from_numpy(batch))
        out.loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(hf.parameters(), max_norm)))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        losses.append(out.loss.item())
    assert min(norms) > 1.5 * max_norm, f"train_step: clipping must bite at both steps (norms {norms}, max {max_norm})"
    named = {(k[len("transformer."):] if k.startswith("transformer.") else k): p for k, p in hf.named_parameters()}
    case = {"batches": batches, "lrs": np.array(TRAIN_LRS), "max_norm": np.float64(max_norm),
            "adamw_lr": np.float64(TRAIN_ADAMW["lr"]), "betas": np.array(TRAIN_ADAMW["betas"]),
            "eps": np.float64(TRAIN_ADAMW["eps"]), "weight_decay": np.float64(TRAIN_ADAMW["weight_decay"]),
            "losses": np.array(losses), "norms": np.array(norms), **{f"param.{k}": v for k, v in state.items()}}
    for k, p in named.items():
        case[f"after.{k}"] = p.detach().numpy().copy()
        case[f"m.{k}"] = opt.state[p]["exp_avg"].numpy().copy()
        case[f"v.{k}"] = opt.state[p]["exp_avg_sq"].numpy().copy()

    def outputs(m):
        model = ref_gpt.GPTModel(**SHAPE.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()
        o = m.AdamW(model, **TRAIN_ADAMW)
        steps = [m.train_step(model, o, b[:, :-1], b[:, 1:], lr=lr, max_norm=max_norm)
                 for b, lr in zip(batches, TRAIN_LRS)]
        result = {"losses": np.array([s[0] for s in steps]), "norms": np.array([s[1] for s in steps])}
        params = model.state_dict()
        for k in named:
            result.update({f"after.{k}": params[k], f"m.{k}": o.m[k], f"v.{k}": o.v[k]})
        return result

    mine = outputs(tr)
    for name, value in mine.items():
        # atol 1e-5: after two float32 AdamW steps, rounding in a gradient moves a weight by a few 1e-6
        assert np.allclose(value, case[name], rtol=1e-4, atol=1e-5), f"train_step: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "train_step", case, outputs, "training")}


def build() -> dict[str, dict[str, np.ndarray]]:
    import gpt as ref_gpt
    import training as tr

    rng = np.random.default_rng(707)
    return {"pieces": _pieces(tr, rng), "model": _model_case(tr, ref_gpt, rng), "adamw": _adamw_case(tr, rng),
            "clip": _clip_case(tr, rng), "train_step": _train_step_case(tr, ref_gpt, np.random.default_rng(717))}
