"""Parameter initialisation shared by every layer: GPT-2's N(0, 0.02), in float32."""

from __future__ import annotations

import numpy as np


def make_rng(rng: np.random.Generator | None) -> np.random.Generator:
    """The generator to draw from: the one given, or a fresh unseeded one."""
    if rng is None:
        return np.random.default_rng()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def normal(rng: np.random.Generator, *shape: int, std: float = 0.02) -> np.ndarray:
    """float32 weights drawn from N(0, std²)."""
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32, copy=False)
