# Lab 03: fill in each `# YOUR CODE HERE` block in this file, then run `uv run pytest -m lab03`.
"""Lab 03 · Linear, LayerNorm, GELU, Dropout and the position-wise FeedForward.

Shapes: (..., D) means any leading dimensions, features last. float32 throughout.
"""

from __future__ import annotations

import math

import numpy as np

from gptkit import Layer, as_float_array, check_last_dim, check_length, make_rng, normal


class Linear(Layer):
    """y = x @ weight + bias, with ``weight`` stored (d_in, d_out) as in GPT-2's checkpoint."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, *,
                 rng: np.random.Generator | None = None):
        self.d_in = check_length(d_in, "d_in")
        self.d_out = check_length(d_out, "d_out")
        self.weight = normal(make_rng(rng), d_in, d_out)
        self.bias = np.zeros(d_out, dtype=np.float32) if bias else None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., d_in) → (..., d_out)."""
        x = as_float_array(x, "x")
        check_last_dim(x, "x", self.d_in)
        # YOUR CODE HERE
        raise NotImplementedError('Lab 03 · Linear.forward: multiply by the (d_in, d_out) weight, add the bias if there is one')


class LayerNorm(Layer):
    """Normalise each feature vector to mean 0 and variance 1, then scale and shift.

    Parameters: ``weight`` (D,) gain, ``bias`` (D,) shift. The variance is the biased
    one (divide by D) and ``eps`` sits inside the square root, as in GPT-2.
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        self.d_model = check_length(d_model, "d_model")
        self.eps = float(eps)
        self.weight = np.ones(d_model, dtype=np.float32)
        self.bias = np.zeros(d_model, dtype=np.float32)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., D) → (..., D)."""
        x = as_float_array(x, "x")
        check_last_dim(x, "x", self.d_model)
        # YOUR CODE HERE
        raise NotImplementedError('Lab 03 · LayerNorm.forward: mean and biased variance over the last axis; (x-mean)/sqrt(var+eps); gain and shift')


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (GPT-2's "gelu_new"):
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). Same shape and dtype as ``x``."""
    x = as_float_array(x, "x")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 03 · gelu: the tanh form, with Python-float constants so float32 stays float32, x³ as x*x*x (not x**3), in place')


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """GELU, exact form: x·Φ(x) = 0.5·x·(1 + erf(x/√2)). ``scipy.special.erf`` is allowed here."""
    x = as_float_array(x, "x")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 03 · gelu_exact: the erf form')


class Dropout(Layer):
    """Inverted dropout: while training, zero each element with probability ``p`` and
    scale the survivors by 1/(1-p); in eval mode (the default) return ``x`` unchanged.
    The mask is drawn from ``rng``, so a seeded generator gives repeatable masks."""

    def __init__(self, p: float, *, rng: np.random.Generator | None = None):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability p must be in [0, 1), got {p}")
        self.p = float(p)
        self.rng = make_rng(rng)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (any shape) → same shape and dtype."""
        x = as_float_array(x, "x")
        # YOUR CODE HERE
        raise NotImplementedError('Lab 03 · Dropout.forward: identity unless training; keep with probability 1-p and rescale')


class FeedForward(Layer):
    """Position-wise MLP: Linear(D→F) → GELU (tanh) → Linear(F→D) → Dropout.

    Sub-layers (GPT-2's names): ``c_fc``, ``c_proj``, ``dropout``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, *,
                 rng: np.random.Generator | None = None):
        rng = make_rng(rng)
        self.c_fc = Linear(d_model, d_ff, rng=rng)
        self.c_proj = Linear(d_ff, d_model, rng=rng)
        self.dropout = Dropout(dropout, rng=rng)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., D) → (..., D)."""
        # YOUR CODE HERE
        raise NotImplementedError('Lab 03 · FeedForward.forward: expand, GELU, project back, dropout')
