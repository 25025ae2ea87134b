"""Lab 12 · inference engineering, object style: a Stopwatch class keeps each part's
fastest lap; the online softmax is a small dataclass holding m, l and acc per query block;
batched decoding wraps each active request in a dataclass; speculative decoding is one
loop class with a greedy and a sampled subclass, its counts a dataclass; int8 walks its
row blocks (a namedtuple) one by one.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from generation import sample_next
from gpt import GPTModel
from gptkit import Layer, as_float_array, check_last_dim, check_length, check_ndim, peak_memory  # noqa: F401 (the tests call peak_memory here)
from layers import LayerNorm, Linear
from threadpoolctl import ThreadpoolController
from abc import ABC, abstractmethod
from collections import namedtuple
from dataclasses import asdict, dataclass, field
from queue import Empty, SimpleQueue

# Rows of an int8 weight dequantised at once by ``Int8Linear``: a tile of about 64K float32
# numbers (256 KB) stays in the processor's cache while its product runs.
TILE_ELEMENTS = 1 << 16



class Stopwatch:
    """Laps between clock reads, each name keeping its fastest lap over the repeats."""

    def __init__(self):
        self.best: dict[str, float] = {}
        self.last = time.perf_counter()

    def start(self) -> None:
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.best[name] = min(self.best.get(name, math.inf), now - self.last)
        self.last = now

    def table(self) -> list[tuple[str, float]]:
        rows = [(name, float(seconds)) for name, seconds in self.best.items()]
        return rows + [("total", sum(seconds for _, seconds in rows))]


@dataclass
class OnlineSoftmax:
    """The running state of one block of query rows: max m, sum l, accumulator acc."""

    m: np.ndarray
    l: np.ndarray
    acc: np.ndarray

    @classmethod
    def empty(cls, n: int, rows: int, d_v: int, dtype) -> "OnlineSoftmax":
        return cls(np.full((n, rows, 1), -np.inf, dtype), np.zeros((n, rows, 1), dtype), np.zeros((n, rows, d_v), dtype))

    def add(self, scores: np.ndarray, values: np.ndarray) -> None:
        """Fold a tile of scores (N, bq, bk), overwritten, and its values (N, bk, d_v) in."""
        m_new = np.maximum(self.m, scores.max(axis=-1, keepdims=True))
        scores -= m_new
        np.exp(scores, out=scores)
        rescale = np.exp(self.m - m_new)
        self.l *= rescale
        self.l += scores.sum(axis=-1, keepdims=True)
        self.acc *= rescale
        self.acc += scores @ values
        self.m = m_new

    def result(self, out: np.ndarray) -> None:
        np.divide(self.acc, self.l, out=out)


@dataclass
class ActiveRequest:
    """A request decoding in a slot: its id, the slot, and the decoder's record of it."""

    rid: int
    slot: int
    record: dict

    @property
    def pending(self) -> int:
        """The token the slot does not hold yet."""
        return self.record["tokens"][-1]

    @property
    def new_tokens(self) -> int:
        return len(self.record["tokens"]) - self.record["prompt_len"]

    def take(self, token: int) -> bool:
        """Append the chosen token; True when the request is finished."""
        self.record["tokens"].append(token)
        return self.new_tokens >= self.record["max_new"] or token == self.record["eos"]

    def result(self) -> np.ndarray:
        return np.array(self.record["tokens"], dtype=np.int64)


@dataclass
class SpeculativeStats:
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0


class Verifier:
    """The target model with a one-slot cache holding every token of the context but the last."""

    def __init__(self, target: GPTModel, context: list[int]):
        self.target = target
        self.cache = SlotCache(target, 1)
        self.slot = np.zeros(1, dtype=np.int64)
        if len(context) > 1:
            forward_slots(target, np.array([context[:-1]]), self.cache, self.slot)

    def check(self, last: int, drafts: np.ndarray) -> np.ndarray:
        """(1 + m, V) logits after last, d1, …, dm: one forward pass."""
        return forward_slots(self.target, np.array([[last, *drafts.tolist()]]), self.cache, self.slot)[0]

    def keep(self, length: int) -> None:
        self.cache.lengths[0] = length


@dataclass
class Speculation(ABC):
    """The loop shared by greedy and sampled speculative decoding."""

    target: GPTModel
    draft: GPTModel | None
    k: int
    ngram: int
    stats: SpeculativeStats = field(default_factory=SpeculativeStats)

    @abstractmethod
    def propose(self, drafter: "Drafter", context: list[int], m: int):
        """(drafts (m,), their q or None)."""

    @abstractmethod
    def decide(self, drafts: np.ndarray, q, logits: np.ndarray) -> list[int]:
        """The tokens this round emits: the accepted drafts, then one of the target's; sets
        ``self.kept``, how many drafts were accepted."""

    def done(self, tokens: list[int], prompt_len: int) -> bool:
        return False

    def run(self, prompt: np.ndarray, max_new_tokens: int) -> tuple[np.ndarray, dict]:
        tokens = prompt.tolist()
        verifier, drafter = Verifier(self.target, tokens), Drafter(self.draft, self.ngram)
        stop = len(tokens) + max_new_tokens
        while len(tokens) < stop and not self.done(tokens, len(prompt)):
            left = stop - len(tokens)
            drafts, q = self.propose(drafter, tokens, min(self.k, left - 1)) if left > 1 \
                else (np.zeros(0, dtype=np.int64), None)
            start = len(tokens) - 1
            emitted = self.decide(drafts, q, verifier.check(tokens[-1], drafts))
            self.stats.rounds += 1
            self.stats.proposed += len(drafts)
            self.stats.accepted += self.kept
            tokens.extend(emitted)
            verifier.keep(start + 1 + self.kept)
            drafter.keep(len(tokens) - 1)
        return np.array(tokens, dtype=np.int64), asdict(self.stats)


RowBlock = namedtuple("RowBlock", "index start stop")


def scale_blocks(rows: int, block: int, first: int = 0):
    """The blocks of ``block`` rows covering rows first … rows − 1 (first a multiple of block)."""
    for start in range(first, rows, block):
        yield RowBlock(start // block, start, min(start + block, rows))


# -- input checks ------------------------------------------------------------------------------

def _check_ids(token_ids, vocab_size: int, name: str, ndim: int, shape_hint: str) -> np.ndarray:
    token_ids = np.asarray(token_ids)
    check_ndim(token_ids, name, ndim=ndim, shape_hint=shape_hint)
    if token_ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer token ids, got dtype {token_ids.dtype}")
    if token_ids.size and (token_ids.min() < 0 or token_ids.max() >= vocab_size):
        raise ValueError(f"{name} must be ids in the vocabulary 0 … {vocab_size - 1}, "
                         f"got values from {token_ids.min()} to {token_ids.max()}")
    return token_ids.astype(np.int64, copy=False)


def _check_model(model, name: str = "model") -> None:
    missing = [a for a in ("wte", "wpe", "h", "ln_f", "vocab_size", "d_model", "max_seq_len") if not hasattr(model, a)]
    if missing:
        raise TypeError(f"{name} must be a GPTModel (lab 04); a {type(model).__name__} has no {', '.join(missing)}")


def _check_eos(eos, vocab_size: int):
    if eos is None:
        return None
    eos = check_length(eos, "eos", minimum=0)
    if eos >= vocab_size:
        raise ValueError(f"eos={eos} is not in the vocabulary 0 … {vocab_size - 1}")
    return eos


def _check_room(model, prompt_len: int, new_tokens: int) -> None:
    if prompt_len + new_tokens > model.max_seq_len:
        raise ValueError(f"a prompt of {prompt_len} tokens plus {new_tokens} new ones is "
                         f"{prompt_len + new_tokens} tokens, past the model's max_seq_len={model.max_seq_len}")


def _check_block(block, name: str) -> int:
    return check_length(block, name)


def _check_out(out, shape: tuple, shape_hint: str) -> None:
    """None, or an array the result can be written into: float (float32), ``shape``, C-contiguous, writeable."""
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise ValueError(f"out must be a float32 array of shape {shape_hint} = {shape}, got {type(out).__name__}")
    if out.dtype.kind != "f" or out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writeable C-contiguous float32 array of shape {shape_hint} = {shape}, "
                         f"got {out.dtype} {out.shape}")


# -- small pieces the fast paths share (given) ---------------------------------------------------

def _layer_norm(x: np.ndarray, ln: LayerNorm, out: np.ndarray | None = None) -> np.ndarray:
    """``ln(x)`` for x (N, D), in one array changed in place: a new one, or ``out`` (N, D) when
    given (the plain LayerNorm of lab 03 makes a fresh array for each of its five operations)."""
    scale = 1.0 / x.shape[-1]
    y = np.subtract(x, x.sum(axis=-1, keepdims=True) * scale, out=out)  # (a sum: ndarray.mean costs more calls)
    var = np.einsum("nd,nd->n", y, y)[:, None]  # (N, 1) sums of squares, without a y*y array
    y *= (var * scale + ln.eps) ** -0.5
    y *= ln.weight
    y += ln.bias
    return y


