"""Lab 09 · The original Transformer's encoder–decoder: padding masks, cross-attention,
post-norm (and pre-norm) blocks, a seq2seq model laid out like HuggingFace's MarianMT, and
greedy decoding that runs the encoder once and caches the cross-attention keys and values.

Shapes: B batch, S source tokens (keys of the cross-attention), T target tokens (queries),
D model width, H heads, d_head = D / H, F feed-forward width, V vocabulary size, L the
longest sequence the positions cover. float32 throughout; masks are bool, True = may attend.

    src_ids (B, S) ─ embed ─ encoder layers ──────────────── memory (B, S, D)
                                                                │ keys, values
    tgt_ids (B, T) ─ embed ─ decoder layers: self-attn (causal) ─ cross-attn ─ FFN ─ logits (B, T, V)

Parameter names follow MarianMT's (``encoder.layers.0.self_attn.q_proj.weight`` …), with
every Linear weight stored (d_in, d_out) as in the rest of the kit.
"""

from __future__ import annotations

import math

import numpy as np

from causal_mask import causal_mask, softmax
from embeddings import PositionalEmbedding, TokenEmbedding, sinusoidal_positional_encoding
from gptkit import Layer, as_float_array, check_last_dim, check_length, check_ndim, make_rng
from layers import Dropout, LayerNorm, Linear, gelu_exact

# "gelu" is the exact (erf) form, as torch's and Marian's "gelu"; "swish" (HuggingFace's
# name for it: nn.SiLU) and "silu" are both x·σ(x)
ACTIVATIONS = ("relu", "gelu", "silu", "swish")


def _check_keep(keep, name: str) -> np.ndarray:
    keep = np.asarray(keep)
    check_ndim(keep, name, ndim=2, shape_hint="(B, S)")
    if keep.dtype != bool:
        raise TypeError(f"{name} must be a bool array (True = a real token), got dtype {keep.dtype}")
    return keep


# -- masks ------------------------------------------------------------------------------------

def padding_mask(token_ids: np.ndarray, pad_id: int) -> np.ndarray:
    """bool (B, S): True where ``token_ids`` holds a real token, False at ``pad_id``."""
    token_ids = np.asarray(token_ids)
    check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, S)")
    ### BEGIN SOLUTION compare every id with the padding id
    return token_ids != pad_id
    ### END SOLUTION


def length_mask(lengths, max_len: int) -> np.ndarray:
    """bool (B, max_len): row b is True at positions 0 … lengths[b]-1 (right padding).
    An empty batch (B = 0) gives an empty (0, max_len) mask."""
    lengths = np.asarray(lengths)
    check_ndim(lengths, "lengths", ndim=1, shape_hint="(B,)")
    max_len = check_length(max_len, "max_len", minimum=0)
    if lengths.size and (lengths.min() < 0 or lengths.max() > max_len):
        raise ValueError(f"lengths must be in 0 … max_len={max_len}, got {lengths.tolist()}")
    ### BEGIN SOLUTION compare the positions 0 … max_len-1 with each row's length
    return np.arange(max_len)[None, :] < lengths[:, None]
    ### END SOLUTION


def encoder_mask(src_keep: np.ndarray) -> np.ndarray:
    """bool (B, 1, S, S) for the encoder's self-attention: every source position may see
    every real source token (no causal mask); padded keys are hidden."""
    src_keep = _check_keep(src_keep, "src_keep")
    B, S = src_keep.shape
    ### BEGIN SOLUTION the key-padding row repeated for every query
    return np.broadcast_to(src_keep[:, None, None, :], (B, 1, S, S))
    ### END SOLUTION


def cross_attention_mask(src_keep: np.ndarray, tgt_len: int) -> np.ndarray:
    """bool (B, 1, T, S) for the cross-attention: each of the T target queries may see every
    real source token, none of the padding. No causal mask: the source is all known."""
    src_keep = _check_keep(src_keep, "src_keep")
    T = check_length(tgt_len, "tgt_len")
    B, S = src_keep.shape
    ### BEGIN SOLUTION the source's key-padding row (B, 1, 1, S) repeated for the T queries
    return np.broadcast_to(src_keep[:, None, None, :], (B, 1, T, S))
    ### END SOLUTION


