"""Lab 07 · live checks against PyTorch and HuggingFace (skipped without the torch extra):
every parameter's gradient of random GPT-2s of several shapes against
``GPT2LMHeadModel(..., labels=ids).loss.backward()``, AdamW against ``torch.optim.AdamW``
over many steps with settings where the usual mistakes differ visibly, clipping against
``torch.nn.utils.clip_grad_norm_``, whole training steps against the same steps in
PyTorch, and a saved checkpoint loaded by ``GPT2LMHeadModel.from_pretrained``.
HuggingFace runs on CUDA when there is one (TF32 off), else the CPU.
"""

import numpy as np
import pytest

from gptkit.checkpoints import GPT2Shape, hf_model, random_gpt2_state
from gptkit.testing import assert_close, lab
from gptkit.testing.parameters import set_parameters
from gptkit.testing.torchref import device, to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
S = lab("training")
G = lab("gpt")

SHAPES = {
    "1 head": GPT2Shape(vocab_size=29, d_model=16, num_layers=1, num_heads=1, max_seq_len=12),
    "4 heads, d_ff 40": GPT2Shape(vocab_size=65, d_model=32, num_layers=3, num_heads=4, max_seq_len=20, d_ff=40),
    "8 heads, eps 1e-3": GPT2Shape(vocab_size=50, d_model=64, num_layers=2, num_heads=8, max_seq_len=16,
                                   layer_norm_eps=1e-3),
}


def _pair(shape, seed):
    torch_or_skip()
    rng = np.random.default_rng(seed)
    state = random_gpt2_state(shape, rng)
    model = set_parameters(G.GPTModel(**shape.model_kwargs(), rng=rng), state, "GPTModel")
    return model, hf_model(state, shape, device()), state, rng


@pytest.mark.parametrize("name", SHAPES)
def test_every_gradient_matches_huggingface(name):
    shape = SHAPES[name]
    model, hf, state, rng = _pair(shape, seed=len(name))
    ids = rng.integers(0, shape.vocab_size, (3, shape.max_seq_len))
    ids[1, ::2] = ids[1, 0]  # repeated tokens
    out = hf(to_torch(ids), labels=to_torch(ids))
    out.loss.backward()
    theirs = {k[len("transformer."):]: to_numpy(p.grad) for k, p in hf.named_parameters()}
    loss, grads = S.loss_and_grads(model, ids[:, :-1], ids[:, 1:])
    assert_close(np.float64(loss), np.float64(out.loss.item()), what=f"the loss vs HuggingFace's ({name})", atol=1e-5)
    assert sorted(grads) == sorted(state), "a gradient for every parameter, under model.state_dict()'s names"
    for k in state:
        scale = float(np.abs(theirs[k]).max())
        assert_close(grads[k], theirs[k], what=f"the gradient of {k} vs HuggingFace's loss.backward() ({name})",
                     atol=2e-5 * scale + 1e-7, rtol=1e-3)


ADAMW_SETTINGS = {
    "large lr and decay, odd betas, big eps": dict(lr=0.05, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.5),
    "PyTorch's defaults, lr 1e-2": dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
    "no decay, beta2 0.9": dict(lr=0.03, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.0),
}


