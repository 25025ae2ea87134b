"""Lab 04 · multi-head attention, the pre-norm block and GPT-2, object style: a config
dataclass, q/k/v kept in a dict by name, and a state dict collected into an OrderedDict
by walking each layer's ``vars``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from causal_mask import additive_mask, causal_mask, softmax
from embeddings import PositionalEmbedding, TokenEmbedding
from gptkit import Layer, as_float_array, check_last_dim, check_length, check_ndim, make_rng
from layers import Dropout, FeedForward, LayerNorm, Linear

# Queries per block in ``MultiHeadAttention.attend``: big enough for fast matrix
# products, small enough that skipping the future keys of each block saves work.
QUERY_BLOCK = 128


@dataclass(frozen=True)
class GPTConfig:
    """The sizes a GPTModel is built from (GPTModel's keyword arguments)."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    max_seq_len: int
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5


def _collect(obj, prefix: str, into: OrderedDict) -> OrderedDict:
    """Every public array of ``obj``, then each sub-layer's parameters as that layer names
    them (a layer that overrides ``named_parameters``, like lab 11's adapters, is heard)."""
    for name, value in vars(obj).items():
        if name.startswith("_"):
            continue
        if isinstance(value, np.ndarray):
            into[prefix + name] = value
        elif isinstance(value, Layer):
            into.update(value.named_parameters(f"{prefix}{name}."))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                into.update(item.named_parameters(f"{prefix}{name}.{i}."))
    return into


class MultiHeadAttention(Layer):
    """Causal self-attention with H heads and one fused q/k/v projection, as in GPT-2.

    Sub-layers (GPT-2's names):
        ``c_attn``: Linear D → 3D. Its output columns are three blocks of width D —
            q = columns 0…D-1, k = D…2D-1, v = 2D…3D-1 — and within each block head h
            owns columns h·d_head … (h+1)·d_head - 1.
        ``c_proj``: Linear D → D, applied to the heads' outputs put back side by side.
        ``attn_dropout`` (on the attention weights) and ``resid_dropout`` (on the
            output): identity in eval mode.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, *,
                 rng: np.random.Generator | None = None):
        self.d_model = check_length(d_model, "d_model")
        self.num_heads = check_length(num_heads, "num_heads")
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) must be divisible by num_heads ({num_heads}): "
                f"every head gets d_model / num_heads columns"
            )
        self.d_head = d_model // num_heads
        rng = make_rng(rng)
        self.c_attn = Linear(d_model, 3 * d_model, rng=rng)
        self.c_proj = Linear(d_model, d_model, rng=rng)
        self.attn_dropout = Dropout(dropout, rng=rng)
        self.resid_dropout = Dropout(dropout, rng=rng)

    def split_heads(self, x: np.ndarray) -> np.ndarray:
        """(B, T, D) → (B, H, T, d_head): head h gets columns h·d_head … (h+1)·d_head - 1."""
        check_ndim(x, "x", ndim=3, shape_hint="(B, T, D)")
        check_last_dim(x, "x", self.d_model)
        B, T, _ = x.shape
        return x.reshape(B, T, self.num_heads, self.d_head).transpose(0, 2, 1, 3)

    def merge_heads(self, x: np.ndarray) -> np.ndarray:
        """(B, H, T, d_head) → (B, T, D): the inverse of ``split_heads``."""
        check_ndim(x, "x", ndim=4, shape_hint="(B, H, T, d_head)")
        if x.shape[1] != self.num_heads or x.shape[3] != self.d_head:
            raise ValueError(
                f"x must have shape (B, {self.num_heads}, T, {self.d_head}), got {x.shape}"
            )
        B, _, T, _ = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, T, self.d_model)

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Causal scaled dot-product attention for every head at once.

        Args:
            q: (B, H, T, d_head) queries; query i sits at position S - T + i.
            k: (B, H, S, d_head) keys.
            v: (B, H, S, d_head) values.

        Returns:
            (B, H, T, d_head): each query's weighted sum of the values it may see.
        """
        if q.ndim != 4 or k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
            raise ValueError(
                f"q must be (B, H, T, d_head) and k, v (B, H, S, d_head); "
                f"got q {q.shape}, k {k.shape}, v {v.shape}"
            )
        T, S = q.shape[2], k.shape[2]
        scale = 1.0 / math.sqrt(self.d_head)  # a Python float: float32 stays float32
        q = q * scale  # scaling the queries once costs less than scaling every score
        out = np.empty(q.shape, dtype=np.result_type(q, v))  # (B, H, T, d_head)
        # Queries in blocks: block [start, stop) sees keys 0 … S-T+stop-1 only, so the
        # scores above the diagonal (half of them) are never computed.
        for start in range(0, T, QUERY_BLOCK):
            stop = min(start + QUERY_BLOCK, T)
            n_keys = S - T + stop
            scores = q[:, :, start:stop] @ k[:, :, :n_keys].swapaxes(-1, -2)  # (B, H, t, n_keys), scaled
            if stop > start + 1:  # a lone query (one decoding step) may see every key: nothing to mask
                scores += additive_mask(causal_mask(stop - start, n_keys), scores.dtype)  # -inf on future keys
            weights = self.attn_dropout(softmax(scores, axis=-1))  # rows sum to 1
            out[:, :, start:stop] = weights @ v[:, :, :n_keys]  # (B, H, t, d_head)
        return out

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (B, T, D) → (B, T, D); position t only sees positions ≤ t."""
        x = as_float_array(x, "x")
        check_ndim(x, "x", ndim=3, shape_hint="(B, T, D)")
        check_last_dim(x, "x", self.d_model)
        qkv = self.c_attn(x)  # (B, T, 3D)
        blocks = dict(zip("qkv", np.split(qkv, 3, axis=-1)))  # q's block first, then k, then v
        heads = {name: self.split_heads(block) for name, block in blocks.items()}  # (B, H, T, d_head)
        out = self.merge_heads(self.attend(**heads))  # (B, T, D)
        return self.resid_dropout(self.c_proj(out))  # (B, T, D)


class TransformerBlock(Layer):
    """GPT-2's pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).

    Sub-layers: ``ln_1`` (LayerNorm), ``attn`` (MultiHeadAttention), ``ln_2`` (LayerNorm),
    ``mlp`` (FeedForward D → F → D).
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, *,
                 layer_norm_eps: float = 1e-5, rng: np.random.Generator | None = None):
        rng = make_rng(rng)
        self.ln_1 = LayerNorm(d_model, eps=layer_norm_eps)
        self.attn = MultiHeadAttention(d_model, num_heads, dropout, rng=rng)
        self.ln_2 = LayerNorm(d_model, eps=layer_norm_eps)
        self.mlp = FeedForward(d_model, d_ff, dropout, rng=rng)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (B, T, D) → (B, T, D)."""
        x = x + self.attn(self.ln_1(x))  # (B, T, D)
        x = x + self.mlp(self.ln_2(x))  # (B, T, D)
        return x


class GPTModel(Layer):
    """GPT-2: embeddings → blocks → final LayerNorm → logits tied to the token embedding.

    Sub-layers (GPT-2's names): ``wte`` (TokenEmbedding V × D), ``wpe``
    (PositionalEmbedding L × D), ``drop`` (Dropout on the embeddings), ``h`` (list of
    ``num_layers`` TransformerBlocks), ``ln_f`` (LayerNorm). There is no separate output
    matrix: the logits are ``ln_f(x) @ wte.weight.T``.
    """

    def __init__(self, vocab_size: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, max_seq_len: int, dropout: float = 0.0,
                 layer_norm_eps: float = 1e-5, *, rng: np.random.Generator | None = None):
        self.config = GPTConfig(vocab_size, d_model, num_layers, num_heads, d_ff, max_seq_len,
                                dropout, layer_norm_eps)
        self.vocab_size = check_length(vocab_size, "vocab_size")
        self.d_model = check_length(d_model, "d_model")
        self.num_layers = check_length(num_layers, "num_layers")
        self.max_seq_len = check_length(max_seq_len, "max_seq_len")
        rng = make_rng(rng)
        self.wte = TokenEmbedding(vocab_size, d_model, rng=rng)
        self.wpe = PositionalEmbedding(max_seq_len, d_model, rng=rng)
        self.drop = Dropout(dropout, rng=rng)
        self.h = [
            TransformerBlock(d_model, num_heads, d_ff, dropout, layer_norm_eps=layer_norm_eps, rng=rng)
            for _ in range(num_layers)
        ]
        self.ln_f = LayerNorm(d_model, eps=layer_norm_eps)

    def forward(self, token_ids: np.ndarray) -> np.ndarray:
        """token_ids (B, T) int → logits (B, T, V): row t scores the token after position t."""
        token_ids = np.asarray(token_ids)
        check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, T)")
        if token_ids.shape[1] > self.max_seq_len:
            raise ValueError(
                f"a sequence of {token_ids.shape[1]} tokens is longer than the model's "
                f"max_seq_len={self.max_seq_len}: there are no positional embeddings past that"
            )
        T = token_ids.shape[1]
        x = self.drop(self.wte(token_ids) + self.wpe(T))  # (B, T, D) + (T, D)
        for block in self.h:
            x = block(x)  # (B, T, D)
        x = self.ln_f(x)  # (B, T, D)
        return x @ self.wte.weight.T  # (B, T, D) @ (D, V) → (B, T, V): the output head is tied

    def state_dict(self) -> OrderedDict:
        """GPT-2's names in the order the layers hold them (the arrays, not copies)."""
        return _collect(self, "", OrderedDict())
