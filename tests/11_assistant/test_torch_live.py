"""Lab 11 · live checks against PyTorch and HuggingFace (skipped without the torch extra), on
fresh random inputs: the masked cross-entropy and its gradient against
``torch.nn.functional.cross_entropy``, LoRA's forward and backward against autograd, the
GRPO loss and DPO's loss with their gradients against autograd on the same formulas, and
supervised fine-tuning and one RL step of a random GPT-2 against HuggingFace's
``loss.backward()``. HuggingFace runs on CUDA when there is one (TF32 off), else the CPU.
"""

import numpy as np
import pytest

from gptkit.checkpoints import GPT2Shape, hf_model, random_gpt2_state
from gptkit.testing import assert_close, lab
from gptkit.testing.parameters import set_parameters
from gptkit.testing.torchref import device, to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
A = lab("assistant")
G = lab("gpt")
L3 = lab("layers")

SHAPE = GPT2Shape(vocab_size=23, d_model=32, num_layers=2, num_heads=4, max_seq_len=14)


def _t(x, grad=False):
    torch = torch_or_skip()
    return torch.tensor(np.asarray(x, np.float64), requires_grad=grad)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_cross_entropy_matches_torch_live(seed):
    torch = torch_or_skip()
    rng = np.random.default_rng(1100 + seed)
    B, T, V = 3, 6, 11
    logits = rng.normal(0, 3, (B, T, V)).astype(np.float32)
    targets = rng.integers(0, V, (B, T))
    mask = rng.random((B, T)) < 0.5
    mask[0, -1] = True
    tx = _t(logits, True)
    per = torch.nn.functional.cross_entropy(tx.reshape(-1, V), torch.from_numpy(targets.reshape(-1)), reduction="none")
    m = _t(mask.reshape(-1))
    loss = (per * m).sum() / m.sum()
    loss.backward()
    got, dlogits = A.masked_cross_entropy(logits, targets, mask)
    assert_close(np.float64(got), np.float64(loss.item()), atol=1e-5, what="masked_cross_entropy vs torch (live)")
    assert_close(dlogits, tx.grad.numpy(), atol=1e-7, rtol=1e-5, what="masked_cross_entropy's dlogits vs torch (live)")


@pytest.mark.parametrize("rank, alpha", [(1, 1.0), (4, 8.0), (8, 2.0)])
def test_lora_matches_torch_autograd_live(rank, alpha):
    torch_or_skip()
    rng = np.random.default_rng(1110 + rank)
    d_in, d_out = 12, 9
    base = L3.Linear(d_in, d_out, rng=np.random.default_rng(0))
    base.weight = rng.normal(0, 0.3, (d_in, d_out)).astype(np.float32)
    base.bias = rng.normal(0, 0.1, d_out).astype(np.float32)
    W, b = base.weight.copy(), base.bias.copy()
    layer = A.LoRALinear(base, rank, alpha, rng=np.random.default_rng(1))
    layer.A = rng.normal(0, 0.3, (d_in, rank)).astype(np.float32)
    layer.B = rng.normal(0, 0.3, (rank, d_out)).astype(np.float32)
    Am, Bm = layer.A.copy(), layer.B.copy()
    x, dout = rng.normal(0, 1, (2, 5, d_in)).astype(np.float32), rng.normal(0, 1, (2, 5, d_out)).astype(np.float32)
    tx, tA, tB = _t(x, True), _t(Am, True), _t(Bm, True)
    y = tx @ _t(W) + _t(b) + (alpha / rank) * (tx @ tA) @ tB
    y.backward(_t(dout))
    what = f"LoRALinear(rank={rank}, alpha={alpha:g})"
    assert_close(layer(x), y.detach().numpy(), atol=1e-5, what=f"{what}: the output vs torch (live)")
    dx, dA, dB = layer.backward(dout, x)
    for name, got, want in (("dB", dB, tB.grad), ("dA", dA, tA.grad), ("dx", dx, tx.grad)):
        assert_close(got, want.numpy(), atol=1e-5, rtol=1e-5, what=f"{what}: {name} vs torch.autograd (live)")


@pytest.mark.parametrize("clip_eps, kl_coef", [(0.2, 0.04), (0.1, 1.0), (0.3, 0.0)])
def test_grpo_loss_matches_torch_live(clip_eps, kl_coef):
    torch = torch_or_skip()
    rng = np.random.default_rng(1120)
    B, L = 5, 7
    logp = rng.uniform(-4, -0.1, (B, L)).astype(np.float32)
    old = (logp - rng.uniform(-0.6, 0.6, (B, L))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.5, (B, L))).astype(np.float32)
    adv = rng.normal(0, 1, B).astype(np.float32)
    mask = rng.random((B, L)) < 0.7
    mask[:, 0] = True
    t = _t(logp, True)
    ratio = torch.exp(t - _t(old))
    At = _t(adv)[:, None]
    obj = torch.minimum(ratio * At, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * At)
    d = _t(ref) - t
    m = _t(mask)
    loss = -((obj - kl_coef * (torch.exp(d) - d - 1)) * m).sum() / m.sum()
    loss.backward()
    got, dlogp = A.grpo_loss(logp, old, ref, adv, mask, clip_eps=clip_eps, kl_coef=kl_coef)
    what = f"grpo_loss (clip_eps {clip_eps:g}, kl_coef {kl_coef:g})"
    assert_close(np.float64(got), np.float64(loss.item()), atol=1e-5, what=f"{what} vs torch (live)")
    assert_close(dlogp, t.grad.numpy(), atol=1e-6, rtol=1e-5, what=f"{what}: dlogp vs torch.autograd (live)")