def _linear(layer, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``layer(x)`` for x (N, d_in): a lab-03 ``Linear`` as one product into a new array or
    into ``out`` (N, d_out), its bias added in place (``x @ W + b`` makes a second array),
    without the layer's input checks; any other layer (an ``Int8Linear``) through its own
    ``__call__`` (``out`` unused)."""
    if type(layer) is not Linear:
        return layer(x)
    y = np.matmul(x, layer.weight, out=out)
    if layer.bias is not None:
        y += layer.bias
    return y


def _head(model: GPTModel, x: np.ndarray, out: np.ndarray | None = None,
          pool: RowPool | None = None) -> np.ndarray:
    """The tied output head on x (N, D) → logits (N, V), into a new array or into ``out``
    (N, V): one 2-D product, the (V, D) table read once for all N rows (an
    ``Int8Embedding`` does it tile by tile). With ``pool`` (a ``RowPool``), the product
    runs in ``pool.map`` as ``_product`` runs it (``_pooled_matmul``)."""
    if isinstance(model.wte, Int8Embedding):
        return model.wte.head(x, out)
    if pool is None:
        return np.matmul(x, model.wte.weight.T, out=out)
    out = np.empty((x.shape[0], model.vocab_size), np.float32) if out is None else out
    return _pooled_matmul(pool, x, model.wte.weight.T, out)


# -- measure first -------------------------------------------------------------------------------

def profile_forward(model: GPTModel, token_ids: np.ndarray, *, repeats: int = 3) -> list[tuple[str, float]]:
    """Where the time of one forward pass of your lab-04 model goes, part by part.

    The pass runs through the model's own sub-layers, in the order ``model(token_ids)`` runs
    them, with a clock read between parts, ``repeats`` times.

    Args:
        model: a GPTModel (lab 04), in eval mode.
        token_ids: (B, T) int.
        repeats: ≥ 1 passes; each row keeps the smallest of its ``repeats`` times.

    Returns:
        a list of (name, seconds) rows, in this order:
        ``"embeddings"`` (token + position embeddings), then for each block i
        ``"h.{i}.ln_1"``, ``"h.{i}.attn"`` (with its residual add), ``"h.{i}.ln_2"``,
        ``"h.{i}.mlp"`` (with its residual add), then ``"ln_f"``, ``"head"`` (the tied
        product with ``wte.weight``), and last ``"total"``: the sum of every row above it.
        Every time is a Python float ≥ 0.
    """
    _check_model(model)
    token_ids = _check_ids(token_ids, model.vocab_size, "token_ids", 2, "(B, T)")
    repeats = check_length(repeats, "repeats")
    if not 1 <= token_ids.shape[1] <= model.max_seq_len:
        raise ValueError(f"token_ids needs 1 … max_seq_len={model.max_seq_len} tokens per row, "
                         f"got {token_ids.shape[1]}")
    T = token_ids.shape[1]
    watch = Stopwatch()
    for _ in range(repeats):
        watch.start()
        x = model.wte(token_ids) + model.wpe(T)
        watch.lap("embeddings")
        for i, block in enumerate(model.h):
            h = block.ln_1(x)
            watch.lap(f"h.{i}.ln_1")
            x = x + block.attn(h)
            watch.lap(f"h.{i}.attn")
            h = block.ln_2(x)
            watch.lap(f"h.{i}.ln_2")
            x = x + block.mlp(h)
            watch.lap(f"h.{i}.mlp")
        x = model.ln_f(x)
        watch.lap("ln_f")
        _ = x @ model.wte.weight.T
        watch.lap("head")
    return watch.table()


def profile_decode_step(model: GPTModel, token_ids: np.ndarray, cache: "SlotCache", *,
                        repeats: int = 3) -> list[tuple[str, float]]:
    """Where the time of one decoding step goes: the same table as ``profile_forward`` for
    one new token per row that follows what ``cache`` holds.

    Args:
        model: a GPTModel (lab 04), in eval mode.
        token_ids: (B, 1) int, row i's next token; it sits at position ``cache.lengths[i]``.
        cache: a ``SlotCache`` of this model with ``max_batch == B`` whose slot i holds row i
            (fill it first, e.g. with ``forward_slots``).
        repeats: ≥ 1 steps; each row keeps the smallest of its ``repeats`` times.

    Returns:
        rows as ``profile_forward``'s (same names, ``"total"`` last). The step runs through
        ``forward_slots``'s parts (row i's keys and values are written at its own position);
        the cache's lengths are left as they were, so the same step can be profiled again.
    """
    _check_model(model)
    token_ids = _check_ids(token_ids, model.vocab_size, "token_ids", 2, "(B, 1)")
    repeats = check_length(repeats, "repeats")
    if not isinstance(cache, SlotCache):
        raise TypeError(f"cache must be a SlotCache, got {type(cache).__name__}")
    B = token_ids.shape[0]
    if token_ids.shape[1] != 1 or B != cache.max_batch:
        raise ValueError(f"token_ids must be (max_batch, 1) = ({cache.max_batch}, 1), got {token_ids.shape}")
    if cache.lengths.max() + 1 > model.max_seq_len:
        raise ValueError(f"a slot of the cache is full (max_seq_len={model.max_seq_len}): no position for a new token")
    slots = np.arange(B, dtype=np.int64)
    saved = cache.lengths.copy()
    watch = Stopwatch()
    for _ in range(repeats):
        watch.start()
        x = embed_rows(model, token_ids, saved)
        watch.lap("embeddings")
        for i, block in enumerate(model.h):
            h = _layer_norm(x, block.ln_1)
            watch.lap(f"h.{i}.ln_1")
            x += attend_rows(block.attn, h, cache, i, slots, saved, 1)
            watch.lap(f"h.{i}.attn")
            h = _layer_norm(x, block.ln_2)
            watch.lap(f"h.{i}.ln_2")
            x += block.mlp.c_proj(fast_gelu(block.mlp.c_fc(h)))
            watch.lap(f"h.{i}.mlp")
        x = _layer_norm(x, model.ln_f)
        watch.lap("ln_f")
        _head(model, x)
        watch.lap("head")
        np.copyto(cache.lengths, saved)
    return watch.table()


# -- tiled causal attention with the online softmax ------------------------------------------------

def tiled_causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = 64,
                           block_k: int = 64, return_stats: bool = False):
    """Causal attention softmax(q·kᵀ/√d + mask)·v computed one (block_q × block_k) tile of
    scores at a time, never holding a (T, S) array (FlashAttention's recurrence).

    Query i sits at absolute position S − T + i (as lab 01's ``causal_mask(T, S)``) and may
    see keys 0 … S − T + i. For each block of queries the tiles of keys are visited left to
    right keeping, per query row, a running maximum m, a running sum l of exp(score − m), and
    an accumulator acc of exp(score − m)·v. When a tile raises the maximum from m to m', the
    old l and acc are rescaled by exp(m − m') before the tile's own terms are added; at the
    end out = acc / l. Tiles wholly above the diagonal (every key in the future of every
    query of the block) are skipped; only the tiles that cross the diagonal are masked.

    Args:
        q: (..., T, d) queries.
        k: (..., S, d) keys, S ≥ T; the same leading dimensions as q.
        v: (..., S, d_v) values.
        block_q, block_k: ≥ 1, the tile's queries and keys (T and S need not be multiples).
        return_stats: also return how many tiles were computed.

    Returns:
        out (..., T, d_v) in q's float dtype (float32 in, float32 out); with
        ``return_stats``, (out, stats) where stats = {"tiles_total": query blocks × key
        blocks, "tiles_visited": the (query block, key block) tiles whose scores were
        computed} (a tile counts once, whatever the leading dimensions). Memory beyond q, k,
        v and the output: a few arrays of (..., block_q, block_k) and (..., block_q, d_v).
    """
    q, k, v = as_float_array(q, "q"), as_float_array(k, "k"), as_float_array(v, "v")
    check_ndim(q, "q", min_ndim=2, shape_hint="(..., T, d)")
    if k.ndim != q.ndim or v.ndim != q.ndim or k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"q (..., T, d), k (..., S, d) and v (..., S, d_v) must share their leading "
                         f"dimensions; got q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape[-1] != q.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k must be (..., S, {q.shape[-1]}) and v (..., S, d_v) with the same S; "
                         f"got k {k.shape}, v {v.shape}")
    T, S = q.shape[-2], k.shape[-2]
    if S < T:
        raise ValueError(f"there must be at least as many keys as queries (S ≥ T): got T={T}, S={S}")
    block_q, block_k = _check_block(block_q, "block_q"), _check_block(block_k, "block_k")
    d, d_v = q.shape[-1], v.shape[-1]
    dtype = np.result_type(q, k, v)
    scale = 1.0 / math.sqrt(d)
    queries, keys, values = q.reshape(-1, T, d), k.reshape(-1, S, d), v.reshape(-1, S, d_v)
    n = queries.shape[0]
    out = np.empty((n, T, d_v), dtype=dtype)
    offset = S - T
    n_q_blocks, n_k_blocks = -(-T // block_q), -(-S // block_k)
    visited = 0
    for qb in range(n_q_blocks):
        q0, q1 = qb * block_q, min((qb + 1) * block_q, T)
        state = OnlineSoftmax.empty(n, q1 - q0, d_v, dtype)
        first_pos, last_pos = offset + q0, offset + q1 - 1
        kb = 0
        while kb < n_k_blocks and kb * block_k <= last_pos:
            k0, k1 = kb * block_k, min((kb + 1) * block_k, S)
            scores = queries[:, q0:q1] @ keys[:, k0:k1].swapaxes(-1, -2)
            scores *= scale
            if k1 - 1 > first_pos:
                future = np.arange(k0, k1)[None, :] > np.arange(first_pos, last_pos + 1)[:, None]
                np.copyto(scores, -np.inf, where=future)
            state.add(scores, values[:, k0:k1])
            visited += 1
            kb += 1
        state.result(out[:, q0:q1])
    out = out.reshape(*q.shape[:-2], T, d_v)
    if return_stats:
        return out, {"tiles_total": n_q_blocks * n_k_blocks, "tiles_visited": visited}
    return out


# -- a fast forward pass -----------------------------------------------------------------------------

def fast_gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's tanh GELU, 0.5·x·(1 + tanh(u)) with u = √(2/π)·(x + 0.044715·x³), computed in
    place in ``x`` (which is returned).

    It uses 0.5·(1 + tanh u) = 1 / (1 + exp(−2u)), the same function (NumPy's exp is faster
    than its tanh), and writes every intermediate into one array of x's shape (an expression
    such as ``0.5 * x * (1 + np.tanh(...))`` allocates a new array per operation). The
    exponent is capped at 88 so that exp stays finite in float32 (there gelu(x) is 0).

    Args:
        x: a writeable float array, e.g. the (N, F) output of ``c_fc``; overwritten.

    Returns:
        ``x`` itself, now holding gelu(x) (equal to lab 03's ``gelu`` within float32
        rounding).
    """
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        raise TypeError(f"x must be a float ndarray (it is overwritten in place), got {type(x).__name__}")
    if not x.flags.writeable:
        raise ValueError("x must be writeable: fast_gelu overwrites it")
    two_c = 2.0 * math.sqrt(2.0 / math.pi)
    z = np.power(x, 3)
    z *= 0.044715
    z += x  # u / c
    z *= -two_c  # −2u
    np.minimum(z, 88.0, out=z)
    np.exp(z, out=z)
    z += 1.0
    np.divide(x, z, out=x)
    return x


def fast_forward(model: GPTModel, token_ids: np.ndarray, *, block_q: int = 128, block_k: int = 1024,
                 out: np.ndarray | None = None) -> np.ndarray:
    """``model(token_ids)`` computed fast: the same logits as lab 04's forward pass.

    Everything runs on 2-D (B·T, D) arrays, so each weight matrix is read once per call
    (one BLAS product per Linear, ``_linear``: an int8 layer goes through its own
    ``__call__``); attention is ``tiled_causal_attention`` on contiguous (B, H, T, d_head)
    heads; the residual stream is updated in place (``x += …``); the MLP's GELU is
    ``fast_gelu`` in place on ``c_fc``'s output; LayerNorms and the tied head are done in
    place and as one product. The per-block arrays (the normalised input, q/k/v, the heads,
    the products' outputs) are made once per call and written in place by every block:
    a fresh (B·T, 3D) array per block costs its page faults twelve times. The logits, the
    largest array of all, go into ``out`` when the caller keeps one for them (as a server
    does from call to call). No dropout (eval only).

    Args:
        model: a GPTModel (lab 04), or one changed by ``quantize_model``.
        token_ids: (B, T) int, 1 ≤ T ≤ max_seq_len.
        block_q, block_k: the attention tiles.
        out: None, or a writeable C-contiguous float32 (B, T, V) array for the logits.

    Returns:
        float32 (B, T, V) logits: a new array, or ``out`` itself, filled.
    """
    _check_model(model)
    token_ids = _check_ids(token_ids, model.vocab_size, "token_ids", 2, "(B, T)")
    B, T = token_ids.shape
    if not 1 <= T <= model.max_seq_len:
        raise ValueError(f"token_ids needs 1 … max_seq_len={model.max_seq_len} tokens per row, got {T}")
    _check_out(out, (B, T, model.vocab_size), "(B, T, V)")
    D = model.d_model
    x = model.wte(token_ids) + model.wpe(T)
    x = x.reshape(B * T, D)
    for block in model.h:
        attn, mlp = block.attn, block.mlp
        H, dh = attn.num_heads, attn.d_head
        qkv = attn.c_attn(_layer_norm(x, block.ln_1))
        q, k, v = np.ascontiguousarray(qkv.reshape(B, T, 3, H, dh).transpose(2, 0, 3, 1, 4))
        merged = tiled_causal_attention(q, k, v, block_q=block_q, block_k=block_k).transpose(0, 2, 1, 3)
        x += attn.c_proj(merged.reshape(B * T, D))
        x += mlp.c_proj(fast_gelu(mlp.c_fc(_layer_norm(x, block.ln_2))))
    logits = _head(model, _layer_norm(x, model.ln_f))
    if out is not None:
        np.copyto(out, logits.reshape(out.shape))
        return out
    return logits.reshape(B, T, logits.shape[-1])


# -- batched decoding ------------------------------------------------------------------------------

class SlotCache:
    """A KV cache with ``max_batch`` slots, each holding one sequence of its own length.

    Attributes:
        keys, values: one float32 buffer (max_batch, H, L, d_head) per block, allocated once.
            Slot s holds its keys and values at positions 0 … lengths[s]-1.
        lengths: int64 (max_batch,), the number of positions each slot holds (the position of
            its next token).
        max_batch, max_seq_len (L), num_heads (H), d_head.
    """

    def __init__(self, model: GPTModel, max_batch: int):
        _check_model(model)
        self.max_batch = check_length(max_batch, "max_batch")
        self.max_seq_len = model.max_seq_len
        self.num_heads, self.d_head = model.h[0].attn.num_heads, model.h[0].attn.d_head
        shape = (self.max_batch, self.num_heads, self.max_seq_len, self.d_head)
        self.keys = [np.zeros(shape, np.float32) for _ in model.h]
        self.values = [np.zeros(shape, np.float32) for _ in model.h]
        self.lengths = np.zeros(self.max_batch, dtype=np.int64)

    def reset(self, slot: int) -> None:
        """Empty one slot for a new sequence (its length back to 0); the other slots keep theirs."""
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.max_batch:
            raise ValueError(f"slot must be 0 … {self.max_batch - 1}, got {slot!r}")
        self.lengths[int(slot)] = 0


def _slot_rows(buffer: np.ndarray, slots: np.ndarray, stop: int) -> np.ndarray:
    """buffer[slots, :, :stop]: a view when the slots are consecutive, else a copy."""
    first = int(slots[0])
    if len(slots) == 1 or (np.diff(slots) == 1).all():
        return buffer[first : first + len(slots), :, :stop]
    return buffer[slots, :, :stop]


def embed_rows(model: GPTModel, token_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Token + position embeddings (B·T, D) of token_ids (B, T) whose row b starts at its
    own position starts[b] (int64 (B,)): row b's token t gets position starts[b] + t."""
    B, T = token_ids.shape
    positions = starts[:, None] + np.arange(T)[None, :]
    x = model.wte(token_ids) + model.wpe.weight[positions]
    return x.reshape(B * T, model.d_model)


def attend_rows(attn, h: np.ndarray, cache: SlotCache, layer: int, slots: np.ndarray,
                starts: np.ndarray, T: int) -> np.ndarray:
    """One block's attention for rows whose new tokens start at their own positions: the new
    keys and values are written into each row's slot at starts[b] …, every query sees its
    row's keys up to its own position (row b's query t sits at starts[b] + t).

    Args:
        attn: the block's MultiHeadAttention (lab 04): ``c_attn``, ``c_proj``, ``num_heads``,
            ``d_head``, ``d_model``.
        h: (B·T, D) the block's normalised input, row b's T tokens together.
        cache: the SlotCache; layer: the block's index; slots: int64 (B,) distinct slots;
        starts: int64 (B,) each row's first new position; T: new tokens per row.

    Returns:
        (B·T, D): ``c_proj`` of the heads' outputs side by side.
    """
    B, H, dh, D = len(slots), attn.num_heads, attn.d_head, attn.d_model
    q, k, v = attn.c_attn(h).reshape(B, T, 3, H, dh).transpose(2, 0, 3, 1, 4)  # each (B, H, T, dh)
    key_buffer, value_buffer = cache.keys[layer], cache.values[layer]
    for row, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist())):
        key_buffer[slot, :, start:start + T] = k[row]
        value_buffer[slot, :, start:start + T] = v[row]
    S = int(starts.max()) + T
    keys, values = _slot_rows(key_buffer, slots, S), _slot_rows(value_buffer, slots, S)
    scores = q @ keys.swapaxes(-1, -2)
    scores *= 1.0 / math.sqrt(dh)
    query_pos = starts[:, None] + np.arange(T)  # (B, T)
    future = np.arange(S)[None, None, :] > query_pos[:, :, None]  # (B, T, S)
    np.copyto(scores, -np.inf, where=future[:, None])
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    merged = np.matmul(scores, values).transpose(0, 2, 1, 3).reshape(B * T, D)
    return attn.c_proj(merged)


def forward_slots(model: GPTModel, token_ids: np.ndarray, cache: SlotCache, slots: np.ndarray) -> np.ndarray:
    """Run T new tokens for each of B sequences held in the given slots of ``cache``, each at
    its own positions: one forward pass for the whole batch.

    Row b is the sequence in slot ``slots[b]``; its tokens sit at positions
    cache.lengths[slots[b]] … + T − 1 (rows of different lengths share the call: the
    positional embeddings are taken per row, and each query sees only its own row's keys up
    to its own position, whatever the other rows hold). Their keys and values are written
    into the slot and ``cache.lengths[slots]`` grows by T.

    Args:
        model: a GPTModel (lab 04), or one changed by ``quantize_model``.
        token_ids: (B, T) int, B ≤ cache.max_batch, T ≥ 1.
        cache: a SlotCache of this model.
        slots: (B,) int, distinct slot indices.

    Returns:
        float32 (B, T, V): row b's logits equal ``model(that sequence so far)[0, -T:]``.
    """
    _check_model(model)
    token_ids = _check_ids(token_ids, model.vocab_size, "token_ids", 2, "(B, T)")
    if not isinstance(cache, SlotCache):
        raise TypeError(f"cache must be a SlotCache, got {type(cache).__name__}")
    if len(cache.keys) != len(model.h) or cache.max_seq_len != model.max_seq_len:
        raise ValueError("this cache was built for another model (SlotCache(model, max_batch))")
    slots = np.asarray(slots)
    B, T = token_ids.shape
    if slots.shape != (B,) or slots.dtype.kind not in "iu":
        raise ValueError(f"slots must be {B} integer slot indices (one per row of token_ids), got {slots.dtype} {slots.shape}")
    if B < 1 or T < 1:
        raise ValueError(f"token_ids needs at least one row and one token, got shape {token_ids.shape}")
    if slots.min() < 0 or slots.max() >= cache.max_batch or len(set(slots.tolist())) != B:
        raise ValueError(f"slots must be distinct slot indices 0 … {cache.max_batch - 1}, got {slots.tolist()}")
    slots = slots.astype(np.int64)
    if cache.lengths[slots].max() + T > model.max_seq_len:
        raise ValueError(f"a slot holds {cache.lengths[slots].max()} tokens; {T} more would go past "
                         f"max_seq_len={model.max_seq_len}")
    starts = cache.lengths[slots].copy()
    x = embed_rows(model, token_ids, starts)
    for layer, block in enumerate(model.h):
        x += attend_rows(block.attn, _layer_norm(x, block.ln_1), cache, layer, slots, starts, T)
        mlp = block.mlp
        x += mlp.c_proj(fast_gelu(mlp.c_fc(_layer_norm(x, block.ln_2))))
    cache.lengths[slots] = starts + T
    logits = _head(model, _layer_norm(x, model.ln_f))
    return logits.reshape(B, T, logits.shape[-1])


class BatchedDecoder:
    """Continuous batching: requests wait in a queue, up to ``max_batch`` of them decode
    together, one forward pass per step, and a finished request's slot goes to the next.

    ``submit`` queues a request. Each ``step``:

    1. admits waiting requests (first come, first served) into free slots: each slot is
       reset, and the prompts' tokens except their last are run into their slots (the
       prefill: ONE ``forward_slots`` call for every request admitted this step with more
       than one prompt token, the prompts right-padded to the longest with token 0; then
       each slot's length is set back to its own prompt's length − 1, so the padding's keys
       lie past it, where no query looks and the next tokens overwrite them);
    2. runs ONE ``forward_slots`` call over every active request, each feeding the one token
       its slot does not hold yet (the prompt's last token, or the token chosen last step)
       at its own position;
    3. picks each request's next token from its logits with lab 06's ``sample_next``
       (``temperature=0``: the argmax), and finishes the requests that emitted ``eos`` or
       reached ``max_new_tokens``; their slots are free for the next step.

    With temperature 0, each request's tokens are exactly lab 06's
    ``generate(model, prompt[None], max_new_tokens, temperature=0, eos_token_id=eos)[0]``,
    whatever else shares the batch.

    Args:
        model: a GPTModel (lab 04) in eval mode, or one changed by ``quantize_model``.
        max_batch: ≥ 1 slots.
        temperature, top_k, top_p, rng: as lab 06's ``sample_next`` (default greedy).

    Attributes:
        cache: the SlotCache.
        slots: list of max_batch entries, the request id decoding in each slot or None.
        waiting: the ids of the submitted requests not yet admitted, oldest first.
        forward_calls: how many ``forward_slots`` calls the decoder made (prefills included).
    """

    def __init__(self, model: GPTModel, max_batch: int, *, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, rng: np.random.Generator | None = None):
        _check_model(model)
        self.model = model
        self.cache = SlotCache(model, max_batch)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)) \
                or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number ≥ 0 (0 means greedy), got {temperature!r}")
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy Generator or None, got {type(rng).__name__}")
        self.sampling = {"temperature": float(temperature), "top_k": top_k, "top_p": top_p,
                         "rng": np.random.default_rng() if rng is None else rng}
        self.slots: list[int | None] = [None] * self.cache.max_batch
        self.waiting: deque[int] = deque()
        self.forward_calls = 0
        self._requests: dict[int, dict] = {}
        self._done: dict[int, np.ndarray] = {}

    def submit(self, prompt_ids: np.ndarray, max_new_tokens: int, eos: int | None = None) -> int:
        """Queue a request: a prompt (T,) of T ≥ 1 ids, at most ``max_new_tokens`` new tokens
        (T + max_new_tokens ≤ max_seq_len), and an optional ``eos`` id that ends it.
        Returns its request id: 0, 1, 2, … in the order of submission."""
        prompt = _check_ids(prompt_ids, self.model.vocab_size, "prompt_ids", 1, "(T,)")
        if len(prompt) < 1:
            raise ValueError("prompt_ids needs at least one token")
        max_new_tokens = check_length(max_new_tokens, "max_new_tokens", minimum=0)
        _check_room(self.model, len(prompt), max_new_tokens)
        eos = _check_eos(eos, self.model.vocab_size)
        rid = len(self._requests)
        self._requests[rid] = {"tokens": list(prompt.tolist()), "prompt_len": len(prompt),
                               "max_new": max_new_tokens, "eos": eos}
        if max_new_tokens == 0:
            self._done[rid] = prompt.copy()
        else:
            self.waiting.append(rid)
        return rid

    def step(self) -> dict[int, int]:
        """Admit, run one batched forward pass, pick one token per active request, retire the
        finished ones. Returns {request id: the token it got this step} (empty when nothing
        is active or waiting)."""
        prefills: dict[int, list[int]] = {}
        for slot, occupant in enumerate(self.slots):
            if occupant is not None or not self.waiting:
                continue
            admitted = ActiveRequest(self.waiting.popleft(), slot, {})
            admitted.record = self._requests[admitted.rid]
            self.slots[slot] = admitted.rid
            self.cache.reset(slot)
            if len(admitted.record["tokens"]) > 1:
                prefills[slot] = admitted.record["tokens"][:-1]
        if prefills:
            longest = max(map(len, prefills.values()))
            block = np.zeros((len(prefills), longest), dtype=np.int64)
            for row, tokens in enumerate(prefills.values()):
                block[row, : len(tokens)] = tokens
            forward_slots(self.model, block, self.cache, np.fromiter(prefills, dtype=np.int64))
            self.forward_calls += 1
            for slot, tokens in prefills.items():
                self.cache.lengths[slot] = len(tokens)
        running = [ActiveRequest(rid, slot, self._requests[rid]) for slot, rid in enumerate(self.slots) if rid is not None]
        if not running:
            return {}
        feed = np.array([[request.pending] for request in running], dtype=np.int64)
        logits = forward_slots(self.model, feed, self.cache, np.array([request.slot for request in running]))
        self.forward_calls += 1
        chosen = sample_next(logits[:, -1, :], **self.sampling)
        got = {}
        for request, token in zip(running, chosen.tolist()):
            got[request.rid] = token
            if request.take(token):
                self._done[request.rid] = request.result()
                self.slots[request.slot] = None
        return got

    def run(self) -> dict[int, np.ndarray]:
        """Step until no request is active or waiting. Returns {request id: int64 (T + m,)
        the prompt followed by its m new tokens} for every request submitted so far, in
        order of request id."""
        while self.waiting or self.slots.count(None) < len(self.slots):
            self.step()
        return {rid: np.array(self._done[rid]) for rid in sorted(self._done)}


