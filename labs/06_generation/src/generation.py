# Lab 06: fill in each `# YOUR CODE HERE` block in this file, then run `uv run pytest -m lab06`.
"""Lab 06 · Generation: sampling strategies, beam search, a KV cache, cross-entropy and
perplexity, on top of lab 04's GPTModel.

Shapes: B batch (rows), T tokens fed in this call, S keys (cached + new), V vocabulary
size, H heads, d_head per-head width, L the model's max_seq_len, n new tokens. Logits are
float (float32 in gives float32 out); token ids are integers, int64 out.

Decoding turns the model's scores for the next token into a choice:

    logits (B, V) ─ / temperature ─ top-k ─ top-p ─ softmax ─ draw one id per row

and repeats, feeding each choice back. A KV cache keeps every block's keys and values of
the tokens already seen, so each step runs the model on the new token only.
"""

from __future__ import annotations

import math

import numpy as np

from causal_mask import softmax
from gpt import GPTModel
from gptkit import as_float_array, check_length, check_ndim, make_rng


# -- input checks shared by the samplers ------------------------------------------------

def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number ≥ 0 (0 means greedy), got {temperature}")
    return float(temperature)


def _check_top_k(k) -> int:
    return check_length(k, "top-k's k")


def _check_top_p(p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"top-p's p must be a number, got {type(p).__name__}")
    if not 0 < p <= 1:
        raise ValueError(f"top-p's p must be in (0, 1] (p = 1 keeps every token), got {p}")
    return float(p)


def _check_token_ids(token_ids, vocab_size: int, name: str = "token_ids") -> np.ndarray:
    token_ids = np.asarray(token_ids)
    check_ndim(token_ids, name, ndim=2, shape_hint="(B, T)")
    if token_ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {token_ids.dtype}")
    if token_ids.size and (token_ids.min() < 0 or token_ids.max() >= vocab_size):
        raise ValueError(f"{name} must be ids in the vocabulary 0 … {vocab_size - 1}, "
                         f"got values from {token_ids.min()} to {token_ids.max()}")
    return token_ids


def _check_eos(eos_token_id, vocab_size: int):
    if eos_token_id is None:
        return None
    eos = check_length(eos_token_id, "eos_token_id", minimum=0)
    if eos >= vocab_size:
        raise ValueError(f"eos_token_id={eos} is not in the vocabulary 0 … {vocab_size - 1}")
    return eos


def _check_prompt(model: GPTModel, token_ids, max_new_tokens) -> np.ndarray:
    """The prompt (B, T ≥ 1) as checked ids, once ``max_new_tokens`` is known to fit."""
    check_length(max_new_tokens, "max_new_tokens", minimum=0)
    token_ids = _check_token_ids(token_ids, model.vocab_size)
    if token_ids.shape[1] < 1:
        raise ValueError("token_ids needs at least one token per row to start from")
    _check_room(model, token_ids.shape[1], max_new_tokens)
    return token_ids


def _check_room(model: GPTModel, prompt_len: int, new_tokens: int) -> None:
    if prompt_len + new_tokens > model.max_seq_len:
        raise ValueError(
            f"cannot add {new_tokens} tokens to a prompt of {prompt_len}: the result would be "
            f"{prompt_len + new_tokens} tokens long but the model has positions for only "
            f"max_seq_len={model.max_seq_len}"
        )


# -- turning logits into a choice ----------------------------------------------------------