@pytest.mark.parametrize("beta", [0.05, 0.1, 1.0])
def test_dpo_loss_matches_torch_live(beta):
    torch = torch_or_skip()
    rng = np.random.default_rng(1130)
    pc, pr, rc, rr = (rng.uniform(-40, -3, 8).astype(np.float32) for _ in range(4))
    tc, tr = _t(pc, True), _t(pr, True)
    loss = -torch.nn.functional.logsigmoid(beta * ((tc - _t(rc)) - (tr - _t(rr)))).mean()
    loss.backward()
    got, dc, dr = A.dpo_loss(pc, pr, rc, rr, beta)
    assert_close(np.float64(got), np.float64(loss.item()), atol=1e-5, what=f"dpo_loss (β {beta:g}) vs torch (live)")
    assert_close(dc, tc.grad.numpy(), atol=1e-7, rtol=1e-5, what=f"dpo_loss (β {beta:g}): d_policy_chosen (live)")
    assert_close(dr, tr.grad.numpy(), atol=1e-7, rtol=1e-5, what=f"dpo_loss (β {beta:g}): d_policy_rejected (live)")


def _pair(seed):
    rng = np.random.default_rng(seed)
    state = random_gpt2_state(SHAPE, rng)
    model = set_parameters(G.GPTModel(**SHAPE.model_kwargs(), rng=rng), state, "GPTModel")
    return model, hf_model(state, SHAPE, device()), state, rng


def _check_grads(grads, hf, state, what):
    named = dict(hf.named_parameters())
    for name in reversed(list(state)):
        want = to_numpy(named["transformer." + name].grad)
        assert_close(grads[name], want, atol=2e-5 * float(np.abs(want).max()) + 1e-7, rtol=1e-3,
                     what=f"{what}: the gradient of {name} (live)")


def test_sft_matches_huggingface_live():
    torch = torch_or_skip()
    model, hf, state, rng = _pair(1140)
    ids = rng.integers(0, SHAPE.vocab_size, (3, SHAPE.max_seq_len))
    mask = np.zeros(ids.shape, bool)
    mask[0, 5:], mask[1, 3:9], mask[2, 10:12] = True, True, True
    out = hf(to_torch(ids), labels=to_torch(np.where(mask, ids, -100)))
    out.loss.backward()
    loss, grads = A.sft_loss_and_grads(model, ids, mask)
    assert_close(np.float64(loss), np.float64(out.loss.item()), atol=1e-5, what="sft_loss_and_grads vs HuggingFace (live)")
    _check_grads(grads, hf, state, "sft_loss_and_grads vs HuggingFace")


def test_rl_step_matches_pytorch_live():
    torch = torch_or_skip()
    model, hf, state, rng = _pair(1150)
    ids = rng.integers(0, SHAPE.vocab_size, (4, SHAPE.max_seq_len))
    mask = np.zeros(ids.shape, bool)
    for row, (start, stop) in enumerate(((5, 14), (5, 9), (6, 12), (6, 8))):
        mask[row, start:stop] = True
    old = rng.uniform(-4, -1, (4, SHAPE.max_seq_len - 1)).astype(np.float32)
    ref = rng.uniform(-4, -1, (4, SHAPE.max_seq_len - 1)).astype(np.float32)
    adv = np.array([1.5, -0.5, 0.3, -1.3], np.float32)
    logp = torch.log_softmax(hf(to_torch(ids)).logits.double(), -1)[:, :-1]
    logp = torch.gather(logp, 2, to_torch(ids[:, 1:, None]))[..., 0]
    ratio = torch.exp(logp - to_torch(old).double())
    At = to_torch(adv).double()[:, None]
    obj = torch.minimum(ratio * At, torch.clamp(ratio, 0.8, 1.2) * At)
    d = to_torch(ref).double() - logp
    m = to_torch(mask[:, 1:]).double()
    loss = -((obj - 0.04 * (torch.exp(d) - d - 1)) * m).sum() / m.sum()
    loss.backward()
    got, grads = A.rl_loss_and_grads(model, ids, mask, old, ref, adv)
    assert_close(np.float64(got), np.float64(loss.item()), atol=1e-5, what="rl_loss_and_grads vs PyTorch (live)")
    _check_grads(grads, hf, state, "rl_loss_and_grads vs PyTorch")
