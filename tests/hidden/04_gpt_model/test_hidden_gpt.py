"""Hidden checks for lab 04: shapes the public tests do not use, against an independent
float64 forward pass written here (hidden tests hold no stored answers)."""

import numpy as np

from gptkit.testing import assert_close, lab
from gptkit.checkpoints import GPT2Shape, random_gpt2_state
from gptkit.testing.parameters import set_parameters

G = lab("gpt")
SHAPE = GPT2Shape(vocab_size=30, d_model=20, num_layers=3, num_heads=5, max_seq_len=12, d_ff=28)


def _ln(x, w, b, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def _forward64(p, ids, shape):
    D, H = shape.d_model, shape.num_heads
    d = D // H
    T = ids.shape[1]
    x = p["wte.weight"][ids] + p["wpe.weight"][:T]
    future = np.triu(np.ones((T, T), bool), 1)
    for i in range(shape.num_layers):
        g = {k[len(f"h.{i}."):]: v for k, v in p.items() if k.startswith(f"h.{i}.")}
        a = _ln(x, g["ln_1.weight"], g["ln_1.bias"]) @ g["attn.c_attn.weight"] + g["attn.c_attn.bias"]
        heads = []
        for h in range(H):
            q, k, v = (a[..., j * D + h * d: j * D + (h + 1) * d] for j in range(3))
            s = q @ k.swapaxes(-1, -2) / np.sqrt(d)
            s[:, future] = -np.inf
            w = np.exp(s - s.max(-1, keepdims=True))
            heads.append((w / w.sum(-1, keepdims=True)) @ v)
        x = x + np.concatenate(heads, -1) @ g["attn.c_proj.weight"] + g["attn.c_proj.bias"]
        u = _ln(x, g["ln_2.weight"], g["ln_2.bias"]) @ g["mlp.c_fc.weight"] + g["mlp.c_fc.bias"]
        u = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))
        x = x + u @ g["mlp.c_proj.weight"] + g["mlp.c_proj.bias"]
    return _ln(x, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte.weight"].T


def test_five_heads_three_layers_against_float64():
    rng = np.random.default_rng(4040)
    state = random_gpt2_state(SHAPE, rng)
    model = set_parameters(G.GPTModel(**SHAPE.model_kwargs(), rng=rng), state, "GPTModel")
    ids = rng.integers(0, SHAPE.vocab_size, (3, 11))
    expected = _forward64({k: v.astype(np.float64) for k, v in state.items()}, ids, SHAPE)
    assert_close(model(ids), expected, what="GPTModel (5 heads, 3 layers) vs float64", atol=2e-4, rtol=2e-4)


def test_one_query_over_many_keys():
    rng = np.random.default_rng(4041)
    layer = G.MultiHeadAttention(12, 2, rng=rng)
    q = rng.normal(size=(2, 2, 1, 6)).astype(np.float32)
    k, v = (rng.normal(size=(2, 2, 9, 6)).astype(np.float32) for _ in range(2))
    s = q.astype(np.float64) @ k.swapaxes(-1, -2) / np.sqrt(6)  # the one query sits last: it sees every key
    w = np.exp(s - s.max(-1, keepdims=True))
    expected = (w / w.sum(-1, keepdims=True)) @ v  # before the call, from the test's own arrays
    assert_close(layer.attend(q.copy(), k.copy(), v.copy()), expected, what="attend, T=1 over S=9 keys")
