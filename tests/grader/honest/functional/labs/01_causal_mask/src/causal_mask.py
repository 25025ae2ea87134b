"""Lab 01 · causal mask, softmax and attention, written as small pure functions.

Honest-corpus submission, functional style: a cached mask builder, helpers composed
with functools.partial/reduce, operator and itertools.
"""

from __future__ import annotations

import math
import operator
from functools import lru_cache, partial, reduce
from itertools import starmap

import numpy as np

from gptkit import Layer, as_float_array, check_last_dim, check_length, check_ndim, make_rng, normal


@lru_cache(maxsize=64)
def _lower_triangle(seq_len: int, kv_len: int) -> np.ndarray:
    """The (T, S) mask for one shape, computed once: query i sits at S - T + i."""
    query_pos = np.arange(kv_len - seq_len, kv_len)[:, None]
    key_pos = np.arange(kv_len)[None, :]
    mask = operator.le(key_pos, query_pos)
    mask.flags.writeable = False  # shared between callers through the cache
    return mask


def causal_mask(seq_len: int, kv_len: int | None = None) -> np.ndarray:
    """Which keys each query may attend to: bool (T, S), True = may attend."""
    T = check_length(seq_len, "seq_len")
    S = T if kv_len is None else check_length(kv_len, "kv_len")
    if S < T:
        raise ValueError(f"kv_len ({S}) must be at least seq_len ({T}): every query needs its own key")
    return _lower_triangle(T, S).copy()


def additive_mask(mask: np.ndarray, dtype=np.float32) -> np.ndarray:
    """0 where ``mask`` is True, -inf where it is False."""
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be a bool array, got dtype {mask.dtype}")
    return np.where(mask, 0.0, -np.inf).astype(dtype)


def _shifted(x: np.ndarray, axis: int) -> np.ndarray:
    """x minus its max along ``axis`` (a slice of only -inf is left at -inf, not nan)."""
    top = np.max(x, axis=axis, keepdims=True)
    return x - np.where(np.isfinite(top), top, 0).astype(x.dtype)


def _normalise(e: np.ndarray, axis: int) -> np.ndarray:
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``; same shape and dtype as ``x``."""
    x = as_float_array(x, "x")
    check_ndim(x, "x", min_ndim=1)
    steps = (partial(_shifted, axis=axis), np.exp, partial(_normalise, axis=axis))
    return reduce(lambda value, step: step(value), steps, x)


def _transpose_last(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


def _scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    return operator.matmul(q, _transpose_last(k)) / math.sqrt(q.shape[-1])


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q kᵀ / √d, masked) v → (out (..., T, d_v), weights (..., T, S))."""
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
    scores = _scores(q, k)
    if mask is not None:
        scores = scores + additive_mask(mask, scores.dtype)
    weights = softmax(scores)
    return weights @ v, weights


class CausalSelfAttention(Layer):
    """Single-head causal self-attention; ``W_q``, ``W_k``, ``W_v``, ``W_o`` are (D, D)."""

    def __init__(self, d_model: int, *, rng: np.random.Generator | None = None):
        self.d_model = check_length(d_model, "d_model")
        rng = make_rng(rng)
        self.W_q = normal(rng, d_model, d_model)
        self.W_k = normal(rng, d_model, d_model)
        self.W_v = normal(rng, d_model, d_model)
        self.W_o = normal(rng, d_model, d_model)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x (B, T, D) → (out (B, T, D), weights (B, T, T))."""
        x = as_float_array(x, "x")
        check_ndim(x, "x", ndim=3, shape_hint="(B, T, D)")
        check_last_dim(x, "x", self.d_model)
        q, k, v = starmap(operator.matmul, ((x, self.W_q), (x, self.W_k), (x, self.W_v)))
        out, weights = scaled_dot_product_attention(q, k, v, causal_mask(x.shape[1]))
        return out @ self.W_o, weights
