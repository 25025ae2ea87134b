"""Fixtures for lab 01: random inputs and the reference outputs (float32)."""

import numpy as np

NEEDS_TORCH = False


def build() -> dict[str, dict[str, np.ndarray]]:
    import causal_mask as ref

    rng = np.random.default_rng(101)
    cases = {}
    for T, S in [(1, 1), (4, 4), (5, 5), (3, 7), (1, 6)]:
        cases[f"mask_T{T}_S{S}"] = {"mask": ref.causal_mask(T, S)}

    x = rng.normal(0, 3, size=(3, 4, 9)).astype(np.float32)
    cases["softmax"] = {"x": x, "y_last": ref.softmax(x), "y_axis1": ref.softmax(x, axis=1)}

    B, H, T, S, d, dv = 2, 3, 5, 7, 16, 8
    q = rng.normal(0, 1, (B, H, T, d)).astype(np.float32)
    k = rng.normal(0, 1, (B, H, S, d)).astype(np.float32)
    v = rng.normal(0, 1, (B, H, S, dv)).astype(np.float32)
    mask = ref.causal_mask(T, S)
    out, w = ref.scaled_dot_product_attention(q, k, v, mask)
    out_nomask, w_nomask = ref.scaled_dot_product_attention(q, k, v)
    cases["sdpa"] = {"q": q, "k": k, "v": v, "mask": mask, "out": out, "weights": w,
                     "out_nomask": out_nomask, "weights_nomask": w_nomask}

    D = 12
    layer = ref.CausalSelfAttention(D, rng=rng)
    for name in ("W_q", "W_k", "W_v", "W_o"):  # larger than N(0, 0.02) so attention is far from uniform
        setattr(layer, name, rng.normal(0, 0.4, (D, D)).astype(np.float32))
    x = rng.normal(0, 1, (2, 6, D)).astype(np.float32)
    out, w = layer(x)
    cases["self_attention"] = {"x": x, "W_q": layer.W_q, "W_k": layer.W_k, "W_v": layer.W_v,
                               "W_o": layer.W_o, "out": out, "weights": w}
    return cases