def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Logits divided by the temperature: below 1 sharpens the distribution, above 1 flattens it.

    Args:
        logits: (..., V) float.
        temperature: > 0. (Temperature 0 is greedy decoding: ``sample_next`` takes the
            argmax and never calls this.)

    Returns:
        (..., V), same dtype as ``logits``.
    """
    logits = as_float_array(logits, "logits")
    if _check_temperature(temperature) == 0:
        raise ValueError("temperature 0 cannot divide the logits: it means greedy decoding (take the argmax)")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · apply_temperature: divide the logits (before any softmax) by the temperature')


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep each row's k largest logits; set every other one to -inf.

    Args:
        logits: (..., V) float.
        k: ≥ 1. With k ≥ V nothing is removed.

    Returns:
        (..., V), same dtype. Ties: a logit equal to the row's k-th largest is kept, so a
        row can keep more than k tokens when values tie at the boundary (as HuggingFace's
        ``top_k`` does).
    """
    logits = as_float_array(logits, "logits")
    check_ndim(logits, "logits", min_ndim=1, shape_hint="(..., V)")
    k = _check_top_k(k)
    # YOUR CODE HERE
    raise NotImplementedError("Lab 06 · top_k_filter: find each row's k-th largest value; everything below it becomes -inf")


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probabilities
    sum to at least p; set every other logit to -inf.

    Args:
        logits: (..., V) float (-inf entries allowed: probability 0).
        p: in (0, 1]. p = 1 keeps every token. The most likely token is always kept.

    Returns:
        (..., V), same dtype. In probability order, a token is kept when the tokens more
        likely than it sum to less than p. Among equally likely tokens the higher id comes
        first (as in HuggingFace): p = 0.5 over 8 equal logits keeps ids 4 … 7.
    """
    logits = as_float_array(logits, "logits")
    check_ndim(logits, "logits", min_ndim=1, shape_hint="(..., V)")
    p = _check_top_p(p)
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · top_p_filter: sort by probability, keep tokens while the mass before them is < p, -inf elsewhere')


def sample_next(logits: np.ndarray, *, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, rng: np.random.Generator | None = None) -> np.ndarray:
    """One next token per row, drawn from the logits.

    Args:
        logits: (B, V) float, the scores of the next token for each row.
        temperature: ≥ 0; 0 means greedy (the argmax, no randomness).
        top_k: keep only the k most likely tokens (None: no limit).
        top_p: keep only the nucleus of mass p (None: no limit).
        rng: the generator every random number comes from (None: a fresh, unseeded one).

    Returns:
        int64 (B,). Order of operations (HuggingFace's): temperature, then top-k, then
        top-p, then softmax, then one draw per row from that row's own distribution.
    """
    logits = as_float_array(logits, "logits")
    check_ndim(logits, "logits", ndim=2, shape_hint="(B, V)")
    temperature = _check_temperature(temperature)
    top_k = None if top_k is None else _check_top_k(top_k)
    top_p = None if top_p is None else _check_top_p(top_p)
    rng = make_rng(rng)
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · sample_next: temperature 0: argmax; else temperature, top-k, top-p, softmax, one inverse-CDF draw per row')


# -- cross-entropy and perplexity --------------------------------------------------------------

def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(softmax(x)) computed stably: x - max - log(sum(exp(x - max))).

    Same shape and dtype as ``x``; never overflows, whatever the size of the scores.
    """
    x = as_float_array(x, "x")
    check_ndim(x, "x", min_ndim=1)
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · log_softmax: subtract the max, then subtract the log of the sum of exponentials')


def cross_entropy(logits: np.ndarray, targets: np.ndarray, ignore_index: int | None = None) -> np.float32:
    """Mean negative log-likelihood of the targets: mean over tokens of -log softmax(logits)[target].

    Args:
        logits: (..., V) float, one row of scores per token.
        targets: (...) int, the right token for each row; entries equal to
            ``ignore_index`` (e.g. padding) count for nothing.
        ignore_index: a target value to skip, or None.

    Returns:
        a float32 scalar: the mean over the targets that are not ignored (every token
        weighs the same, whichever row it is in).
    """
    logits = as_float_array(logits, "logits")
    targets = np.asarray(targets)
    check_ndim(logits, "logits", min_ndim=1, shape_hint="(..., V)")
    if targets.dtype.kind not in "iu":
        raise TypeError(f"targets must be integer token ids, got dtype {targets.dtype}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have the logits' shape without the vocabulary axis, "
                         f"{logits.shape[:-1]}; got {targets.shape}")
    V = logits.shape[-1]
    valid = np.ones(targets.shape, bool) if ignore_index is None else targets != ignore_index
    if not valid.any():
        raise ValueError("every target is ignored: the mean loss over no tokens is undefined")
    if targets[valid].min() < 0 or targets[valid].max() >= V:
        raise ValueError(f"targets must be ids in the vocabulary 0 … {V - 1} (or ignore_index), "
                         f"got values from {targets[valid].min()} to {targets[valid].max()}")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · cross_entropy: log-probability of each target via log_softmax; average over the targets that are not ignored')


def next_token_loss(model, token_ids: np.ndarray, pad_id: int | None = None) -> np.float32:
    """The language-modelling loss: position t's logits score token t+1.

    Args:
        model: a GPTModel (or any callable token_ids (B, T) → logits (B, T, V)).
        token_ids: (B, T) int, T ≥ 2. Pad the rows on the right with ``pad_id``.
        pad_id: targets equal to it are ignored (None: nothing is ignored).

    Returns:
        a float32 scalar: ``cross_entropy`` of logits[:, :-1] against token_ids[:, 1:],
        the same number as HuggingFace's ``model(ids, labels=ids).loss`` (with the
        padding's labels set to -100). ``token_ids`` is not modified.
    """
    token_ids = np.asarray(token_ids)
    check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, T)")
    if token_ids.dtype.kind not in "iu":
        raise TypeError(f"token_ids must be integers, got dtype {token_ids.dtype}")
    if token_ids.shape[1] < 2:
        raise ValueError(f"the loss needs at least 2 tokens per row (one to read, one to predict), "
                         f"got shape {token_ids.shape}")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · next_token_loss: run the model; the logits at positions 0…T-2 predict the tokens at 1…T-1')


