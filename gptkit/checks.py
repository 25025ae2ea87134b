"""Input checks that turn bad input into a clear error instead of a wrong answer.

They live outside the student's code (the stubs keep the calls), so every lab
reports wrong shapes and ranks in the same words.
"""

from __future__ import annotations

import numpy as np


def as_float_array(x, name: str) -> np.ndarray:
    """``x`` as a floating ndarray: float inputs keep their dtype, ints/bools become float32."""
    arr = np.asarray(x)
    if arr.dtype.kind in "biu":
        return arr.astype(np.float32)
    if arr.dtype.kind != "f":
        raise TypeError(f"{name} must be a float array, got dtype {arr.dtype}")
    return arr


def check_ndim(x: np.ndarray, name: str, *, ndim: int | None = None, min_ndim: int | None = None,
               shape_hint: str = "") -> None:
    """Raise ValueError naming ``name`` when ``x`` has the wrong number of dimensions."""
    hint = f" {shape_hint}" if shape_hint else ""
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions{hint}, got shape {x.shape}")
    if min_ndim is not None and x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions{hint}, got shape {x.shape}")


def check_last_dim(x: np.ndarray, name: str, size: int) -> None:
    """Raise ValueError when the feature (last) dimension of ``x`` is not ``size``."""
    if x.ndim == 0 or x.shape[-1] != size:
        raise ValueError(f"{name} must have last dimension {size}, got shape {x.shape}")



def check_length(n, name: str, *, minimum: int = 1) -> int:
    """A sequence length or size as a Python int ≥ ``minimum``, or a clear error."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if n < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {n}")
    return int(n)
