"""Hidden checks for lab 08: shapes and positions the public tests do not use, against
independent computations written here (hidden tests hold no stored answers)."""

import numpy as np

from gptkit.testing import assert_close, lab

L = lab("llama")


def _rope64(x, positions, base):
    """The rotate-half rotation in float64, written out pair by pair."""
    d = x.shape[-1]
    h = d // 2
    ang = positions[:, None] * base ** (-2.0 * np.arange(h) / d)
    x = x.astype(np.float64)
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)], axis=-1)


def test_rope_against_float64_at_scattered_positions():
    rng = np.random.default_rng(8080)
    x = rng.standard_normal((3, 5, 12)).astype(np.float32)
    pos = np.array([2, 11, 12, 64, 65])
    assert_close(L.apply_rope(x, pos, 1000.0), _rope64(x, pos, 1000.0), what="apply_rope, base 1000, d 12",
                 atol=2e-5)


def test_gqa_attention_against_a_loop_over_heads():
    rng = np.random.default_rng(8081)
    D, H, Hkv, T = 24, 6, 2, 7
    d = D // H
    attn = L.LlamaAttention(D, H, Hkv, 10000.0, rng=rng)
    w = {n: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
         for n, s in (("q_proj.weight", (D, D)), ("k_proj.weight", (D, Hkv * d)), ("v_proj.weight", (D, Hkv * d)),
                      ("o_proj.weight", (D, D)))}
    attn.load_state_dict(w)
    x = rng.standard_normal((1, T, D)).astype(np.float32)
    pos = np.arange(T) + 5
    out = attn(x, pos)
    x64 = x[0].astype(np.float64)
    heads = []
    for h in range(H):
        g = h // (H // Hkv)  # the kv head of this query head's group
        q = _rope64((x64 @ w["q_proj.weight"][:, h * d:(h + 1) * d])[None], pos, 10000.0)[0]
        k = _rope64((x64 @ w["k_proj.weight"][:, g * d:(g + 1) * d])[None], pos, 10000.0)[0]
        v = x64 @ w["v_proj.weight"][:, g * d:(g + 1) * d]
        s = q @ k.T / np.sqrt(d) + np.triu(np.full((T, T), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append(p / p.sum(-1, keepdims=True) @ v)
    expected = np.concatenate(heads, axis=-1) @ w["o_proj.weight"]
    assert_close(out, expected[None], what="LlamaAttention (6 heads over 2 kv heads) vs a per-head loop", atol=1e-4)


def test_generate_with_and_without_cache_agree_at_odd_lengths():
    rng = np.random.default_rng(8082)
    model = L.LlamaModel(vocab_size=29, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=20,
                         max_seq_len=40, rope_theta=300.0, rng=rng)
    state = {k: (np.asarray(v) + rng.standard_normal(np.shape(v)).astype(np.float32) * 0.5)
             for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    prompt = rng.integers(0, 29, (2, 3))
    a = np.asarray(L.generate(model, prompt, 21))
    b = np.asarray(L.generate(model, prompt, 21, use_cache=False))
    assert np.array_equal(a, b), f"generate with the cache {a.tolist()} differs from without {b.tolist()}"


def test_model_at_scattered_positions_against_float64():
    """A one-block Llama at positions [4, 9, 10, 30, 31] against the block written out here."""
    rng = np.random.default_rng(8083)
    D, H, Hkv, F, V, theta, eps = 16, 4, 2, 24, 19, 700.0, 1e-5
    d = D // H
    model = L.LlamaModel(vocab_size=V, d_model=D, num_layers=1, num_heads=H, num_kv_heads=Hkv, d_ff=F, max_seq_len=40,
                         rms_norm_eps=eps, rope_theta=theta, rng=rng)
    state = {k: (np.asarray(v) + rng.standard_normal(np.shape(v)).astype(np.float32) * 0.4).astype(np.float32)
             for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    ids = rng.integers(0, V, (2, 5))
    pos = np.array([4, 9, 10, 30, 31])
    p = {k: v.astype(np.float64) for k, v in state.items()}

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    x = p["embed_tokens.weight"][ids]
    h = rms(x, p["layers.0.input_layernorm.weight"])
    heads = []
    for j in range(H):
        g = j // (H // Hkv)
        q = _rope64(h @ p["layers.0.self_attn.q_proj.weight"][:, j * d:(j + 1) * d], pos, theta)
        k = _rope64(h @ p["layers.0.self_attn.k_proj.weight"][:, g * d:(g + 1) * d], pos, theta)
        v = h @ p["layers.0.self_attn.v_proj.weight"][:, g * d:(g + 1) * d]
        s = q @ k.swapaxes(-1, -2) / np.sqrt(d) + np.triu(np.full((5, 5), -np.inf), 1)
        w = np.exp(s - s.max(-1, keepdims=True))
        heads.append(w / w.sum(-1, keepdims=True) @ v)
    x = x + np.concatenate(heads, -1) @ p["layers.0.self_attn.o_proj.weight"]
    h = rms(x, p["layers.0.post_attention_layernorm.weight"])
    gate = h @ p["layers.0.mlp.gate_proj.weight"]
    x = x + (gate / (1 + np.exp(-gate)) * (h @ p["layers.0.mlp.up_proj.weight"])) @ p["layers.0.mlp.down_proj.weight"]
    expected = rms(x, p["norm.weight"]) @ p["lm_head.weight"]
    assert_close(model(ids, pos), expected, what="a one-block LlamaModel at positions [4, 9, 10, 30, 31]", atol=1e-4)