# -- speculative decoding ------------------------------------------------------------------------

def prompt_lookup_draft(context_ids: np.ndarray, k: int, *, ngram: int = 3) -> np.ndarray:
    """Draft tokens found in the context itself (prompt lookup): where the context's last n
    tokens occurred before, propose the tokens that followed them there.

    For n = ngram, ngram − 1, …, 1 (longest first): find the latest earlier occurrence of the
    last n tokens, i.e. the largest start j < len − n with context[j : j + n] equal to
    context[len − n :]; if there is one, propose context[j + n : j + n + k] (fewer than k when
    the context ends first) and stop. No occurrence for any n: nothing is proposed.

    Args:
        context_ids: (C,) int, the tokens so far.
        k: ≥ 1, the most tokens to propose.
        ngram: ≥ 1, the longest n-gram tried.

    Returns:
        int64 (m,), 0 ≤ m ≤ k.
    """
    context = np.asarray(context_ids)
    check_ndim(context, "context_ids", ndim=1, shape_hint="(C,)")
    if context.dtype.kind not in "iu":
        raise TypeError(f"context_ids must be integer token ids, got dtype {context.dtype}")
    k, ngram = check_length(k, "k"), check_length(ngram, "ngram")
    C = len(context)
    for n in range(min(ngram, C - 1), 0, -1):
        tail = context[C - n:]
        for j in range(C - n - 1, -1, -1):
            if np.array_equal(context[j:j + n], tail):
                return np.array(context[j + n:j + n + k], dtype=np.int64)
    return np.zeros(0, dtype=np.int64)