def perplexity(model, token_ids: np.ndarray, pad_id: int | None = None) -> np.float32:
    """exp(next_token_loss): the number of equally likely tokens the model is, on average,
    choosing between. A float32 scalar ≥ 1; a model that knows nothing scores V."""
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · perplexity: the exponential of the mean next-token loss')


# -- the KV cache ------------------------------------------------------------------------------

class KVCache:
    """The keys and values of the tokens a GPTModel has already seen, for every block.

    Attributes:
        keys, values: one float32 buffer (B, H, L, d_head) per block, allocated once.
            Positions 0 … length-1 hold data; the rest is room for what comes.
        length: how many positions are filled, i.e. the position of the next token.
        batch_size (B), max_seq_len (L), num_heads (H), d_head.
    """

    def __init__(self, model: GPTModel, batch_size: int):
        self.batch_size = check_length(batch_size, "batch_size")
        self.max_seq_len = model.max_seq_len
        self.num_heads, self.d_head = model.h[0].attn.num_heads, model.h[0].attn.d_head
        shape = (self.batch_size, self.num_heads, self.max_seq_len, self.d_head)
        self.keys = [np.zeros(shape, np.float32) for _ in model.h]
        self.values = [np.zeros(shape, np.float32) for _ in model.h]
        self.length = 0

    def update(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store block ``layer``'s keys and values of T new tokens at positions
        length … length+T-1, and return everything that block has stored.

        Args:
            layer: the block's index, 0 … num_layers-1.
            k, v: (B, H, T, d_head) float32, the new tokens' keys and values.

        Returns:
            (keys, values), each (B, H, length+T, d_head): views into the buffers, no copy.
            ``length`` itself is not changed here: ``forward_with_cache`` advances it once
            every block has stored its keys and values.
        """
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < len(self.keys):
            raise ValueError(f"layer must be a block index 0 … {len(self.keys) - 1}, got {layer!r}")
        k, v = np.asarray(k), np.asarray(v)
        B, H, d = self.batch_size, self.num_heads, self.d_head
        if k.ndim != 4 or k.shape != v.shape or (k.shape[0], k.shape[1], k.shape[3]) != (B, H, d):
            raise ValueError(f"k and v must both be (B, H, T, d_head) = ({B}, {H}, T, {d}); "
                             f"got k {k.shape}, v {v.shape}")
        if self.length + k.shape[2] > self.max_seq_len:
            raise ValueError(f"the cache holds {self.length} positions and cannot take {k.shape[2]} more: "
                             f"max_seq_len={self.max_seq_len}")
        # YOUR CODE HERE
        raise NotImplementedError("Lab 06 · KVCache.update: write k and v into positions length … length+T-1 of this layer's buffers; return views up to there")

    def reorder(self, rows: np.ndarray) -> None:
        """Make row i hold what row ``rows[i]`` held, in every buffer (beam search keeps
        the beams it picked, some twice, and drops the others).

        Args:
            rows: (B,) int, each in 0 … B-1.
        """
        rows = np.asarray(rows)
        if rows.shape != (self.batch_size,) or rows.dtype.kind not in "iu":
            raise ValueError(f"rows must be {self.batch_size} integer row indices, got {rows.dtype} {rows.shape}")
        if rows.min() < 0 or rows.max() >= self.batch_size:
            raise ValueError(f"rows must be row indices 0 … {self.batch_size - 1}, got {rows.tolist()}")
        # YOUR CODE HERE
        raise NotImplementedError("Lab 06 · KVCache.reorder: copy the chosen rows' filled positions into place, in every layer's keys and values")


def forward_with_cache(model: GPTModel, token_ids: np.ndarray, cache: KVCache) -> np.ndarray:
    """Run the model on T new tokens that follow the ``cache.length`` tokens already cached.

    Args:
        model: a GPTModel (lab 04), used through its own sub-layers.
        token_ids: (B, T) int, the tokens at positions cache.length … cache.length+T-1.
        cache: a KVCache built for this model with batch size B.

    Returns:
        float32 logits (B, T, V): exactly ``model(all tokens so far)[:, -T:]``, while
        computing only the new positions. ``cache.length`` grows by T.
    """
    token_ids = _check_token_ids(token_ids, model.vocab_size)
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
    if len(cache.keys) != len(model.h) or cache.max_seq_len != model.max_seq_len:
        raise ValueError("this cache was built for another model (KVCache(model, batch_size))")
    B, T = token_ids.shape
    if B != cache.batch_size:
        raise ValueError(f"token_ids has {B} rows but the cache was built for batch_size={cache.batch_size}")
    if T < 1:
        raise ValueError("token_ids needs at least one new token per row")
    if cache.length + T > model.max_seq_len:
        raise ValueError(
            f"the cache holds {cache.length} tokens; {T} more would go past the model's "
            f"max_seq_len={model.max_seq_len}: there are no positions for them"
        )
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · forward_with_cache: embed at positions length…, per block: ln_1, q/k/v, cache.update, attend, c_proj, residuals, mlp; ln_f, tied head; advance length')


# -- decoding loops ------------------------------------------------------------------------------

def generate(model: GPTModel, token_ids: np.ndarray, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, rng: np.random.Generator | None = None,
             eos_token_id: int | None = None, use_cache: bool = True) -> np.ndarray:
    """Append up to ``max_new_tokens`` tokens to every row, each drawn by ``sample_next``.

    Args:
        model: a GPTModel (in eval mode).
        token_ids: (B, T) int prompt, T ≥ 1.
        max_new_tokens: n ≥ 0; T + n must be ≤ the model's max_seq_len.
        temperature, top_k, top_p, rng: as ``sample_next`` (temperature 0: greedy).
        eos_token_id: once a row emits it, that row's later tokens are all eos_token_id,
            and generation stops as soon as every row has emitted it. Any id is an EOS,
            0 included; None (the default) means none.
        use_cache: True runs the prompt once and then one token per step through a
            KVCache; False runs the whole sequence through the model at every step.

    Returns:
        int64 (B, T + m), m ≤ n new tokens (m < n only when every row reached EOS). With
        temperature 0 this is HuggingFace's ``generate(do_sample=False)`` with
        ``pad_token_id=eos_token_id``.
    """
    token_ids = _check_prompt(model, token_ids, max_new_tokens)
    eos = _check_eos(eos_token_id, model.vocab_size)
    temperature = _check_temperature(temperature)
    top_k = None if top_k is None else _check_top_k(top_k)
    top_p = None if top_p is None else _check_top_p(top_p)
    rng = make_rng(rng)
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · generate: loop: logits of the last position (cache: feed only the new token), sample_next, EOS bookkeeping, stop when all rows ended')


def beam_search(model: GPTModel, token_ids: np.ndarray, num_beams: int, max_new_tokens: int, *,
                eos_token_id: int | None = None, length_penalty: float = 1.0) -> np.ndarray:
    """The most likely continuation found by keeping ``num_beams`` candidates at each step:
    HuggingFace's ``generate(num_beams=…, do_sample=False)`` (``early_stopping=False``), for
    each prompt row separately. The rules (scores, when a hypothesis ends, the length
    penalty, when a row is done) are in docs/06_generation.md, "Beam search".

    Args:
        model: a GPTModel (in eval mode).
        token_ids: (B, T) int prompts.
        num_beams: ≥ 1 (1 is greedy). Best with 2·num_beams ≤ V.
        max_new_tokens: n ≥ 0; T + n ≤ max_seq_len.
        eos_token_id: the token that ends a hypothesis (None: none does).
        length_penalty: the exponent of the length; > 0 favours longer hypotheses.

    Returns:
        int64 (B, T + m): each row's best finished hypothesis, m the longest of them;
        shorter rows are filled with eos_token_id after their EOS.
    """
    num_beams = check_length(num_beams, "num_beams")
    token_ids = _check_prompt(model, token_ids, max_new_tokens)
    eos = _check_eos(eos_token_id, model.vocab_size)
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float, np.integer, np.floating)):
        raise TypeError(f"length_penalty must be a number, got {type(length_penalty).__name__}")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 06 · beam_search: run num_beams copies of every row through one KVCache; rank candidates, keep finished hypotheses, reorder the cache')
