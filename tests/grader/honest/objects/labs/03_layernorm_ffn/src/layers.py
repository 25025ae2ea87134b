"""Lab 03 · Linear, LayerNorm, GELU, Dropout and FeedForward, object style: an enum
picks the GELU form, Dropout names its mode with one, the MLP walks its stages by name.
"""

from __future__ import annotations

import contextlib
from enum import Enum
from typing import Callable
import math

import numpy as np

from gptkit import Layer, as_float_array, check_last_dim, check_length, make_rng, normal


class GeluForm(Enum):
    TANH = "tanh"  # GPT-2's "gelu_new"
    EXACT = "erf"


class Mode(Enum):
    TRAIN = "train"
    EVAL = "eval"


def _erf() -> Callable[[np.ndarray], np.ndarray]:
    erf = np.frompyfunc(math.erf, 1, 1)
    with contextlib.suppress(ImportError):
        from scipy.special import erf  # lab 03 allows scipy.special; math.erf is the fallback
    return erf


def _gelu(x: np.ndarray, form: GeluForm) -> np.ndarray:
    if form is GeluForm.TANH:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + np.tanh(inner))
    return (0.5 * x * (1.0 + _erf()(x / math.sqrt(2.0)))).astype(x.dtype)


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
        y = np.tensordot(x, self.weight, axes=([-1], [0]))
        if self.bias is not None:
            y = y + self.bias
        return y


class LayerNorm(Layer):
    """Normalise each feature vector to mean 0 and variance 1, then scale and shift.

    Parameters: ``weight`` (D,) gain, ``bias`` (D,) shift. The variance is the biased
    one (divide by D) and ``eps`` sits inside the square root, as in GPT-2.
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        self.d_model = check_length(d_model, "d_model")
        self.eps = float(eps)
        for name, fill in (("weight", np.ones), ("bias", np.zeros)):
            setattr(self, name, fill(d_model, dtype=np.float32))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., D) → (..., D)."""
        x = as_float_array(x, "x")
        check_last_dim(x, "x", self.d_model)
        centred = x - x.mean(axis=-1, keepdims=True)
        variance = (centred * centred).mean(axis=-1, keepdims=True)
        return centred / np.sqrt(variance + self.eps) * self.weight + self.bias


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (GPT-2's "gelu_new"):
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). Same shape and dtype as ``x``."""
    x = as_float_array(x, "x")
    return _gelu(x, GeluForm.TANH)


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """GELU, exact form: x·Φ(x) = 0.5·x·(1 + erf(x/√2)). ``scipy.special.erf`` is allowed here."""
    x = as_float_array(x, "x")
    return _gelu(x, GeluForm.EXACT)


class Dropout(Layer):
    """Inverted dropout: while training, zero each element with probability ``p`` and
    scale the survivors by 1/(1-p); in eval mode (the default) return ``x`` unchanged.
    The mask is drawn from ``rng``, so a seeded generator gives repeatable masks."""

    def __init__(self, p: float, *, rng: np.random.Generator | None = None):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability p must be in [0, 1), got {p}")
        self.p = float(p)
        self.rng = make_rng(rng)

    @property
    def mode(self) -> Mode:
        return Mode.TRAIN if self.training else Mode.EVAL

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (any shape) → same shape and dtype."""
        x = as_float_array(x, "x")
        if self.mode is Mode.EVAL or self.p == 0.0:
            return x
        survivors = self.rng.random(x.shape) >= self.p
        return np.where(survivors, x / (1.0 - self.p), 0.0).astype(x.dtype)


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

    stages = ("c_fc", gelu, "c_proj", "dropout")  # sub-layers by name, so loaded weights are used

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., D) → (..., D)."""
        for stage in self.stages:
            x = stage(x) if callable(stage) else getattr(self, stage)(x)
        return x
