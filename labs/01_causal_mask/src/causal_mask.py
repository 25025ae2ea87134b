# Lab 01: fill in each `# YOUR CODE HERE` block in this file, then run `uv run pytest -m lab01`.
"""Lab 01 · Causal masking, softmax and scaled dot-product attention.

Shapes: B batch, T queries, S keys (S ≥ T once a KV cache holds earlier tokens),
D model width, d per-head width. Arrays are float32 unless said otherwise.
"""

from __future__ import annotations

import math

import numpy as np

from gptkit import Layer, as_float_array, check_last_dim, check_length, check_ndim, make_rng, normal


def causal_mask(seq_len: int, kv_len: int | None = None) -> np.ndarray:
    """Which keys each query may attend to.

    Args:
        seq_len: T, the number of queries.
        kv_len: S ≥ T, the number of keys (defaults to T). The queries are the *last*
            T positions: query i sits at absolute position S - T + i.

    Returns:
        bool array (T, S): ``mask[i, j]`` is True when query i may attend to key j,
        i.e. when key j is not in query i's future (its own position included).
    """
    T = check_length(seq_len, "seq_len")
    S = T if kv_len is None else check_length(kv_len, "kv_len")
    if S < T:
        raise ValueError(f"kv_len ({S}) must be at least seq_len ({T}): every query needs its own key")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 01 · causal_mask: build the (T, S) boolean causal mask')


def additive_mask(mask: np.ndarray, dtype=np.float32) -> np.ndarray:
    """A boolean mask as numbers to add to attention scores.

    Returns an array of ``mask``'s shape and the given dtype: 0 where ``mask`` is
    True (may attend), -inf where it is False.
    """
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be a bool array, got dtype {mask.dtype}")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 01 · additive_mask: turn True/False into 0/-inf')


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    Works for any scores, however large, and for -inf entries (they get weight 0).
    Same shape and dtype as ``x``; entries along ``axis`` sum to 1.
    """
    x = as_float_array(x, "x")
    check_ndim(x, "x", min_ndim=1)
    # YOUR CODE HERE
    raise NotImplementedError('Lab 01 · softmax: subtract the max along the axis, exponentiate, normalise')


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q kᵀ / √d, masked) v.

    Args:
        q: (..., T, d) queries.
        k: (..., S, d) keys.
        v: (..., S, d_v) values.
        mask: optional bool array broadcastable to (..., T, S); True = may attend.

    Returns:
        out: (..., T, d_v) the weighted sums of values.
        weights: (..., T, S) the attention weights; each row sums to 1.
    """
    q, k, v = (as_float_array(a, n) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    for a, n in ((q, "q"), (k, "k"), (v, "v")):
        check_ndim(a, n, min_ndim=2, shape_hint="(..., T or S, d)")
    check_last_dim(k, "k", q.shape[-1])
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys, got k {k.shape} and v {v.shape}")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a bool array (True = may attend), got dtype {mask.dtype}")
        want = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
        try:
            np.broadcast_shapes(mask.shape, want)
        except ValueError:
            raise ValueError(f"mask of shape {mask.shape} does not broadcast to the scores' shape {want}") from None
    # YOUR CODE HERE
    raise NotImplementedError('Lab 01 · scaled_dot_product_attention: scores, scale by 1/sqrt(d), mask before softmax, weight the values')


class CausalSelfAttention(Layer):
    """Single-head causal self-attention with inspectable weights.

    Parameters (each (D, D), applied as ``x @ W``): ``W_q``, ``W_k``, ``W_v``, ``W_o``.
    """

    def __init__(self, d_model: int, *, rng: np.random.Generator | None = None):
        self.d_model = check_length(d_model, "d_model")
        rng = make_rng(rng)
        self.W_q = normal(rng, d_model, d_model)
        self.W_k = normal(rng, d_model, d_model)
        self.W_v = normal(rng, d_model, d_model)
        self.W_o = normal(rng, d_model, d_model)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x (B, T, D) → (out (B, T, D), weights (B, T, T)); token t sees tokens ≤ t."""
        x = as_float_array(x, "x")
        check_ndim(x, "x", ndim=3, shape_hint="(B, T, D)")
        check_last_dim(x, "x", self.d_model)
        # YOUR CODE HERE
        raise NotImplementedError('Lab 01 · CausalSelfAttention.forward: project to q, k, v; causal attention; output projection')
