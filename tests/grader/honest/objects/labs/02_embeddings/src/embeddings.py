"""Lab 02 · embeddings, object style: both learned tables share an abstract base that
checks its rows, ``numbers`` for the offset.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
import numpy as np

from gptkit import Layer, check_length, check_ndim, make_rng, normal


class RowTable(ABC):
    """Something that hands out rows of a 2-D table and must say which rows exist."""

    @abstractmethod
    def row_count(self) -> int:
        ...

    def rows(self, table: np.ndarray, start: int, stop: int, what: str) -> np.ndarray:
        if not isinstance(start, numbers.Integral) or stop > self.row_count():
            raise ValueError(f"{what} {start}…{stop - 1} is past the table: max_seq_len={self.row_count()}")
        return table[start:stop]


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
        outside = (token_ids < 0) | (token_ids >= self.vocab_size)
        if np.any(outside):
            index = tuple(int(i) for i in np.argwhere(outside)[0])
            raise ValueError(
                f"token id {int(token_ids[index])} at index {index} is outside the vocabulary [0, {self.vocab_size})")
        return np.take(self.weight, token_ids, axis=0)


class PositionalEmbedding(Layer, RowTable):
    """One learned D-vector per absolute position 0 … L-1. Parameter: ``weight`` (L, D)."""

    def __init__(self, max_seq_len: int, d_model: int, *, rng: np.random.Generator | None = None):
        self.max_seq_len = check_length(max_seq_len, "max_seq_len")
        self.d_model = check_length(d_model, "d_model")
        self.weight = normal(make_rng(rng), max_seq_len, d_model)

    def row_count(self) -> int:
        return self.max_seq_len

    def forward(self, seq_len: int, offset: int = 0) -> np.ndarray:
        """The embeddings of positions offset … offset+seq_len-1, as (seq_len, D).

        ``offset`` is where the sequence starts (during generation with a cache, the
        new token's position). Raises ValueError past ``max_seq_len``.
        """
        seq_len = check_length(seq_len, "seq_len")
        offset = check_length(offset, "offset", minimum=0)
        return self.rows(self.weight, offset, offset + seq_len, "positions")


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> np.ndarray:
    """Fixed encodings of "Attention Is All You Need", as float32 (max_len, D).

    Column 2i is sin(pos / 10000^(2i/D)) and column 2i+1 is cos of the same angle.
    """
    max_len = check_length(max_len, "max_len")
    d_model = check_length(d_model, "d_model")
    positions = np.arange(max_len, dtype=np.float64)[:, np.newaxis]
    pairs = np.arange(0, d_model, 2, dtype=np.float64) / d_model
    angles = positions / np.power(10000.0, pairs)
    encoding = np.zeros((max_len, d_model))
    encoding[:, ::2] = np.sin(angles)
    encoding[:, 1::2] = np.cos(angles)[:, : d_model // 2]
    return encoding.astype(np.float32)


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
        tokens = self.wte(token_ids)
        return tokens + self.wpe(token_ids.shape[1], offset)