def decoder_mask(tgt_keep: np.ndarray) -> np.ndarray:
    """bool (B, 1, T, T) for the decoder's self-attention: query t may see key u when
    u ≤ t (causal) and u is a real target token (key padding)."""
    tgt_keep = _check_keep(tgt_keep, "tgt_keep")
    B, T = tgt_keep.shape
    ### BEGIN SOLUTION lab 01's causal mask AND the target's key-padding row
    return causal_mask(T)[None, None, :, :] & tgt_keep[:, None, None, :]
    ### END SOLUTION


# -- attention --------------------------------------------------------------------------------

class Attention(Layer):
    """Multi-head attention with separate q, k, v projections (MarianMT's names).

    Self-attention: queries, keys and values all come from ``x``. Cross-attention: the
    queries come from ``x`` (the decoder stream) and the keys and values from ``memory``
    (the encoder's output). Which positions may be seen is the ``mask``'s job alone.

    Sub-layers: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (Linear D → D each),
    ``dropout`` (on the attention weights). Ints ``d_model``, ``num_heads``, ``d_head``.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, *,
                 rng: np.random.Generator | None = None):
        self.d_model = check_length(d_model, "d_model")
        self.num_heads = check_length(num_heads, "num_heads")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.d_head = d_model // num_heads
        rng = make_rng(rng)
        self.q_proj = Linear(d_model, d_model, rng=rng)
        self.k_proj = Linear(d_model, d_model, rng=rng)
        self.v_proj = Linear(d_model, d_model, rng=rng)
        self.out_proj = Linear(d_model, d_model, rng=rng)
        self.dropout = Dropout(dropout, rng=rng)

    def split_heads(self, x: np.ndarray) -> np.ndarray:
        """(B, N, D) → (B, H, N, d_head): head h gets columns h·d_head … (h+1)·d_head-1."""
        B, N, _ = x.shape
        return x.reshape(B, N, self.num_heads, self.d_head).transpose(0, 2, 1, 3)

    def merge_heads(self, x: np.ndarray) -> np.ndarray:
        """(B, H, N, d_head) → (B, N, D): the inverse of ``split_heads``."""
        B, _, N, _ = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, N, self.d_model)

    def project_kv(self, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of ``source`` (B, S, D), each (B, H, S, d_head). For the
        cross-attention, ``source`` is the encoder's output: this is what a decoder can
        compute once per source sentence and cache."""
        source = as_float_array(source, "source")
        check_ndim(source, "source", ndim=3, shape_hint="(B, S, D)")
        check_last_dim(source, "source", self.d_model)
        ### BEGIN SOLUTION k_proj and v_proj of the source, each split into heads
        return self.split_heads(self.k_proj(source)), self.split_heads(self.v_proj(source))
        ### END SOLUTION

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Masked scaled dot-product attention for every head at once.

        Args:
            q: (B, H, T, d_head); k, v: (B, H, S, d_head).
            mask: bool, broadcastable to (B, 1, T, S) (or (B, H, T, S)); True = may attend.
                None: every key may be seen.

        Returns:
            (B, H, T, d_head). A query that may see no key at all (a fully padded source
            row) gets zeros, never NaN.
        """
        ### BEGIN SOLUTION scores / sqrt(d_head); -inf where the mask is False; softmax; rows with no key get 0; dropout; @ v
        scores = (q * (1.0 / math.sqrt(self.d_head))) @ k.swapaxes(-1, -2)  # (B, H, T, S)
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            any_key = mask.any(axis=-1, keepdims=True)  # (B, 1, T, 1): rows with something to see
            scores = np.where(mask, scores, -np.inf)
            scores = np.where(any_key, scores, 0.0)  # a fully masked row: no -inf - (-inf) = NaN
            weights = np.where(mask, softmax(scores, axis=-1), 0.0)  # its weights become 0
        else:
            weights = softmax(scores, axis=-1)
        return self.dropout(weights) @ v  # (B, H, T, d_head)
        ### END SOLUTION

    def forward(self, x: np.ndarray, memory: np.ndarray | None = None, mask: np.ndarray | None = None) -> np.ndarray:
        """x (B, T, D) → (B, T, D). Queries from ``x``; keys and values from ``memory``
        (B, S, D) when given (cross-attention), else from ``x`` (self-attention)."""
        x = as_float_array(x, "x")
        check_ndim(x, "x", ndim=3, shape_hint="(B, T, D)")
        check_last_dim(x, "x", self.d_model)
        ### BEGIN SOLUTION q from x, k/v from memory (or x), attend under the mask, merge, out_proj
        q = self.split_heads(self.q_proj(x))  # (B, H, T, d_head)
        k, v = self.project_kv(x if memory is None else memory)  # (B, H, S, d_head)
        return self.out_proj(self.merge_heads(self.attend(q, k, v, mask)))
        ### END SOLUTION


# -- blocks --------------------------------------------------------------------------------------

class _Block(Layer):
    """What encoder and decoder layers share: the constructor of their sub-layers, each
    with its own LayerNorm (self-attention; in a decoder layer, ``has_cross_attention``,
    the cross-attention; the feed-forward network), and the residual wiring of a
    sub-layer, post-norm or pre-norm."""

    has_cross_attention = False

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, *,
                 activation: str = "relu", norm_first: bool = False, layer_norm_eps: float = 1e-5,
                 rng: np.random.Generator | None = None):
        rng = make_rng(rng)
        self.self_attn = Attention(d_model, num_heads, dropout, rng=rng)
        self.self_attn_layer_norm = LayerNorm(d_model, eps=layer_norm_eps)
        if self.has_cross_attention:
            self.encoder_attn = Attention(d_model, num_heads, dropout, rng=rng)
            self.encoder_attn_layer_norm = LayerNorm(d_model, eps=layer_norm_eps)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.norm_first = bool(norm_first)
        self.fc1 = Linear(d_model, d_ff, rng=rng)
        self.fc2 = Linear(d_ff, d_model, rng=rng)
        self.dropout = Dropout(dropout, rng=rng)
        self.final_layer_norm = LayerNorm(d_model, eps=layer_norm_eps)

    def feed_forward(self, x: np.ndarray) -> np.ndarray:
        """fc1 → activation (ReLU, exact GELU or SiLU) → dropout → fc2, (…, D) → (…, D)."""
        h = self.fc1(x)
        if self.activation == "relu":
            h = np.maximum(h, 0)
        elif self.activation == "gelu":
            h = gelu_exact(h)
        else:  # SiLU: x·σ(x), with σ(x) = (1 + tanh(x/2)) / 2 (no overflow, float32 stays float32)
            h = h * ((1 + np.tanh(h / 2)) / 2)
        return self.fc2(self.dropout(h))

    def sublayer(self, x: np.ndarray, f, norm: LayerNorm) -> np.ndarray:
        """One residual sub-layer ``f`` with its own LayerNorm ``norm``.

        Post-norm (``norm_first=False``, the original Transformer and MarianMT):
        ``norm(x + f(x))``. Pre-norm (``norm_first=True``): ``x + f(norm(x))``. Dropout
        (``self.dropout``) acts on f's output before the add.
        """
        ### BEGIN SOLUTION post-norm: normalise after adding the residual; pre-norm: before the sub-layer
        if self.norm_first:
            return x + self.dropout(f(norm(x)))
        return norm(x + self.dropout(f(x)))
        ### END SOLUTION


class _Stack(Layer):
    """What the encoder and the decoder share: ``layers``, a list of ``num_layers`` blocks
    (``block``: EncoderLayer or DecoderLayer), and ``layer_norm`` after the last one when
    the blocks are pre-norm (``norm_first``; post-norm blocks end normalised already)."""

    block = None  # the kind of layer stacked: EncoderLayer in an Encoder, DecoderLayer in a Decoder

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, *,
                 activation: str = "relu", norm_first: bool = False, layer_norm_eps: float = 1e-5,
                 rng: np.random.Generator | None = None):
        rng = make_rng(rng)
        self.layers = [self.block(d_model, num_heads, d_ff, dropout, activation=activation, norm_first=norm_first,
                                  layer_norm_eps=layer_norm_eps, rng=rng) for _ in range(check_length(num_layers, "num_layers"))]
        self.layer_norm = LayerNorm(d_model, eps=layer_norm_eps) if norm_first else None


class EncoderLayer(_Block):
    """Self-attention (no causal mask) then a feed-forward network, each a residual
    sub-layer. Sub-layers: ``self_attn``, ``self_attn_layer_norm``, ``fc1``, ``fc2``,
    ``final_layer_norm``, ``dropout`` (``_Block``'s constructor)."""

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """x (B, S, D), mask bool (B, 1, S, S) from ``encoder_mask`` → (B, S, D)."""
        ### BEGIN SOLUTION self-attention sub-layer, then feed-forward sub-layer, each with its own LayerNorm
        x = self.sublayer(x, lambda h: self.self_attn(h, mask=mask), self.self_attn_layer_norm)
        return self.sublayer(x, self.feed_forward, self.final_layer_norm)
        ### END SOLUTION


class DecoderLayer(_Block):
    """Masked self-attention, cross-attention over the encoder's output, feed-forward:
    three residual sub-layers, each with its own LayerNorm.

    Sub-layers: ``self_attn``, ``self_attn_layer_norm``, ``encoder_attn`` (the
    cross-attention), ``encoder_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``,
    ``dropout`` (``_Block``'s constructor).
    """

    has_cross_attention = True

    def cached_self_attention(self, h: np.ndarray, mask, cache, index: int) -> np.ndarray:
        """The masked self-attention of ``h`` (B, T, D); with a ``cache``, the new tokens'
        keys and values are appended to layer ``index``'s buffers and every cached token is
        attended over (written for you: lab 06's KV cache)."""
        attn = self.self_attn
        if cache is None:
            return attn(h, mask=mask)
        q = attn.split_heads(attn.q_proj(h))
        k, v = cache.update(index, *attn.project_kv(h))  # every token so far
        return attn.out_proj(attn.merge_heads(attn.attend(q, k, v, mask)))

    def forward(self, x: np.ndarray, memory: np.ndarray, self_mask: np.ndarray | None = None,
                cross_mask: np.ndarray | None = None, *, cache: "DecoderCache | None" = None,
                index: int = 0) -> np.ndarray:
        """x (B, T, D), memory (B, S, D) → (B, T, D).

        Args:
            self_mask: bool (B, 1, T, T) from ``decoder_mask`` (causal and target padding).
            cross_mask: bool (B, 1, T, S) from ``cross_attention_mask`` (source padding).
            cache: during decoding, a ``DecoderCache``: the self-attention appends the new
                tokens' keys and values to layer ``index``'s buffers and attends over all of
                them; the cross-attention uses the cached keys and values of ``memory``
                when the cache holds them (``memory`` is then not read).
        """
        ### BEGIN SOLUTION cross-attention: queries from the decoder stream, keys/values of memory (cached when the cache has them); three sub-layers
        cross = self.encoder_attn

        def self_attention(h):
            return self.cached_self_attention(h, self_mask, cache, index)

        def cross_attention(h):
            kv = None if cache is None else cache.cross(index)
            k, v = cross.project_kv(memory) if kv is None else kv  # from the encoder's output
            q = cross.split_heads(cross.q_proj(h))  # from the decoder stream
            return cross.out_proj(cross.merge_heads(cross.attend(q, k, v, cross_mask)))

        x = self.sublayer(x, self_attention, self.self_attn_layer_norm)
        x = self.sublayer(x, cross_attention, self.encoder_attn_layer_norm)
        return self.sublayer(x, self.feed_forward, self.final_layer_norm)
        ### END SOLUTION


class Encoder(_Stack):
    """A stack of EncoderLayers: ``layers``, and ``layer_norm`` when pre-norm (``_Stack``)."""

    block = EncoderLayer

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """x (B, S, D) → memory (B, S, D)."""
        for layer in self.layers:
            x = layer(x, mask)
        return x if self.layer_norm is None else self.layer_norm(x)


class Decoder(_Stack):
    """A stack of DecoderLayers: ``layers``, and ``layer_norm`` when pre-norm (``_Stack``)."""

    block = DecoderLayer

    def forward(self, x: np.ndarray, memory: np.ndarray, self_mask=None, cross_mask=None, *,
                cache: "DecoderCache | None" = None) -> np.ndarray:
        """x (B, T, D), memory (B, S, D) → (B, T, D)."""
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, self_mask, cross_mask, cache=cache, index=i)
        return x if self.layer_norm is None else self.layer_norm(x)