def _probabilities(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / temperature) in float64, over the last axis."""
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def accept_or_resample(p: np.ndarray, q: np.ndarray, token, rng: np.random.Generator):
    """The rule of speculative sampling for one drafted token: keep it with probability
    min(1, p[token] / q[token]); otherwise draw a replacement from the residual
    norm(max(0, p − q)). The token that comes out is distributed exactly as p whenever
    ``token`` was drawn from q.

    Args:
        p: (..., V) the target's probabilities (each row sums to 1).
        q: (..., V) the draft's probabilities, from which ``token`` was drawn.
        token: (...) int, the drafted token of each row (a Python int for a single row).
        rng: the generator every random number comes from: first one uniform number per row
            (``rng.random(shape)``, accept when it is < p/q), then one per row for the
            residual draws (inverse CDF).

    Returns:
        (tokens int64 (...), accepted bool (...)): the token each row keeps (the draft's if
        accepted, else the residual's draw) and whether the draft was accepted.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    token = np.asarray(token)
    if p.ndim < 1 or p.shape != q.shape or token.shape != p.shape[:-1]:
        raise ValueError(f"p and q must both be (..., V) and token (...): got p {p.shape}, q {q.shape}, token {token.shape}")
    if token.dtype.kind not in "iu" or (token.size and (token.min() < 0 or token.max() >= p.shape[-1])):
        raise ValueError(f"token must be integer ids in 0 … {p.shape[-1] - 1}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    q_tok = np.take_along_axis(q, token[..., None], axis=-1)[..., 0]
    if np.any(q_tok <= 0):
        raise ValueError("q gives a drafted token probability 0: it cannot have been drawn from q")
    p_tok = np.take_along_axis(p, token[..., None], axis=-1)[..., 0]
    ratio = np.minimum(1.0, p_tok / q_tok)
    accepted = rng.random(token.shape) < ratio
    residual = np.clip(p - q, 0.0, None)
    cdf = np.cumsum(residual, axis=-1)
    threshold = rng.random(token.shape) * cdf[..., -1]
    above = cdf > threshold[..., None]
    redrawn = np.where(above.any(axis=-1), above.argmax(axis=-1), p.shape[-1] - 1)
    tokens = np.where(accepted, token, redrawn).astype(np.int64)
    return tokens, accepted


def _check_speculative(target, draft, prompt_ids, max_new_tokens, k, ngram):
    _check_model(target, "target")
    if draft is not None:
        _check_model(draft, "draft")
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"draft and target must share the vocabulary: {draft.vocab_size} ≠ {target.vocab_size}")
    prompt = _check_ids(prompt_ids, target.vocab_size, "prompt_ids", 1, "(T,)")
    if len(prompt) < 1:
        raise ValueError("prompt_ids needs at least one token")
    max_new_tokens = check_length(max_new_tokens, "max_new_tokens", minimum=0)
    _check_room(target, len(prompt), max_new_tokens)
    if draft is not None:
        _check_room(draft, len(prompt), max_new_tokens)
    return prompt, max_new_tokens, check_length(k, "k"), check_length(ngram, "ngram")


class Drafter:
    """The draft source of speculative decoding: a smaller GPTModel (the same vocabulary)
    decoding with its own one-slot ``SlotCache``, cut back after each round to the tokens the
    target kept; or, when ``draft`` is None, prompt lookup (``prompt_lookup_draft``).

    Attributes: draft (the model or None), ngram, cache (a SlotCache(draft, 1), only with a
    model).
    """

    def __init__(self, draft, ngram: int):
        self.draft, self.ngram = draft, ngram
        if draft is not None:
            self.cache = SlotCache(draft, 1)

    def propose(self, context: list[int], k: int, temperature: float = 0.0, rng=None):
        """Up to k tokens that may follow ``context`` (a list of ids), as (tokens int64 (m,),
        q): with a draft model, m = k tokens, each the draft's argmax (temperature 0) or a draw
        from softmax(logits / temperature) with ``rng``, and q (m, V) their distributions
        (None at temperature 0), the cache fed only what it does not hold yet; with prompt
        lookup, ``prompt_lookup_draft(context, k, ngram)`` and q None."""
        if self.draft is None:
            return prompt_lookup_draft(np.asarray(context, dtype=np.int64), k, ngram=self.ngram), None
        slot = np.zeros(1, dtype=np.int64)
        feed = list(context[int(self.cache.lengths[0]):])
        tokens, dists = [], []
        for _ in range(k):
            logits = forward_slots(self.draft, np.array([feed]), self.cache, slot)[0, -1]
            if temperature == 0:
                token = int(logits.argmax())
            else:
                dist = _probabilities(logits, temperature)
                token = int(rng.choice(len(dist), p=dist))
                dists.append(dist)
            tokens.append(token)
            feed = [token]
        return np.array(tokens, dtype=np.int64), (np.stack(dists) if dists else None)

    def keep(self, length: int) -> None:
        """After a round: the new context's first ``length`` tokens are all the draft's cache
        may keep (what it holds past them was rejected)."""
        if self.draft is not None and self.cache.lengths[0] > length:
            self.cache.lengths[0] = length


def speculative_greedy(target: GPTModel, draft: GPTModel | None, prompt_ids: np.ndarray, max_new_tokens: int,
                       *, k: int = 4, ngram: int = 3, eos: int | None = None) -> tuple[np.ndarray, dict]:
    """Greedy decoding of ``target`` sped up by drafts: the same tokens as lab 06's
    ``generate(target, prompt[None], max_new_tokens, temperature=0, eos_token_id=eos)[0]``.

    Each round: the draft proposes up to k tokens d1 … dk after the context (``draft`` a
    smaller GPTModel with the same vocabulary decoding greedily with its own cache, or
    ``None`` for ``prompt_lookup_draft(context, k, ngram=ngram)``); the target runs ONE
    forward pass over [last token, d1, …, dk] with its cache, which gives its own greedy
    choice t0 … tk after each prefix. The drafts are accepted while di = t(i−1); with n
    accepted, the round emits d1 … dn and then t_n (the target's own token where the draft
    went wrong, or the bonus token after all k), so every round emits at least one token.
    The target's cache is cut back to the tokens kept. Rounds propose fewer than k tokens
    when fewer than k + 1 remain to be emitted.

    Args:
        target, draft: GPTModels (lab 04); ``draft`` may be None (prompt lookup).
        prompt_ids: (T,) int, T ≥ 1, T + max_new_tokens ≤ both models' max_seq_len.
        max_new_tokens: n ≥ 0.
        k: ≥ 1 tokens proposed per round.
        ngram: prompt lookup's longest n-gram.
        eos: an id that ends decoding once emitted (kept as the last token), or None.

    Returns:
        (tokens int64 (T + m,), stats) with stats = {"proposed": drafted tokens the target
        checked, "accepted": those it accepted, "rounds": the target's forward passes after
        the prompt's}.
    """
    prompt, max_new_tokens, k, ngram = _check_speculative(target, draft, prompt_ids, max_new_tokens, k, ngram)
    eos = _check_eos(eos, target.vocab_size)
    run = GreedySpeculation(target, draft, k, ngram, eos=eos)
    return run.run(prompt, max_new_tokens)


def speculative_sample(target: GPTModel, draft: GPTModel | None, prompt_ids: np.ndarray, max_new_tokens: int,
                       *, k: int = 4, ngram: int = 3, temperature: float = 1.0,
                       rng: np.random.Generator | None = None) -> tuple[np.ndarray, dict]:
    """Sampling from ``target`` at ``temperature`` sped up by drafts, with the distribution of
    every token exactly the target's.

    Each round: the draft proposes d1 … dm (m ≤ k) with its probabilities q1 … qm (a draft
    model samples each from softmax(its logits / temperature); prompt lookup proposes
    deterministically, q a one-hot); the target's one forward pass over [last token,
    d1 … dm] gives p1 … p(m+1) = softmax(logits / temperature). For i = 1 … m:
    ``accept_or_resample(p_i, q_i, d_i, rng)``; on the first rejection its residual draw is
    emitted and the round ends; if all m are accepted, a bonus token is drawn from p(m+1).

    Args:
        target, draft, prompt_ids, max_new_tokens, k, ngram: as ``speculative_greedy``.
        temperature: > 0.
        rng: the generator every random number comes from (None: a fresh, unseeded one).

    Returns:
        (tokens int64 (T + n,), stats) as ``speculative_greedy``'s.
    """
    prompt, max_new_tokens, k, ngram = _check_speculative(target, draft, prompt_ids, max_new_tokens, k, ngram)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    rng = np.random.default_rng() if rng is None else rng
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator or None, got {type(rng).__name__}")
    run = SampledSpeculation(target, draft, k, ngram, temperature=float(temperature), rng=rng)
    return run.run(prompt, max_new_tokens)


class GreedySpeculation(Speculation):
    """Drafts checked against the target's argmax: the accepted prefix, then the target's token."""

    def __init__(self, target, draft, k, ngram, *, eos=None):
        super().__init__(target, draft, k, ngram)
        self.eos = eos

    def propose(self, drafter, context, m):
        return drafter.propose(context, m)

    def decide(self, drafts, q, logits):
        choices = logits.argmax(axis=-1).tolist()
        n = 0
        while n < len(drafts) and int(drafts[n]) == choices[n]:
            n += 1
        self.kept = n
        emitted = [*drafts[:n].tolist(), choices[n]]
        if self.eos in emitted:
            emitted = emitted[:emitted.index(self.eos) + 1]
        return emitted

    def done(self, tokens, prompt_len):
        return self.eos is not None and len(tokens) > prompt_len and tokens[-1] == self.eos


class SampledSpeculation(Speculation):
    """Drafts kept or resampled by ``accept_or_resample``; a bonus draw when all are kept."""

    def __init__(self, target, draft, k, ngram, *, temperature, rng):
        super().__init__(target, draft, k, ngram)
        self.temperature, self.rng = temperature, rng

    def propose(self, drafter, context, m):
        drafts, q = drafter.propose(context, m, self.temperature, self.rng)
        if q is None:  # prompt lookup: every draft certain
            q = np.zeros((len(drafts), self.target.vocab_size))
            q[np.arange(len(drafts)), drafts] = 1.0
        return drafts, q

    def decide(self, drafts, q, logits):
        p = _probabilities(logits, self.temperature)
        emitted = []
        for i, drafted in enumerate(drafts.tolist()):
            token, accepted = accept_or_resample(p[i], q[i], drafted, self.rng)
            emitted.append(int(token))
            if not accepted:
                self.kept = i
                return emitted
        self.kept = len(drafts)
        emitted.append(int(self.rng.choice(p.shape[-1], p=p[-1])))
        return emitted



# -- weight-only int8 -------------------------------------------------------------------------------

def _check_weight(W) -> np.ndarray:
    W = as_float_array(W, "W")
    check_ndim(W, "W", ndim=2, shape_hint="(d_in, d_out)")
    if not np.all(np.isfinite(W)):
        raise ValueError("W must be finite to be quantised")
    return W


def quantize_int8(W: np.ndarray, block: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 with a scale per block: rows r·block … (r+1)·block − 1 of column c share
    the scale s[r, c] = max |W[rows, c]| / 127, and q = round(W / s) (to the nearest integer,
    halves to even, as ``np.rint``), so |q| ≤ 127 and |W − q·s| ≤ s / 2. A block of zeros
    gets scale 0 and q = 0. The last block may have fewer than ``block`` rows.

    Args:
        W: (d_in, d_out) float, as lab 03's ``Linear.weight``.
        block: ≥ 1 rows per block.

    Returns:
        (q int8 (d_in, d_out), scales float32 (ceil(d_in / block), d_out)).
    """
    W = _check_weight(W)
    block = _check_block(block, "block")
    W32 = W.astype(np.float32, copy=False)
    d_in, d_out = W.shape
    q = np.zeros((d_in, d_out), dtype=np.int8)
    scales = np.zeros((-(-d_in // block), d_out), dtype=np.float32)
    for rb in scale_blocks(d_in, block):
        rows = W32[rb.start:rb.stop]
        scale = (np.abs(rows).max(axis=0) / 127.0).astype(np.float32)
        divisor = np.where(scale > 0, scale, np.float32(1.0))
        q[rb.start:rb.stop] = np.clip(np.rint(rows / divisor), -127, 127)
        scales[rb.index] = scale
    return q, scales


def _check_quantised(q, scales, block) -> tuple[np.ndarray, np.ndarray, int]:
    q, scales = np.asarray(q), np.asarray(scales)
    block = _check_block(block, "block")
    if q.dtype != np.int8 or q.ndim != 2:
        raise ValueError(f"q must be an int8 (d_in, d_out) array, got {q.dtype} {q.shape}")
    if scales.shape != (-(-q.shape[0] // block), q.shape[1]):
        raise ValueError(f"scales must be (ceil(d_in / block), d_out) = ({-(-q.shape[0] // block)}, {q.shape[1]}) "
                         f"for q {q.shape} and block={block}, got {scales.shape}")
    return q, scales.astype(np.float32, copy=False), block


def dequantize_int8(q: np.ndarray, scales: np.ndarray, block: int = 64) -> np.ndarray:
    """float32 (d_in, d_out): q · s, each row block of each column times its own scale (the
    inverse of ``quantize_int8`` up to its rounding)."""
    q, scales, block = _check_quantised(q, scales, block)
    W = q.astype(np.float32)
    for rb in scale_blocks(q.shape[0], block):
        W[rb.start:rb.stop] *= scales[rb.index]
    return W


class Int8Linear(Layer):
    """A lab-03 Linear with its weight stored as int8 with a scale per block
    (``quantize_int8``); the bias stays float32.

    ``layer(x)`` computes x @ W + bias with W dequantised tile by tile: a tile of whole
    blocks of rows (about ``TILE_ELEMENTS`` numbers) is turned into float32 and multiplied
    at once (y += x[:, rows] @ W[rows]); the whole float32 W never exists.

    Attributes:
        qweight: int8 (d_in, d_out); scales: float32 (ceil(d_in / block), d_out);
        bias: float32 (d_out,) or None; d_in, d_out, block.
    """

    def __init__(self, linear: Linear, block: int = 64):
        weight = getattr(linear, "weight", None)
        if weight is None:
            raise TypeError(f"linear must be a Linear with a (d_in, d_out) weight, got {type(linear).__name__}")
        self.block = _check_block(block, "block")
        self.qweight, self.scales = quantize_int8(weight, self.block)
        self.d_in, self.d_out = self.qweight.shape
        bias = getattr(linear, "bias", None)
        self.bias = None if bias is None else np.array(bias, dtype=np.float32)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., d_in) → (..., d_out) float32."""
        x = as_float_array(x, "x")
        check_last_dim(x, "x", self.d_in)
        x2 = x.reshape(-1, self.d_in)
        y = np.zeros((x2.shape[0], self.d_out), dtype=np.float32)
        blocks_per_tile = max(1, TILE_ELEMENTS // (self.block * self.d_out))
        tile_rows = blocks_per_tile * self.block
        for r0 in range(0, self.d_in, tile_rows):
            r1 = min(r0 + tile_rows, self.d_in)
            tile = self.qweight[r0:r1].astype(np.float32)
            for rb in scale_blocks(r1, self.block, first=r0):
                tile[rb.start - r0:rb.stop - r0] *= self.scales[rb.index]
            y += x2[:, r0:r1] @ tile
        if self.bias is not None:
            y += self.bias
        return y.reshape(x.shape[:-1] + (self.d_out,))


class Int8Embedding(Layer):
    """The tied token table (V, D) as int8 with a scale per block of ``block`` features of each
    token: W = wte.weight.T (D, V) quantised by ``quantize_int8`` and stored transposed, so
    each token's row is contiguous.

    ``layer(token_ids)`` → (…, D) float32, the rows looked up and dequantised;
    ``layer.head(x)`` → x @ W (N, V), dequantised tile by tile over the vocabulary;
    ``layer.weight`` → the whole (V, D) table dequantised (made on each access: slow and
    large; for code such as lab 04's forward that reads the float table).

    Attributes: qweight int8 (V, D); scales float32 (V, ceil(D / block)); block.
    """

    def __init__(self, embedding, block: int = 64):
        weight = getattr(embedding, "weight", None)
        if weight is None:
            raise TypeError(f"embedding must be a TokenEmbedding with a (V, D) weight, got {type(embedding).__name__}")
        self.block = _check_block(block, "block")
        q, scales = quantize_int8(np.asarray(weight).T, self.block)  # (D, V), (nb, V)
        self.qweight, self.scales = np.ascontiguousarray(q.T), np.ascontiguousarray(scales.T)
        self.vocab_size, self.d_model = self.qweight.shape

    @property
    def weight(self) -> np.ndarray:
        return dequantize_int8(self.qweight.T, self.scales.T, self.block).T

    def forward(self, token_ids: np.ndarray) -> np.ndarray:
        ids = _check_ids(token_ids, self.vocab_size, "token_ids", np.asarray(token_ids).ndim, "")
        rows = self.qweight[ids].astype(np.float32)  # (..., D)
        scale = np.repeat(self.scales[ids], self.block, axis=-1)[..., : self.d_model]
        return rows * scale

    def head(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x (N, D) → logits (N, V), one tile of tokens at a time, into a new array or into
        ``out`` (N, V) float32."""
        x = as_float_array(x, "x")
        check_ndim(x, "x", ndim=2, shape_hint="(N, D)")
        check_last_dim(x, "x", self.d_model)
        V, D, bl = self.vocab_size, self.d_model, self.block
        out = np.empty((x.shape[0], V), dtype=np.float32) if out is None else out
        rows = max(1, TILE_ELEMENTS // D)
        for v0 in range(0, V, rows):
            v1 = min(v0 + rows, V)
            tile = self.qweight[v0:v1].astype(np.float32)  # (r, D)
            tile *= np.repeat(self.scales[v0:v1], bl, axis=1)[:, :D]
            np.matmul(x, tile.T, out=out[:, v0:v1])
        return out


def quantize_model(model: GPTModel, block: int = 64, *, head: bool = True) -> GPTModel:
    """Weight-only int8 for a whole GPTModel, in place: every Linear of every block
    (``attn.c_attn``, ``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``) becomes an
    ``Int8Linear``; with ``head=True`` the tied table ``wte`` becomes an ``Int8Embedding``
    (the biggest matrix of a small-vocabulary-heavy model such as GPT-2 small). LayerNorms,
    biases and the position table stay float32.

    The model still runs through lab 04's ``model(token_ids)`` and lab 06's
    ``forward_with_cache`` (the layers are called the same way), and fast through
    ``fast_forward``, ``forward_slots`` and the decoders here.

    Returns:
        the same model object.
    """
    _check_model(model)
    block = _check_block(block, "block")
    linears = {"attn": ("c_attn", "c_proj"), "mlp": ("c_fc", "c_proj")}
    for layer in model.h:
        for owner_name, names in linears.items():
            owner = getattr(layer, owner_name)
            for name in names:
                setattr(owner, name, Int8Linear(getattr(owner, name), block))
    if head:
        model.wte = Int8Embedding(model.wte, block)
    return model


# -- every core for the work between the products -------------------------------------------------

def _blas_libraries() -> list:
    """NumPy's BLAS libraries as threadpoolctl controls them, looked up once: reading or
    setting their thread count is then one call into the library (a few microseconds),
    where ``threadpool_limits`` scans the process's libraries every time."""
    global _BLAS
    if _BLAS is None:
        try:
            _BLAS = [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
        except OSError:  # a sandbox that hides the process's library list: BLAS stays as it was started
            _BLAS = []
    return _BLAS


_BLAS = None


def blas_threads(n: int | None = None) -> int:
    """The number of threads NumPy's BLAS uses now (1 where no BLAS reports one); with ``n``,
    set it to ``n`` first and return the count it had before. The count is one setting for
    the whole process, whichever thread sets it."""
    libs = _blas_libraries()
    before = max((lib.get_num_threads() for lib in libs), default=1)
    if n is not None:
        for lib in libs:
            lib.set_num_threads(int(n))
    return before


def row_blocks(n: int, parts: int, min_rows: int = 1) -> list[tuple[int, int]]:
    """Split rows 0 … n−1 into ``parts`` consecutive blocks (``RowPool.map`` asks for
    several per thread, for its threads to take one at a time).

    The blocks are ``(start, stop)`` pairs in order, covering every row once, their sizes
    differing by at most one row (the larger ones first). There are ``parts`` of them, fewer
    when a block would then hold fewer than ``min_rows`` rows (a block's work must outweigh
    the cost of handing it to a thread), and at least one; none when n is 0.

    Example: ``row_blocks(10, 3)`` is ``[(0, 4), (4, 7), (7, 10)]``;
    ``row_blocks(10, 4, min_rows=4)`` is ``[(0, 5), (5, 10)]``.
    """
    for value, name in ((n, "n"), (parts, "parts"), (min_rows, "min_rows")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if name == "n" else 1):
            raise ValueError(f"{name} must be an integer ≥ {0 if name == 'n' else 1}, got {value!r}")
    if not n:
        return []
    count = max(1, min(parts, n // min_rows))
    small, big = divmod(n, count)
    out, start = [], 0
    for size in [small + 1] * big + [small] * (count - big):
        out.append((start, start + size))
        start += size
    return out


class RowPool:
    """A pool of threads for NumPy work on row blocks, made once and used by every call.

    NumPy releases Python's global interpreter lock (GIL) inside a ufunc's loop and a BLAS
    call, so threads that each run NumPy on their own rows use as many cores. ``map`` cuts
    the rows into ``blocks_per_thread`` blocks per thread and lets every thread, the calling
    one too, take the next block nobody has taken whenever it is free, until none is left: a
    map lasts as long as its slowest thread, and a thread slowed down (a core busy with
    other work, a block that costs more) then holds up one small block, not a share of the
    rows fixed in advance. It holds BLAS to one thread while the blocks run: ``threads``
    workers each calling a BLAS that starts its own threads would ask for threads × BLAS
    threads cores (oversubscription).

    Attributes:
        threads: the workers (the calling thread works too; ``threads − 1`` threads in the
            pool). 1: no pool, the calling thread runs all the rows as one block.
        min_rows: the fewest rows worth a block of their own (``row_blocks``).
        blocks_per_thread: blocks per thread in a map (``row_blocks(n, threads ×
            blocks_per_thread, min_rows)``): more balance better, each costs a hand-out.
        last_blocks: the blocks of the latest ``map`` call, in order of their rows.
        maps: the ``n`` of every ``map`` call so far, in order.
    """

    def __init__(self, threads: int, *, min_rows: int = 16, blocks_per_thread: int | None = None):
        self.threads = check_length(threads, "threads")
        self.min_rows = check_length(min_rows, "min_rows")
        self.blocks_per_thread = (max(1, 8 // self.threads) if blocks_per_thread is None
                                  else check_length(blocks_per_thread, "blocks_per_thread"))
        self.last_blocks: list[tuple[int, int]] = []
        self.maps: list[int] = []
        self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="rowpool") if self.threads > 1 else None

    def close(self) -> None:
        """Stop the pool's threads (a closed pool cannot ``map`` again)."""
        if self._pool is not None:
            self._pool.shutdown()

    def __enter__(self) -> "RowPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def map(self, fn, n: int, *, min_rows: int | None = None) -> None:
        """Call ``fn(start, stop)`` once for each block of ``row_blocks(n, threads ×
        blocks_per_thread, min_rows or self.min_rows)`` (one block when ``threads`` is 1),
        with NumPy's BLAS at one thread until every block has finished (then back to its
        count before). The calling thread and up to ``threads − 1`` of the pool's threads
        each take the next block not yet taken, run it, and come back for another, until
        none is left. ``fn`` writes its rows in place (its return value is ignored); an
        exception raised in a block is raised here, after the other threads have stopped.
        Records the blocks in ``last_blocks`` (``maps`` records each call's ``n``: given)."""
        self.maps.append(int(n))
        parts = self.threads * self.blocks_per_thread if self.threads > 1 else 1
        rows = self.min_rows if min_rows is None else min_rows
        self.last_blocks = row_blocks(n, parts, rows)
        if not self.last_blocks:
            return
        todo = SimpleQueue()  # the blocks not yet taken; get_nowait hands each to one worker
        for block in self.last_blocks:
            todo.put(block)

        def work():
            while True:
                try:
                    a, b = todo.get_nowait()
                except Empty:
                    return
                fn(a, b)

        restore_to = blas_threads(1)
        try:
            jobs = []
            if self._pool is not None:
                for _ in range(min(self.threads, len(self.last_blocks)) - 1):
                    jobs.append(self._pool.submit(work))
            error = None
            try:
                work()
            except BaseException as exc:
                error = exc
            for job in jobs:
                job.result()
            if error is not None:
                raise error
        finally:
            blas_threads(restore_to)


class BlockLog:
    """A ``fn`` for ``RowPool.map`` that only records how it was called: ``calls`` lists
    ``(start, stop, in_caller, blas)`` per block, ``in_caller`` True when the block ran in
    the thread that made this log (the one that calls ``map``), ``blas`` the BLAS thread
    count inside the block. With ``fail_at``, the block starting there raises
    ZeroDivisionError (an error inside a pool thread). With ``hold``, the first block to
    start in a pool thread waits until ``hold`` other blocks have finished (a thread stuck
    on a busy core): a pool whose free threads take the remaining blocks lets it go on; one
    that gave that thread more blocks in advance leaves it waiting, and after ``patience``
    seconds it raises TimeoutError. ``held`` is that block, None when no pool thread ran one."""

    def __init__(self, fail_at: int | None = None, *, hold: int | None = None, patience: float = 10.0):
        self.fail_at, self.calls, self._caller = fail_at, [], threading.get_ident()
        self.hold, self.patience, self.held, self._finished = hold, patience, None, 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def __call__(self, start: int, stop: int) -> None:
        with self._lock:
            here = threading.get_ident() == self._caller
            self.calls.append((int(start), int(stop), here, blas_threads()))
            wait = self.hold is not None and self.held is None and not here
            if wait:
                self.held = (int(start), int(stop))
                if not self._changed.wait_for(lambda: self._finished >= self.hold, timeout=self.patience):
                    raise TimeoutError(
                        f"block {start} … {stop} (in a pool thread) waited {self.patience:g} s for {self.hold} other "
                        f"blocks to finish and {self._finished} did: the other threads, the calling one among them, did not "
                        "take the remaining blocks (were they given to this thread in advance, or does the calling "
                        "thread only wait?)")
        try:
            if self.fail_at is not None and start == self.fail_at:
                raise ZeroDivisionError(f"block {start} … {stop} failed (BlockLog(fail_at={self.fail_at}))")
        finally:
            with self._lock:
                self._finished += 1
                self._changed.notify_all()


def _product(layer, x: np.ndarray, out: np.ndarray, pool: RowPool | None = None):
    """``x @ W`` of a lab-03 ``Linear`` into ``out``, without its bias, and that bias (None
    when it has none): the caller adds it where it next passes over ``out``. Any other
    layer (an ``Int8Linear``) through its own ``__call__``, bias included, copied into out.

    With ``pool``, the product runs in ``pool.map`` (``_pooled_matmul``). The pool's
    threads then do the work BLAS's own threads would: OpenBLAS's threads, once woken, keep
    busy-waiting for their next product for a while (about 0.1 s by default) before they
    sleep, and in a pass that alternates products with maps they take the cores the pool's
    threads need."""
    if type(layer) is not Linear:
        np.copyto(out, layer(x))
        return out, None
    if pool is None:
        return np.matmul(x, layer.weight, out=out), layer.bias
    return _pooled_matmul(pool, x, layer.weight, out), layer.bias


def _pooled_matmul(pool: RowPool, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.matmul(x, w, out=out)`` for 2-D x (N, K) and w (K, M), in ``pool.map``, each
    block one product at BLAS's one thread, over blocks of the larger of out's two sides:
    its rows (``x[a:b] @ w`` into ``out[a:b]``) when N ≥ M, else its columns
    (``x @ w[:, a:b]`` into ``out[:, a:b]``). Every block reads and repacks all of the
    operand it does not cut, so cutting the larger side reads the least, and the blocks
    are about one per thread (at least ``n // threads`` rows and the pool's ``min_rows``;
    exactly one per thread when ``threads`` divides ``n``), not the pool's several: a
    product's blocks all cost the same, and each further block costs another repacking.
    Returns ``out``."""
    if x.shape[0] >= w.shape[1]:
        fn, n = (lambda a, b: np.matmul(x[a:b], w, out=out[a:b])), x.shape[0]
    else:
        fn, n = (lambda a, b: np.matmul(x, w[:, a:b], out=out[:, a:b])), w.shape[1]
    pool.map(fn, n, min_rows=max(pool.min_rows, n // pool.threads))
    return out


def _query_chunks(T: int, parts: int, step: int) -> list[tuple[int, int]]:
    """Query ranges of one causal head that cost about the same: query i sees i + 1 keys,
    so the work up to query e grows like e², and the bounds sit at T·√(j/parts), rounded to
    multiples of ``step`` (empty ranges dropped)."""
    bounds = sorted({min(T, int(round(T * math.sqrt(j / parts) / step)) * step) for j in range(1, parts)} | {0, T})
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def threaded_forward(model: GPTModel, token_ids: np.ndarray, pool: RowPool, *, block_q: int = 128,
                     block_k: int = 1024, out: np.ndarray | None = None) -> np.ndarray:
    """``fast_forward`` with all its work on every thread of ``pool``, BLAS at one thread.

    Every step runs in a ``pool.map``, so BLAS stays at one thread for the whole pass and
    its own threads never wake (once woken, they busy-wait between products and take the
    cores the pool needs). The products (each Linear on all B·T rows, then the head) go
    through ``_product(..., pool)`` and ``_head(..., pool)``: blocks of the rows or of
    the weight's columns, whichever are more. The rest runs over row blocks of the (B·T, ·)
    arrays: after ``c_attn``, its bias and the copy into contiguous heads (blocks of the
    B·H (batch row, head) pairs); attention (blocks of (batch row, query range) tasks, each one
    ``tiled_causal_attention`` of the range's queries in every head against the keys up to
    its last, written into its place among the merged heads: all heads in one call, so a
    task makes as few NumPy calls, each holding the GIL a moment, as it can); after each
    ``c_proj``, its bias and the residual addition, then the next LayerNorm (``ln_2``, the
    next block's ``ln_1`` or ``ln_f``) of the same rows; after ``c_fc``, its bias and
    ``fast_gelu``. That is 1 + 9 maps per block + 1: ``ln_1`` of block 0; per block
    ``c_attn``, heads, attention, ``c_proj``, residual + ``ln_2``, ``c_fc``, GELU,
    ``c_proj``, residual + the next LayerNorm; the head.

    Args:
        model, token_ids, block_q, block_k, out: as ``fast_forward``.
        pool: a ``RowPool`` (its threads decide the blocks; one thread runs everything in
            the calling thread).

    Returns:
        float32 (B, T, V) logits equal to ``fast_forward``'s within float32 rounding (the
        attention's query ranges change the tiles' order of summation, nothing else).
    """
    _check_model(model)
    if not isinstance(pool, RowPool):
        raise TypeError(f"pool must be a RowPool, got {type(pool).__name__}")
    token_ids = _check_ids(token_ids, model.vocab_size, "token_ids", 2, "(B, T)")
    B, T = token_ids.shape
    if not 1 <= T <= model.max_seq_len:
        raise ValueError(f"token_ids needs 1 … max_seq_len={model.max_seq_len} tokens per row, got {T}")
    _check_out(out, (B, T, model.vocab_size), "(B, T, V)")
    block_q, block_k = _check_block(block_q, "block_q"), _check_block(block_k, "block_k")
    D, N = model.d_model, B * T
    H = model.h[0].attn.num_heads
    dh = D // H
    x = (model.wte(token_ids) + model.wpe(T)).reshape(N, D)
    normed, added = np.empty((N, D), np.float32), np.empty((N, D), np.float32)
    qkv, hidden = np.empty((N, 3 * D), np.float32), np.empty((N, model.h[0].mlp.c_fc.d_out), np.float32)
    heads, merged = np.empty((3, B, H, T, dh), np.float32), np.empty((B, T, H, dh), np.float32)
    jobs = [(b, h, s, e) for b in range(B) for h in range(H)
            for s, e in _query_chunks(T, max(1, -(-2 * pool.threads // (B * H))), min(block_q, T))]
    after = [blk.ln_1 for blk in model.h[1:]] + [model.ln_f]

    def finish(bias, ln):
        def rows(a, b):
            np.add(x[a:b], added[a:b], out=x[a:b])
            if bias is not None:
                np.add(x[a:b], bias, out=x[a:b])
            _layer_norm(x[a:b], ln, normed[a:b])
        pool.map(rows, N)

    def split(bias):
        grid = qkv.reshape(B, T, 3, H, dh)
        offsets = np.zeros((3, H, dh), np.float32) if bias is None else bias.reshape(3, H, dh)

        def some(a, b):
            for i in range(a, b):
                bi, hi = divmod(i, H)
                for j in range(3):
                    np.add(grid[bi, :, j, hi], offsets[j, hi], out=heads[j, bi, hi])
        pool.map(some, B * H, min_rows=1)

    def attend(a, b):
        for bi, hi, s, e in jobs[a:b]:
            merged[bi, s:e, hi] = tiled_causal_attention(heads[0, bi, hi, s:e], heads[1, bi, hi, :e],
                                                         heads[2, bi, hi, :e], block_q=block_q, block_k=block_k)

    def activate(bias):
        def rows(a, b):
            if bias is not None:
                np.add(hidden[a:b], bias, out=hidden[a:b])
            fast_gelu(hidden[a:b])
        pool.map(rows, N)

    pool.map(lambda a, b: _layer_norm(x[a:b], model.h[0].ln_1, normed[a:b]), N)
    for block, ln in zip(model.h, after):
        split(_product(block.attn.c_attn, normed, qkv, pool)[1])
        pool.map(attend, len(jobs), min_rows=1)
        finish(_product(block.attn.c_proj, merged.reshape(N, D), added, pool)[1], block.ln_2)
        activate(_product(block.mlp.c_fc, normed, hidden, pool)[1])
        finish(_product(block.mlp.c_proj, hidden, added, pool)[1], ln)
    logits = _head(model, normed, None if out is None else out.reshape(N, -1), pool)
    return logits.reshape(B, T, -1) if out is None else out
