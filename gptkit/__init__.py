"""Helpers the kit provides to student code: the layer base class and input checks.

Student files may import from here; nothing in this package contains lab answers.
"""

from gptkit.checks import as_float_array, check_last_dim, check_length, check_ndim
from gptkit.init import make_rng, normal
from gptkit.layer import Layer

__all__ = [
    "Layer",
    "as_float_array",
    "check_last_dim",
    "check_length",
    "check_ndim",
    "make_rng",
    "normal",
]