# -- the model --------------------------------------------------------------------------------------

def marian_sinusoids(max_len: int, d_model: int) -> np.ndarray:
    """float32 (max_len, D), D even: the sinusoids in MarianMT's column order, every sine
    first, then every cosine: column i < D/2 is sin(pos / 10000^(2i/D)) and column D/2 + i
    is cos of the same angle. (Lab 02's encoding interleaves them: sin, cos, sin, …)"""
    max_len = check_length(max_len, "max_len")
    d_model = check_length(d_model, "d_model")
    if d_model % 2:
        raise ValueError(f"d_model must be even for sinusoidal positions, got {d_model}")
    ### BEGIN SOLUTION lab 02's table with its even (sin) columns first, then its odd (cos) columns
    pe = sinusoidal_positional_encoding(max_len, d_model)
    return np.concatenate([pe[:, 0::2], pe[:, 1::2]], axis=1)
    ### END SOLUTION


def shift_right(labels: np.ndarray, start_id: int, pad_id: int) -> np.ndarray:
    """Teacher forcing's decoder input: ``start_id`` then labels[:, :-1], int64 (B, T);
    a label -100 (ignored by a loss) becomes ``pad_id``. ``labels`` is not modified (the
    loss still reads its -100s); T = 0 gives an empty (B, 0) array."""
    labels = np.asarray(labels)
    check_ndim(labels, "labels", ndim=2, shape_hint="(B, T)")
    ### BEGIN SOLUTION the start token in front, the last label dropped, -100 replaced by the padding id
    out = np.empty(labels.shape, dtype=np.int64)
    out[:, :1] = start_id  # a slice, not column 0: with T = 0 there is no column to fill
    out[:, 1:] = labels[:, :-1]
    out[out == -100] = pad_id
    return out
    ### END SOLUTION


