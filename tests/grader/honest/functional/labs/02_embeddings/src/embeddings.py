"""Lab 02 · embeddings, functional style: range checks and the encoding table as small
helpers (a cached frequency table, itertools for the first offending id).
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import compress, product
import numpy as np

from gptkit import Layer, check_length, check_ndim, make_rng, normal


def _first_outside(ids: np.ndarray, size: int) -> tuple[int, tuple[int, ...]] | None:
    """The first id outside [0, size) and its index, or None."""
    flat_bad = ((ids < 0) | (ids >= size)).ravel()
    if not flat_bad.any():
        return None
    where = next(compress(product(*map(range, ids.shape)), flat_bad), None)
    return None if where is None else (int(ids[where]), where)


@lru_cache(maxsize=16)
def _inverse_frequencies(d_model: int) -> tuple[float, ...]:
    """1 / 10000^(2i/D) for each pair of columns, as plain floats."""
    return tuple(math.pow(10000.0, -two_i / d_model) for two_i in range(0, d_model, 2))


class TokenEmbedding(Layer):
    """Look up one learned D-vector per token id. Parameter: ``weight`` (V, D)."""

    def __init__(self, vocab_size: int, d_model: int, *, rng: np.random.Generator | None = None):
        self.vocab_size = check_length(vocab_size, "vocab_size")
        self.d_model = check_length(d_model, "d_model")
        self.weight = normal(make_rng(rng), vocab_size, d_model)

    def forward(self, token_ids: np.ndarray) -> np.ndarray:
        """token_ids: int array of any shape, e.g. (B, T) → (B, T, D).

        Raises ValueError for an id outside [0, vocab_size): NumPy would silently read
        a wrong row for -1, so the check is part of the layer's job.
        """
        token_ids = np.asarray(token_ids)
        if token_ids.dtype.kind not in "iu":
            raise TypeError(f"token_ids must be integers, got dtype {token_ids.dtype}")
        found = _first_outside(token_ids, self.vocab_size)
        if found is not None:
            value, index = found
            raise ValueError(f"token id {value} at index {index} is outside the vocabulary [0, {self.vocab_size})")
        return self.weight[token_ids]


class PositionalEmbedding(Layer):
    """One learned D-vector per absolute position 0 … L-1. Parameter: ``weight`` (L, D)."""

    def __init__(self, max_seq_len: int, d_model: int, *, rng: np.random.Generator | None = None):
        self.max_seq_len = check_length(max_seq_len, "max_seq_len")
        self.d_model = check_length(d_model, "d_model")
        self.weight = normal(make_rng(rng), max_seq_len, d_model)

    def forward(self, seq_len: int, offset: int = 0) -> np.ndarray:
        """The embeddings of positions offset … offset+seq_len-1, as (seq_len, D).

        ``offset`` is where the sequence starts (during generation with a cache, the
        new token's position). Raises ValueError past ``max_seq_len``.
        """
        seq_len = check_length(seq_len, "seq_len")
        offset = check_length(offset, "offset", minimum=0)
        last = offset + seq_len
        if last > self.max_seq_len:
            raise ValueError(f"positions {offset}…{last - 1} do not fit: max_seq_len={self.max_seq_len}")
        return self.weight[offset:last]


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> np.ndarray:
    """Fixed encodings of "Attention Is All You Need", as float32 (max_len, D).

    Column 2i is sin(pos / 10000^(2i/D)) and column 2i+1 is cos of the same angle.
    """
    max_len = check_length(max_len, "max_len")
    d_model = check_length(d_model, "d_model")
    angles = np.outer(np.arange(max_len, dtype=np.float64), np.array(_inverse_frequencies(d_model)))
    columns = [f(angles[:, i // 2]) for i, f in zip(range(d_model), [np.sin, np.cos] * d_model)]
    return np.stack(columns, axis=1).astype(np.float32)


class GPTEmbedding(Layer):
    """Token embedding plus learned positional embedding: GPT-2's input layer.

    Sub-layers: ``wte`` (TokenEmbedding), ``wpe`` (PositionalEmbedding).
    """

    def __init__(self, vocab_size: int, max_seq_len: int, d_model: int, *,
                 rng: np.random.Generator | None = None):
        rng = make_rng(rng)
        self.wte = TokenEmbedding(vocab_size, d_model, rng=rng)
        self.wpe = PositionalEmbedding(max_seq_len, d_model, rng=rng)

    def forward(self, token_ids: np.ndarray, offset: int = 0) -> np.ndarray:
        """token_ids (B, T) int → (B, T, D): token t gets position offset + t."""
        token_ids = np.asarray(token_ids)
        check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, T)")
        return self.wte(token_ids) + self.wpe(token_ids.shape[1], offset)
