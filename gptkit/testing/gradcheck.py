"""Gradients by central differences, for the backward-pass tests."""

from __future__ import annotations

import numpy as np


def numeric_gradient(f, x, eps=1e-6) -> np.ndarray:
    """∂f/∂x by central differences, element by element (x is taken in float64)."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        up = f(x)
        x[idx] = old - eps
        down = f(x)
        x[idx] = old
        g[idx] = (up - down) / (2 * eps)
    return g
