"""Hidden checks for lab 07: shapes and settings the public tests do not use, against
independent computations written here (hidden tests hold no stored answers)."""

import math

import numpy as np

from gptkit.checkpoints import GPT2Shape, random_gpt2_state
from gptkit.testing import assert_close, lab
from gptkit.testing.parameters import set_parameters

S = lab("training")
G = lab("gpt")


def test_adamw_three_steps_by_hand():
    """AdamW written out step by step in float64 (decay first, bias-corrected moments, eps
    outside the root), a learning rate that changes every step."""
    rng = np.random.default_rng(7070)
    p0 = rng.normal(0, 1, (4, 3)).astype(np.float32)
    grads = [rng.normal(0, 0.05, (4, 3)).astype(np.float32) for _ in range(3)]
    lr, b1, b2, eps, wd = [0.1, 0.05, 0.02], 0.7, 0.9, 1e-2, 0.3
    opt = S.AdamW({"p": p0.copy()}, lr=lr[0], betas=(b1, b2), eps=eps, weight_decay=wd)
    p, m, v = p0.astype(np.float64), np.zeros((4, 3)), np.zeros((4, 3))
    for t, g in enumerate(grads, 1):
        opt.lr = lr[t - 1]
        opt.step({"p": g})
        p = p * (1 - lr[t - 1] * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g.astype(np.float64) ** 2
        p = p - lr[t - 1] * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    assert_close(opt.params["p"], p, what="AdamW after three steps with lr 0.1, 0.05, 0.02", atol=1e-5)


def test_layernorm_backward_wide_rows_float32():
    """D = 96 in float32 against a float64 formula (no float64 leaking out)."""
    rng = np.random.default_rng(7071)
    x = rng.normal(3, 2, (5, 96)).astype(np.float32)
    w, dout = rng.normal(1, 0.2, 96).astype(np.float32), rng.normal(0, 1, (5, 96)).astype(np.float32)
    dx, dw, db = S.layernorm_backward(dout, x, w, 1e-5)
    xd = x.astype(np.float64)
    xhat = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5)
    g = dout * w.astype(np.float64)
    expected = (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) / np.sqrt(
        xd.var(-1, keepdims=True) + 1e-5)
    assert dx.dtype == np.float32, f"float32 in must give float32 out, got {dx.dtype}"
    assert_close(dx, expected, what="layernorm_backward dx, D = 96", atol=1e-4)
    assert_close(dw, (dout * xhat).sum(0), what="layernorm_backward dweight, D = 96", atol=1e-4)


def test_schedule_without_warmup_and_at_the_end():
    assert math.isclose(S.lr_schedule(0, max_lr=1.0, min_lr=0.0, warmup_steps=0, total_steps=4), 1.0)
    assert math.isclose(S.lr_schedule(2, max_lr=1.0, min_lr=0.0, warmup_steps=0, total_steps=4), 0.5)
    assert math.isclose(S.lr_schedule(4, max_lr=1.0, min_lr=0.2, warmup_steps=0, total_steps=4), 0.2)


def test_one_layer_gradients_sum_to_the_loss_change():
    """A one-block model with 3 heads: a small step along minus the gradient lowers the
    loss by about lr·‖g‖²."""
    shape = GPT2Shape(vocab_size=9, d_model=12, num_layers=1, num_heads=3, max_seq_len=6)
    rng = np.random.default_rng(7072)
    state = random_gpt2_state(shape, rng)
    model = set_parameters(G.GPTModel(**shape.model_kwargs(), rng=rng), state, "GPTModel")
    ids = rng.integers(0, 9, (2, 6))
    loss, grads = S.loss_and_grads(model, ids[:, :-1], ids[:, 1:])
    step = 1e-3
    moved = {k: (state[k] - step * grads[k]).astype(np.float32) for k in state}
    model.load_state_dict(moved)
    after, _ = S.loss_and_grads(model, ids[:, :-1], ids[:, 1:])
    predicted = step * sum(float(np.vdot(g, g)) for g in grads.values())
    assert abs((loss - after) - predicted) < 0.1 * predicted, (
        f"the loss fell by {loss - after:.3g} after a step of 1e-3 down the gradient; the gradient predicts {predicted:.3g}")


def test_two_train_steps_against_clipping_and_adamw_by_hand():
    """Two train_steps (clipping that bites, a learning rate per step) against the same steps
    written out here around the lab's own loss_and_grads."""
    shape = GPT2Shape(vocab_size=9, d_model=12, num_layers=1, num_heads=3, max_seq_len=6)
    rng = np.random.default_rng(7073)
    state = random_gpt2_state(shape, rng)
    model = set_parameters(G.GPTModel(**shape.model_kwargs(), rng=rng), state, "GPTModel")
    twin = set_parameters(G.GPTModel(**shape.model_kwargs(), rng=rng), state, "GPTModel")
    opt = S.AdamW(model, lr=0.5, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.2)
    p = {k: v.astype(np.float64) for k, v in twin.state_dict().items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    for t, lr in enumerate((0.04, 0.02), 1):
        ids = rng.integers(0, 9, (2, 6))
        S.train_step(model, opt, ids[:, :-1], ids[:, 1:], lr=lr, max_norm=0.05)
        twin.load_state_dict({k: v.astype(np.float32) for k, v in p.items()})
        _, grads = S.loss_and_grads(twin, ids[:, :-1], ids[:, 1:])
        norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
        assert norm > 0.1, "the gradients must be large enough for clipping to bite"
        for k in p:
            g = grads[k].astype(np.float64) * (0.05 / (norm + 1e-6))
            p[k] = p[k] * (1 - lr * 0.2)
            m[k] = 0.8 * m[k] + 0.2 * g
            v2[k] = 0.9 * v2[k] + 0.1 * g * g
            p[k] = p[k] - lr * (m[k] / (1 - 0.8 ** t)) / (np.sqrt(v2[k] / (1 - 0.9 ** t)) + 1e-3)
    for k, value in model.state_dict().items():
        assert_close(value, p[k], what=f"{k} after two train_steps (max_norm 0.05, lr 0.04 then 0.02)", atol=1e-5)