class EncoderDecoderModel(Layer):
    """The encoder–decoder Transformer, laid out like HuggingFace's MarianMT.

    Sub-layers and parameters: ``shared`` (TokenEmbedding V × D, for source, target and
    the tied output head) when ``share_embeddings``, else ``src_embed`` and ``tgt_embed``
    (the head tied to ``tgt_embed``); ``encoder_positions`` and ``decoder_positions``
    (PositionalEmbedding L × D) only when ``positions="learned"``; ``encoder`` (Encoder),
    ``decoder`` (Decoder), ``drop`` (Dropout on the embeddings), ``final_logits_bias`` (V,).

    Embedding of ids at positions offset … : ``tokens(ids) · √D`` (when ``scale_embedding``)
    plus the positions (``marian_sinusoids`` or the learned table), then ``drop``.
    Logits: ``decoder output @ head.weight.T + final_logits_bias``.
    """

    def __init__(self, vocab_size: int, d_model: int, num_layers: int, num_heads: int, d_ff: int,
                 max_seq_len: int, *, num_decoder_layers: int | None = None, dropout: float = 0.0,
                 activation: str = "relu", norm_first: bool = False, share_embeddings: bool = True,
                 positions: str = "sinusoidal", scale_embedding: bool = True, pad_id: int = 0,
                 layer_norm_eps: float = 1e-5, rng: np.random.Generator | None = None):
        self.vocab_size = check_length(vocab_size, "vocab_size")
        self.d_model = check_length(d_model, "d_model")
        self.max_seq_len = check_length(max_seq_len, "max_seq_len")
        if positions not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {positions!r}")
        self.positions, self.scale_embedding, self.pad_id = positions, bool(scale_embedding), int(pad_id)
        self.share_embeddings = bool(share_embeddings)
        rng = make_rng(rng)
        if share_embeddings:
            self.shared = TokenEmbedding(vocab_size, d_model, rng=rng)
        else:
            self.src_embed = TokenEmbedding(vocab_size, d_model, rng=rng)
            self.tgt_embed = TokenEmbedding(vocab_size, d_model, rng=rng)
        if positions == "learned":
            self.encoder_positions = PositionalEmbedding(max_seq_len, d_model, rng=rng)
            self.decoder_positions = PositionalEmbedding(max_seq_len, d_model, rng=rng)
        else:
            self._sinusoids = marian_sinusoids(max_seq_len, d_model)
        kw = dict(activation=activation, norm_first=norm_first, layer_norm_eps=layer_norm_eps, rng=rng)
        self.encoder = Encoder(num_layers, d_model, num_heads, d_ff, dropout, **kw)
        self.decoder = Decoder(num_layers if num_decoder_layers is None else num_decoder_layers,
                               d_model, num_heads, d_ff, dropout, **kw)
        self.drop = Dropout(dropout, rng=rng)
        self.final_logits_bias = np.zeros(vocab_size, dtype=np.float32)

    def embed(self, token_ids: np.ndarray, side: str, offset: int = 0) -> np.ndarray:
        """Token plus position embeddings of ``token_ids`` (B, N) at positions offset …
        offset+N-1, for ``side`` "source" or "target" → (B, N, D)."""
        token_ids = np.asarray(token_ids)
        check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, N)")
        N = token_ids.shape[1]
        if offset + N > self.max_seq_len:
            raise ValueError(f"positions {offset} … {offset + N - 1} go past max_seq_len={self.max_seq_len}")
        source = side == "source"
        table = self.shared if self.share_embeddings else (self.src_embed if source else self.tgt_embed)
        scale = math.sqrt(self.d_model) if self.scale_embedding else 1.0
        if self.positions == "learned":
            pos = (self.encoder_positions if source else self.decoder_positions)(N, offset)
        else:
            pos = self._sinusoids[offset : offset + N]
        return self.drop(table(token_ids) * scale + pos)

    def head(self, x: np.ndarray) -> np.ndarray:
        """Decoder output (B, T, D) → logits (B, T, V), tied to the target embedding."""
        table = self.shared if self.share_embeddings else self.tgt_embed
        return x @ table.weight.T + self.final_logits_bias  # (B, T, D) @ (D, V) → (B, T, V)

    def encode(self, src_ids: np.ndarray, src_keep: np.ndarray | None = None) -> np.ndarray:
        """src_ids (B, S) → memory (B, S, D). ``src_keep`` (B, S) bool marks the real
        tokens; None: every id that is not ``pad_id``."""
        src_ids = np.asarray(src_ids)
        check_ndim(src_ids, "src_ids", ndim=2, shape_hint="(B, S)")
        src_keep = padding_mask(src_ids, self.pad_id) if src_keep is None else src_keep
        ### BEGIN SOLUTION embed the source, run the encoder under encoder_mask(src_keep)
        return self.encoder(self.embed(src_ids, "source"), encoder_mask(src_keep))
        ### END SOLUTION

    def decode(self, tgt_ids: np.ndarray, memory: np.ndarray, src_keep: np.ndarray,
               tgt_keep: np.ndarray | None = None) -> np.ndarray:
        """tgt_ids (B, T) (already shifted right), memory (B, S, D), src_keep bool (B, S)
        → logits (B, T, V). ``tgt_keep`` (B, T) bool marks real target tokens; None: all
        real (the start token is often the padding id, so it is never guessed from ids)."""
        tgt_ids = np.asarray(tgt_ids)
        check_ndim(tgt_ids, "tgt_ids", ndim=2, shape_hint="(B, T)")
        B, T = tgt_ids.shape
        tgt_keep = np.ones((B, T), bool) if tgt_keep is None else tgt_keep
        ### BEGIN SOLUTION embed the target, run the decoder with decoder_mask and cross_attention_mask, then the head
        x = self.decoder(self.embed(tgt_ids, "target"), memory, decoder_mask(tgt_keep),
                         cross_attention_mask(src_keep, T))
        return self.head(x)
        ### END SOLUTION

    def forward(self, src_ids: np.ndarray, tgt_ids: np.ndarray, src_keep: np.ndarray | None = None,
                tgt_keep: np.ndarray | None = None) -> np.ndarray:
        """Teacher forcing: logits (B, T, V) for the decoder input ``tgt_ids`` (B, T)
        given the source ``src_ids`` (B, S)."""
        src_ids = np.asarray(src_ids)
        src_keep = padding_mask(src_ids, self.pad_id) if src_keep is None else src_keep
        return self.decode(tgt_ids, self.encode(src_ids, src_keep), src_keep, tgt_keep)