@pytest.mark.parametrize("setting", ADAMW_SETTINGS)
def test_adamw_matches_torch(setting):
    torch = torch_or_skip()
    kw = ADAMW_SETTINGS[setting]
    rng = np.random.default_rng(len(setting))
    shapes = {"w": (6, 5), "b": (5,), "e": (3, 4, 2)}
    params = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in shapes.items()}
    ours = S.AdamW({k: v.copy() for k, v in params.items()}, **kw)
    tensors = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    theirs = torch.optim.AdamW(list(tensors.values()), **kw)
    for step in range(60):
        lr = kw["lr"] * (1.0 if step < 30 else 0.3)  # a schedule changes lr between steps
        ours.lr = lr
        for group in theirs.param_groups:
            group["lr"] = lr
        grads = {k: (rng.normal(0, 0.01 * (1 + step % 3), s) + 0.003).astype(np.float32) for k, s in shapes.items()}
        for k, t in tensors.items():
            t.grad = torch.from_numpy(grads[k].copy())
        theirs.step()
        ours.step(grads)
        if step in (0, 1, 9, 29, 59):
            now = ours.params
            for k, t in tensors.items():
                assert_close(now[k], t.detach().numpy(), what=f"{k!r} after {step + 1} steps vs torch.optim.AdamW "
                             f"({setting})", atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("max_norm", [0.1, 1.0, 100.0])
def test_clip_grad_norm_matches_torch(max_norm):
    torch = torch_or_skip()
    rng = np.random.default_rng(int(max_norm * 10))
    grads = {f"g{i}": rng.normal(0, s, shape).astype(np.float32)
             for i, (s, shape) in enumerate([(0.1, (7, 3)), (0.3, (5,)), (0.02, (4, 4, 2))])}
    tensors = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads.values()]
    for t, g in zip(tensors, grads.values()):
        t.grad = torch.from_numpy(g.copy())
    norm = torch.nn.utils.clip_grad_norm_(tensors, max_norm).item()
    clipped, ours = S.clip_grad_norm({k: v.copy() for k, v in grads.items()}, max_norm)
    assert_close(np.float64(ours), np.float64(norm), what=f"the global norm (max_norm {max_norm})", atol=1e-6)
    for (k, g), t in zip(grads.items(), tensors):
        assert_close(clipped[k], t.grad.numpy(), what=f"{k} clipped to {max_norm} vs clip_grad_norm_", atol=1e-7)


def test_training_steps_match_pytorch():
    """Five whole steps (loss, backward, clipping at 1.0, warm-up learning rate, AdamW) in
    NumPy and in PyTorch from the same weights and batches: the same weights after."""
    torch = torch_or_skip()
    shape = GPT2Shape(vocab_size=40, d_model=32, num_layers=2, num_heads=4, max_seq_len=16)
    model, hf, state, rng = _pair(shape, seed=17)
    kw = dict(betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    opt = S.AdamW(model, lr=1e-3, **kw)
    theirs = torch.optim.AdamW(hf.parameters(), lr=1e-3, **kw)  # tied: lm_head is wte, one parameter
    for step in range(5):
        ids = rng.integers(0, shape.vocab_size, (4, shape.max_seq_len))
        lr = S.lr_schedule(step, max_lr=1e-3, min_lr=1e-4, warmup_steps=3, total_steps=10)
        loss, _ = S.train_step(model, opt, ids[:, :-1], ids[:, 1:], lr=lr, max_norm=1.0)
        theirs.zero_grad()
        out = hf(to_torch(ids), labels=to_torch(ids))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        for group in theirs.param_groups:
            group["lr"] = lr
        theirs.step()
        assert abs(loss - out.loss.item()) < 1e-4, f"step {step}: loss {loss:.6f}, PyTorch's {out.loss.item():.6f}"
    ours = model.state_dict()
    D = shape.d_model
    for k, p in hf.named_parameters():
        name = k[len("transformer."):] if k.startswith("transformer.") else k
        mine, want = ours[name], to_numpy(p)
        if name.endswith("attn.c_attn.bias"):
            # The keys' bias adds the same q·b_k to every score of a row, which the softmax
            # ignores: its true gradient is exactly 0, so both sides hold rounding noise, and
            # Adam turns noise into full-size steps. Compare the queries' and values' blocks.
            mine, want = np.concatenate([mine[:D], mine[2 * D:]]), np.concatenate([want[:D], want[2 * D:]])
        assert_close(mine, want, what=f"{name} after 5 training steps vs the same steps in PyTorch",
                     atol=2e-5, rtol=1e-4)


def test_checkpoint_loads_in_huggingface(tmp_path):
    torch = torch_or_skip()
    from transformers import GPT2LMHeadModel

    shape = SHAPES["4 heads, d_ff 40"]
    model, _, _, rng = _pair(shape, seed=23)
    S.save_checkpoint(tmp_path / "ckpt", model)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "ckpt").to(device()).eval()
    ids = rng.integers(0, shape.vocab_size, (2, shape.max_seq_len))
    with torch.no_grad():
        logits = to_numpy(hf(to_torch(ids)).logits)
    assert_close(model(ids), logits, what="logits of your checkpoint loaded by GPT2LMHeadModel.from_pretrained",
                 atol=1e-4)
