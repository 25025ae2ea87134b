"""Lab 01 · causal mask, softmax and attention, object style: a frozen dataclass that
knows where the queries sit, a named tuple for attention's two results, and the layer's
projections reached by name with getattr.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
import math

import numpy as np

from gptkit import Layer, as_float_array, check_last_dim, check_length, check_ndim, make_rng, normal


Attention = namedtuple("Attention", ["out", "weights"])


@dataclass(frozen=True)
class QueryWindow:
    """T queries that are the last T of S positions."""

    queries: int
    keys: int

    @property
    def first_position(self) -> int:
        return self.keys - self.queries

    def allowed(self) -> np.ndarray:
        rows = np.arange(self.queries)[:, np.newaxis] + self.first_position
        return np.arange(self.keys)[np.newaxis, :] <= rows


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
    return QueryWindow(queries=T, keys=S).allowed()


def additive_mask(mask: np.ndarray, dtype=np.float32) -> np.ndarray:
    """A boolean mask as numbers to add to attention scores.

    Returns an array of ``mask``'s shape and the given dtype: 0 where ``mask`` is
    True (may attend), -inf where it is False.
    """
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be a bool array, got dtype {mask.dtype}")
    out = np.zeros(mask.shape, dtype=dtype)
    out[~mask] = -np.inf
    return out


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    Works for any scores, however large, and for -inf entries (they get weight 0).
    Same shape and dtype as ``x``; entries along ``axis`` sum to 1.
    """
    x = as_float_array(x, "x")
    check_ndim(x, "x", min_ndim=1)
    largest = x.max(axis=axis, keepdims=True)
    largest[~np.isfinite(largest)] = 0
    exps = np.exp(x - largest)
    return exps / exps.sum(axis=axis, keepdims=True)


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
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return Attention(np.matmul(weights, v), weights)


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
        q, k, v = (x @ getattr(self, f"W_{name}") for name in "qkv")
        result = scaled_dot_product_attention(q, k, v, causal_mask(x.shape[1]))
        return result.out @ self.W_o, result.weights