# -- decoding with caches ---------------------------------------------------------------------------

class DecoderCache:
    """What a decoder keeps between steps of generation.

    Attributes:
        keys, values: per decoder layer, the self-attention's buffers (B, H, L, d_head);
            positions 0 … length-1 are filled (lab 06's KV cache).
        cross_keys, cross_values: per decoder layer, the cross-attention's keys and values
            of the encoder's output (B, H, S, d_head), computed once here with
            ``encoder_attn.project_kv(memory)``; None when ``cache_cross=False`` (then
            every step recomputes them: the slow way, kept for comparison).
        length: how many target positions are cached.
    """

    def __init__(self, model: EncoderDecoderModel, memory: np.ndarray, *, cache_cross: bool = True):
        memory = as_float_array(memory, "memory")
        layers = model.decoder.layers
        B = memory.shape[0]
        H, d = layers[0].self_attn.num_heads, layers[0].self_attn.d_head
        shape = (B, H, model.max_seq_len, d)
        self.keys = [np.zeros(shape, np.float32) for _ in layers]
        self.values = [np.zeros(shape, np.float32) for _ in layers]
        self.length = 0
        ### BEGIN SOLUTION each layer's cross-attention keys and values of memory, computed once (or None)
        kv = [layer.encoder_attn.project_kv(memory) if cache_cross else (None, None) for layer in layers]
        self.cross_keys = [k for k, _ in kv]
        self.cross_values = [v for _, v in kv]
        ### END SOLUTION

    def update(self, index: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store layer ``index``'s self-attention keys and values (B, H, T, d_head) of the new
        tokens at positions length … length+T-1; return everything stored (views)."""
        T = k.shape[2]
        end = self.length + T
        self.keys[index][:, :, self.length : end] = k
        self.values[index][:, :, self.length : end] = v
        return self.keys[index][:, :, :end], self.values[index][:, :, :end]

    def cross(self, index: int):
        """Layer ``index``'s cached cross-attention (keys, values), or None."""
        k = self.cross_keys[index]
        return None if k is None else (k, self.cross_values[index])


def decode_step(model: EncoderDecoderModel, tgt_ids: np.ndarray, memory: np.ndarray, src_keep: np.ndarray,
                cache: DecoderCache) -> np.ndarray:
    """Logits (B, T, V) of T new target tokens at positions cache.length …, given the
    cache of the earlier ones: equal to ``model.decode(all tokens so far, …)[:, -T:]``."""
    tgt_ids = np.asarray(tgt_ids)
    B, T = tgt_ids.shape
    start = cache.length
    ### BEGIN SOLUTION embed at offset start; causal mask of T queries over start+T keys; cross mask; decoder with the cache; advance length
    self_mask = causal_mask(T, start + T)[None, None]  # query i sits at position start + i
    x = model.decoder(model.embed(tgt_ids, "target", offset=start), memory, self_mask,
                      cross_attention_mask(src_keep, T), cache=cache)
    cache.length = start + T
    return model.head(x)
    ### END SOLUTION


def greedy_decode(model: EncoderDecoderModel, src_ids: np.ndarray, max_new_tokens: int, *,
                  start_id: int | None = None, eos_id: int | None = None, src_keep: np.ndarray | None = None,
                  use_cache: bool = True, cache_cross: bool = True) -> np.ndarray:
    """Greedy translation of ``src_ids`` (B, S): HuggingFace's ``generate(do_sample=False,
    num_beams=1)`` for an encoder–decoder.

    The encoder runs once (``model.encode``). Each step feeds the newest token, takes the
    argmax of the last position's logits and appends it. With ``use_cache`` the decoder's
    self-attention keys and values are cached (``DecoderCache``) and, with
    ``cache_cross``, so are the cross-attention's (computed once, not per step); without
    ``use_cache`` the whole prefix is decoded again at every step (``model.decode``).

    Args:
        start_id: the decoder's first token (None: ``model.pad_id``, as MarianMT).
        eos_id: a row that emits it is finished: its later tokens are ``model.pad_id``;
            decoding stops when every row has finished. Any id, 0 included (None: none).
        src_keep: (B, S) bool, the real source tokens (None: ``padding_mask(src_ids,
            model.pad_id)``); used by the encoder and at every step.

    Returns:
        int64 (B, 1 + m), m ≤ max_new_tokens: the start token, then the chosen tokens.
    """
    src_ids = np.asarray(src_ids)
    check_ndim(src_ids, "src_ids", ndim=2, shape_hint="(B, S)")
    max_new_tokens = check_length(max_new_tokens, "max_new_tokens", minimum=0)
    if max_new_tokens + 1 > model.max_seq_len:
        raise ValueError(f"1 + max_new_tokens = {max_new_tokens + 1} target positions exceed max_seq_len={model.max_seq_len}")
    src_keep = padding_mask(src_ids, model.pad_id) if src_keep is None else src_keep
    start_id = model.pad_id if start_id is None else start_id
    B = src_ids.shape[0]
    ### BEGIN SOLUTION encode once; loop: logits of the newest position (cached step or full decode), argmax, EOS bookkeeping
    memory = model.encode(src_ids, src_keep)  # once per call, never per step
    out = np.full((B, 1 + max_new_tokens), model.pad_id, dtype=np.int64)
    out[:, 0] = start_id
    cache = DecoderCache(model, memory, cache_cross=cache_cross) if use_cache else None
    finished = np.zeros(B, dtype=bool)
    length = 1
    for _ in range(max_new_tokens):
        if use_cache:
            logits = decode_step(model, out[:, length - 1 : length], memory, src_keep, cache)[:, -1]
        else:
            logits = model.decode(out[:, :length], memory, src_keep)[:, -1]
        nxt = np.argmax(logits, axis=-1).astype(np.int64)
        nxt[finished] = model.pad_id  # a finished row only pads
        if eos_id is not None:
            finished |= nxt == eos_id
        out[:, length] = nxt
        length += 1
        if eos_id is not None and finished.all():
            break
    return out[:, :length].copy()
    ### END SOLUTION
