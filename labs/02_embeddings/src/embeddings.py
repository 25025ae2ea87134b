# Lab 02: fill in each `# YOUR CODE HERE` block in this file, then run `uv run pytest -m lab02`.
"""Lab 02 · Token embeddings, learned positional embeddings and sinusoidal encodings.

Shapes: B batch, T tokens, V vocabulary size, D model width, L max sequence length.
"""

from __future__ import annotations

import numpy as np

from gptkit import Layer, check_length, check_ndim, make_rng, normal


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
        # YOUR CODE HERE
        raise NotImplementedError('Lab 02 · TokenEmbedding.forward: reject ids outside the vocabulary, then look the rows up')


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
        # YOUR CODE HERE
        raise NotImplementedError('Lab 02 · PositionalEmbedding.forward: check the positions fit, then slice them out')


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> np.ndarray:
    """Fixed encodings of "Attention Is All You Need", as float32 (max_len, D).

    Column 2i is sin(pos / 10000^(2i/D)) and column 2i+1 is cos of the same angle.
    """
    max_len = check_length(max_len, "max_len")
    d_model = check_length(d_model, "d_model")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 02 · sinusoidal_positional_encoding: angles pos / 10000^(2i/D); sin on even columns, cos on odd')


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
        # YOUR CODE HERE
        raise NotImplementedError('Lab 02 · GPTEmbedding.forward: look up tokens and add the positions they sit at')
