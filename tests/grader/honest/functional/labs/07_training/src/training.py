"""Lab 07 · Training: the backward pass of every piece of the GPT, AdamW, gradient
clipping, a learning-rate schedule, and a character-level training loop.

Functional style: gradients stored through one small helper, the global norm as
fsum over a map, offsets in the checkpoint by itertools.accumulate, the evaluation
batches drawn through a partial.

Shapes: B batch, T tokens, D model width, H heads, d_head = D / H, F feed-forward width,
V vocabulary size, L max sequence length, N = B·T target tokens. float32 throughout
(float64 in gives float64 out: the gradient checks run in float64).

Every backward is a plain function: it takes the gradient of the loss with respect to
the forward's output (``dout``, the same shape as the output) and what the forward saw
(its inputs and parameters), and returns the gradients with respect to each of them.
``gpt_forward`` runs the model while keeping those inputs in a cache; ``gpt_backward``
walks the cache in reverse and returns a gradient for every parameter under GPT-2's
name, so ``grads[name]`` lines up with ``model.state_dict()[name]``.
"""

from __future__ import annotations

import json
import math
from functools import partial, reduce
from itertools import accumulate, repeat
from operator import add
from pathlib import Path

import numpy as np

from causal_mask import additive_mask, causal_mask, softmax
from gpt import GPTModel
from gptkit import Layer, as_float_array, check_length, check_ndim, make_rng
from layers import gelu


# -- the backward of each piece ----------------------------------------------------------

def linear_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray):
    """Backward of ``y = x @ weight + bias``.

    Args:
        dout: (..., d_out) gradient of the loss with respect to y.
        x: (..., d_in) the forward's input.
        weight: (d_in, d_out).

    Returns:
        ``(dx, dweight, dbias)``: (..., d_in), (d_in, d_out), (d_out,). The weight and bias
        gradients sum over every leading position (each position used the same weight).
    """
    d_in, d_out = weight.shape
    x2 = x.reshape(-1, d_in)
    g2 = dout.reshape(-1, d_out)
    dx = (g2 @ weight.T).reshape(x.shape)
    return dx, x2.T @ g2, g2.sum(axis=0)


def layernorm_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float = 1e-5):
    """Backward of lab 03's LayerNorm over the last axis: y = x̂ · weight + bias, where
    x̂ = (x − mean) / √(var + eps) with the biased variance.

    Args:
        dout: (..., D). x: (..., D) the forward's input. weight: (D,) the gain.

    Returns:
        ``(dx, dweight, dbias)``: (..., D), (D,), (D,). The mean and the variance depend on
        every element of the row, so dx has three terms, not one.
    """
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat = xc * rstd
    dxhat = dout * weight
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    D = x.shape[-1]
    return dx, (dout * xhat).reshape(-1, D).sum(axis=0), dout.reshape(-1, D).sum(axis=0)


def gelu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Backward of lab 03's ``gelu`` (the tanh form, GPT-2's): dout · gelu'(x), same shape.

    With u = √(2/π)·(x + 0.044715·x³): gelu(x) = 0.5·x·(1 + tanh u), so
    gelu'(x) = 0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²).
    """
    c, a = math.sqrt(2.0 / math.pi), 0.044715
    # With σ = 0.5·(1 + tanh u) = 1 / (1 + e^(−2u)), 1 − tanh² u = 4σ(1 − σ), so
    # gelu'(x) = σ + 2c·x·(1 + 3a·x²)·σ·(1 − σ): the same value, from exp, which NumPy
    # computes about twice as fast as tanh. In a few buffers, as lab 03's gelu: these arrays
    # are (B·T, 4D), and a fresh array per operation costs more than the arithmetic.
    x2 = x * x
    sigma = x2 * (-2.0 * a * c)
    sigma -= 2.0 * c
    sigma *= x  # −2u
    np.minimum(sigma, 88.0, out=sigma)  # no float32 overflow in exp; σ is 0 to float32's precision there
    np.exp(sigma, out=sigma)
    sigma += 1.0
    np.divide(1.0, sigma, out=sigma)  # σ
    slope = x2  # x² is not needed again: its buffer becomes the result
    slope *= 3.0 * a * 2.0 * c
    slope += 2.0 * c
    slope *= x  # 2c·x·(1 + 3a·x²)
    slope *= sigma
    slope *= 1.0 - sigma
    slope += sigma
    slope *= dout
    return slope


def dropout_forward(x: np.ndarray, p: float, rng: np.random.Generator | None):
    """Inverted dropout while training: ``(out, keep)``. ``keep`` is the boolean mask of the
    kept elements (drawn as ``rng.random(x.shape) >= p``), ``out = x · keep / (1 − p)``.
    With ``p == 0`` or ``rng`` None nothing is dropped and ``keep`` is None."""
    if p == 0 or rng is None:
        return x, None
    keep = rng.random(x.shape) >= p
    return np.where(keep, x / (1.0 - p), 0.0).astype(x.dtype), keep


def dropout_backward(dout: np.ndarray, keep: np.ndarray | None, p: float) -> np.ndarray:
    """Backward of ``dropout_forward``: the gradient flows only through the elements the
    forward kept, scaled by 1/(1 − p). It must use the forward's own ``keep`` mask (None:
    nothing was dropped, the gradient passes unchanged)."""
    if keep is None:
        return dout
    return np.where(keep, dout / (1.0 - p), 0.0).astype(dout.dtype)


def softmax_backward(dout: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Backward of ``probs = softmax(x, axis=-1)``, given the forward's output ``probs``.

    Each output depends on every input of its row (they share the normaliser), so the
    Jacobian is diag(p) − p pᵀ, not diagonal: dx = p · (dout − Σ_j dout_j p_j).
    """
    return probs * (dout - (dout * probs).sum(axis=-1, keepdims=True))


def softmax_cross_entropy(logits: np.ndarray, targets: np.ndarray):
    """The mean cross-entropy of ``logits`` (..., V) against integer ``targets`` (...), and
    its gradient with respect to the logits, in one stable pass.

    Returns:
        ``(loss, dlogits)``: loss a float32 scalar (``np.float32``; the logits' dtype for
        float64), the mean over all N target tokens of −log softmax(logits)[target];
        dlogits (..., V) = (softmax(logits) − onehot(target)) / N.
    """
    logits = as_float_array(logits, "logits")
    targets = np.asarray(targets)
    if targets.shape != logits.shape[:-1] or targets.dtype.kind not in "iu":
        raise ValueError(f"targets must be integers of shape {logits.shape[:-1]} (the logits' without V), "
                         f"got {targets.dtype} {targets.shape}")
    V = logits.shape[-1]
    if targets.size == 0:
        raise ValueError(f"softmax_cross_entropy needs at least one target: got targets of shape {targets.shape}, "
                         "and a mean over N = 0 targets has no value")
    if targets.min() < 0 or targets.max() >= V:
        raise ValueError(f"targets must be ids in 0 … {V - 1}, got values from {targets.min()} to {targets.max()}")
    z = logits.reshape(-1, V)
    t = targets.reshape(-1)
    n = t.size
    shifted = z - z.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=-1, keepdims=True)
    rows = np.arange(n)
    loss = (np.log(total[:, 0]) - shifted[rows, t]).mean()
    dlogits = exp / total  # the probabilities
    dlogits[rows, t] -= 1.0
    dlogits /= n  # the loss is a mean over the N targets
    return logits.dtype.type(loss), dlogits.reshape(logits.shape)


def causal_attention_backward(dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                              keep: np.ndarray | None = None, p: float = 0.0, weights: np.ndarray | None = None):
    """Backward of causal scaled dot-product attention for all heads at once:
    ``out = dropout(softmax(q kᵀ / √d_head + causal mask)) @ v``.

    Args:
        dout: (B, H, T, d_head). q, k, v: (B, H, T, d_head), the forward's inputs.
        keep, p: the attention-dropout mask (B, H, T, T) the forward drew and its
            probability (None: no dropout).
        weights: the forward's softmax output (B, H, T, T), before dropout, if it was
            kept; None: recompute it from q and k, with the same scale and the same
            causal mask as the forward.

    Returns:
        ``(dq, dk, dv)``, each (B, H, T, d_head).
    """
    T, d_head = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d_head)
    if weights is None:
        scores = (q @ k.swapaxes(-1, -2)) * scale
        scores += additive_mask(causal_mask(T, k.shape[-2]), scores.dtype)
        weights = softmax(scores, axis=-1)  # (B, H, T, T)
    dropped = dropout_forward_with(weights, keep, p)
    dv = dropped.swapaxes(-1, -2) @ dout
    dweights = dropout_backward(dout @ v.swapaxes(-1, -2), keep, p)
    dscores = softmax_backward(dweights, weights) * scale
    return dscores @ k, dscores.swapaxes(-1, -2) @ q, dv


def dropout_forward_with(x: np.ndarray, keep: np.ndarray | None, p: float) -> np.ndarray:
    """Dropout with a mask already drawn: ``x · keep / (1 − p)`` (``x`` when keep is None)."""
    if keep is None:
        return x
    return np.where(keep, x / (1.0 - p), 0.0).astype(x.dtype)


def embedding_backward(dout: np.ndarray, token_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """Backward of an embedding lookup ``out = weight[token_ids]``.

    Args:
        dout: (..., D). token_ids: (...) integers. vocab_size: rows of the table.

    Returns:
        dweight (vocab_size, D): row i is the sum of ``dout`` over every position whose id
        is i (an id used twice gets both gradients), zero for ids never used.
    """
    D = dout.shape[-1]
    dweight = np.zeros((vocab_size, D), dtype=dout.dtype)
    np.add.at(dweight, np.asarray(token_ids).reshape(-1), dout.reshape(-1, D))
    return dweight


def tied_head_backward(dlogits: np.ndarray, x: np.ndarray, wte: np.ndarray):
    """Backward of the tied output head ``logits = x @ wte.T``.

    Args:
        dlogits: (..., V). x: (..., D) the final LayerNorm's output. wte: (V, D).

    Returns:
        ``(dx, dwte)``: (..., D) and (V, D), this use's share of the embedding's gradient.
    """
    V, D = wte.shape
    g2 = dlogits.reshape(-1, V)
    return (g2 @ wte).reshape(x.shape), g2.T @ x.reshape(-1, D)


# -- the whole model ---------------------------------------------------------------------

def _split_heads(x: np.ndarray, H: int) -> np.ndarray:
    B, T, D = x.shape
    return x.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    B, H, T, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * d)


def gpt_forward(model: GPTModel, token_ids: np.ndarray, *, rng: np.random.Generator | None = None):
    """Lab 04's forward pass, keeping what the backward needs.

    Args:
        model: a lab-04 ``GPTModel``.
        token_ids: (B, T) integers, T ≤ max_seq_len.
        rng: where dropout draws its masks. Dropout is active only when the model is in
            training mode, its probability is above 0 and ``rng`` is given; otherwise the
            logits equal ``model(token_ids)``.

    Returns:
        ``(logits, cache)``: logits (B, T, V); ``cache``, a dict for ``gpt_backward`` (its
        layout is yours to choose).
    """
    token_ids = np.asarray(token_ids)
    check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, T)")
    if token_ids.shape[1] > model.max_seq_len:
        raise ValueError(f"a sequence of {token_ids.shape[1]} tokens is longer than max_seq_len={model.max_seq_len}")
    drop_rng = rng if model.training else None
    T = token_ids.shape[1]
    x, emb_keep = dropout_forward(model.wte(token_ids) + model.wpe(T), model.drop.p, drop_rng)
    blocks = []
    for block in model.h:
        attn, mlp = block.attn, block.mlp
        c = {"x_in": x, "h1": block.ln_1(x)}
        q, k, v = np.split(attn.c_attn(c["h1"]), 3, axis=-1)
        q, k, v = (_split_heads(a, attn.num_heads) for a in (q, k, v))
        scores = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(attn.d_head))
        scores += additive_mask(causal_mask(T), scores.dtype)
        c["weights"] = softmax(scores, axis=-1)  # kept: the backward needs them again
        dropped, c["attn_keep"] = dropout_forward(c["weights"], attn.attn_dropout.p, drop_rng)
        c.update(q=q, k=k, v=v, merged=_merge_heads(dropped @ v))
        a, c["resid_keep"] = dropout_forward(attn.c_proj(c["merged"]), attn.resid_dropout.p, drop_rng)
        x = x + a
        c.update(x_mid=x, h2=block.ln_2(x))
        c["f"] = mlp.c_fc(c["h2"])
        c["g"] = gelu(c["f"])
        m, c["mlp_keep"] = dropout_forward(mlp.c_proj(c["g"]), mlp.dropout.p, drop_rng)
        x = x + m
        blocks.append(c)
    xf = model.ln_f(x)
    cache = {"token_ids": token_ids, "emb_keep": emb_keep, "blocks": blocks, "x_last": x, "xf": xf}
    return xf @ model.wte.weight.T, cache


def gpt_backward(model: GPTModel, cache: dict, dlogits: np.ndarray) -> dict[str, np.ndarray]:
    """The gradient of the loss with respect to every parameter, from ``gpt_forward``'s
    cache and the gradient of the loss with respect to the logits (B, T, V).

    Returns:
        ``{name: gradient}`` with exactly ``model.state_dict()``'s names and shapes
        (``wte.weight``, ``wpe.weight``, ``h.0.ln_1.weight``, …, ``ln_f.bias``).
        ``wte.weight`` is used twice (the token embedding and the tied output head): its
        gradient is the sum of both uses. ``wpe.weight``'s rows past T get zeros.
    """
    grads: dict[str, np.ndarray] = {}
    dx, dwte_head = tied_head_backward(dlogits, cache["xf"], model.wte.weight)
    dx, grads["ln_f.weight"], grads["ln_f.bias"] = layernorm_backward(dx, cache["x_last"], model.ln_f.weight,
                                                                      model.ln_f.eps)
    for i in reversed(range(len(model.h))):
        block, c, name = model.h[i], cache["blocks"][i], f"h.{i}."
        attn, mlp = block.attn, block.mlp
        # x = x_mid + dropout(c_proj(gelu(c_fc(ln_2(x_mid)))))
        d = dropout_backward(dx, c["mlp_keep"], mlp.dropout.p)
        d = _into(grads, name + "mlp.c_proj", linear_backward(d, c["g"], mlp.c_proj.weight))
        d = gelu_backward(d, c["f"])
        d = _into(grads, name + "mlp.c_fc", linear_backward(d, c["h2"], mlp.c_fc.weight))
        d = _into(grads, name + "ln_2", layernorm_backward(d, c["x_mid"], block.ln_2.weight, block.ln_2.eps))
        dx = dx + d  # the residual: both paths carry the gradient
        # x_mid = x_in + dropout(c_proj(attention(q, k, v)))
        d = dropout_backward(dx, c["resid_keep"], attn.resid_dropout.p)
        d = _into(grads, name + "attn.c_proj", linear_backward(d, c["merged"], attn.c_proj.weight))
        dq, dk, dv = causal_attention_backward(_split_heads(d, attn.num_heads), c["q"], c["k"], c["v"],
                                               c["attn_keep"], attn.attn_dropout.p, c["weights"])
        d = np.concatenate([_merge_heads(dq), _merge_heads(dk), _merge_heads(dv)], axis=-1)  # q, k, v blocks
        d = _into(grads, name + "attn.c_attn", linear_backward(d, c["h1"], attn.c_attn.weight))
        d = _into(grads, name + "ln_1", layernorm_backward(d, c["x_in"], block.ln_1.weight, block.ln_1.eps))
        dx = dx + d
    dx = dropout_backward(dx, cache["emb_keep"], model.drop.p)
    token_ids = cache["token_ids"]
    T = token_ids.shape[1]
    dwte_embedding = embedding_backward(dx, token_ids, model.vocab_size)
    grads["wte.weight"] = dwte_embedding + dwte_head  # the tied weight: both uses add up
    # Every row of the batch used positions 0 … T−1: the position table's gradient is dx
    # summed over the batch (embedding_backward with those positions gives the same, slower).
    grads["wpe.weight"] = np.zeros_like(model.wpe.weight)
    grads["wpe.weight"][:T] = dx.sum(axis=0)
    return grads


def _into(grads: dict, prefix: str, result: tuple) -> np.ndarray:
    """Store a (d_input, d_weight, d_bias) result's parameter gradients under ``prefix``."""
    d_input, *params = result
    grads.update(zip((prefix + ".weight", prefix + ".bias"), params))
    return d_input


def _squared_norm(g: np.ndarray) -> float:
    return float(np.vdot(g, g))


def global_norm(grads: dict[str, np.ndarray]) -> float:
    """√(sum of every squared element of every gradient)."""
    return math.sqrt(math.fsum(map(_squared_norm, grads.values())))


def loss_and_grads(model: GPTModel, token_ids: np.ndarray, targets: np.ndarray, *,
                   rng: np.random.Generator | None = None):
    """``(loss, grads)``: the mean next-token cross-entropy of ``model`` on ``token_ids``
    (B, T) against ``targets`` (B, T) (usually the ids shifted by one), and the gradient of
    that loss for every parameter (``gpt_backward``'s dict). ``rng`` as in ``gpt_forward``."""
    logits, cache = gpt_forward(model, token_ids, rng=rng)
    loss, dlogits = softmax_cross_entropy(logits, targets)
    return loss, gpt_backward(model, cache, dlogits)


# -- optimisation --------------------------------------------------------------------------

class AdamW:
    """AdamW with PyTorch's semantics (``torch.optim.AdamW``).

    Args:
        params: ``{name: array}`` updated in place (``model.state_dict()``), or a Layer
            (its state dict is taken).
        lr, betas, eps, weight_decay: as in PyTorch (defaults too). ``lr`` may be changed
            between steps (``opt.lr = …``) for a schedule.

    Attributes: ``params``; ``m`` and ``v``, the first and second moments by name
    (float32 zeros at the start); ``t``, the number of steps taken.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        if isinstance(params, Layer):
            params = params.state_dict()
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"AdamW needs lr, eps, weight_decay ≥ 0 and betas in [0, 1); got lr={lr}, "
                             f"betas={betas}, eps={eps}, weight_decay={weight_decay}")
        self.params = dict(params)
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), (float(betas[0]), float(betas[1])), \
            float(eps), float(weight_decay)
        self.m = {k: np.zeros_like(p) for k, p in self.params.items()}
        self.v = {k: np.zeros_like(p) for k, p in self.params.items()}
        self.t = 0

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """One update of every parameter that has a gradient in ``grads`` (same names), in
        place: decoupled weight decay ``p -= lr·weight_decay·p`` first, then the moments,
        their bias corrections, and ``p -= lr · m̂ / (√v̂ + eps)``."""
        unknown = sorted(set(grads) - set(self.params))
        if unknown:
            raise KeyError(f"gradients for parameters this optimizer does not hold: {', '.join(unknown[:5])}")
        self.t += 1
        b1, b2 = self.betas
        lr, wd, eps = self.lr, self.weight_decay, self.eps
        bias1 = 1.0 - b1 ** self.t
        bias2 = 1.0 - b2 ** self.t
        for name, g in grads.items():
            p, m, v = self.params[name], self.m[name], self.v[name]
            p *= 1.0 - lr * wd  # decoupled weight decay, before the Adam step (as PyTorch)
            m *= b1
            m += (1.0 - b1) * g
            v *= b2
            g2 = g * g
            g2 *= 1.0 - b2
            v += g2
            step = np.sqrt(v)  # √v̂ = √v / √(1 − β₂ᵗ), in PyTorch's order
            step /= math.sqrt(bias2)
            step += eps  # eps outside the square root
            np.divide(m, step, out=step)
            step *= lr / bias1  # m̂ = m / (1 − β₁ᵗ)
            p -= step


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float):
    """Scale every gradient by the same factor so that their *global* norm (the square
    root of the sum of all squared elements of all gradients) is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` does: factor min(1, max_norm / (norm + 1e-6)).

    Returns:
        ``(clipped, norm)``: a new dict, same names, of the scaled gradients (the given
        arrays themselves where no scaling is needed), and the norm before clipping as a
        Python float. The arrays given are not modified.
    """
    total = global_norm(grads)
    factor = max_norm / (total + 1e-6)
    if factor >= 1.0:
        return dict(grads), total
    return {name: g * factor for name, g in grads.items()}, total


def lr_schedule(step: int, *, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate for ``step`` (0-based): linear warm-up, then cosine decay.

    - ``step < warmup_steps``: ``max_lr · (step + 1) / warmup_steps`` (step 0 already
      moves; the last warm-up step reaches max_lr);
    - ``warmup_steps ≤ step ≤ total_steps``: ``min_lr + ½(max_lr − min_lr)(1 + cos(π·r))``
      with ``r = (step − warmup_steps) / (total_steps − warmup_steps)``;
    - ``step > total_steps``: ``min_lr``.
    """
    check_length(step, "step", minimum=0)
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps or total_steps == warmup_steps:
        return float(min_lr)
    r = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * r))


# -- data ------------------------------------------------------------------------------------

class CharTokenizer:
    """Characters as tokens: the vocabulary is the sorted set of characters of ``text``.

    Attributes: ``chars`` (the sorted list of distinct characters; id i is chars[i]),
    ``vocab_size``.
    """

    def __init__(self, text: str):
        if not text:
            raise ValueError("a tokenizer needs some text to take its characters from")
        self.chars = sorted(set(text))
        self.vocab_size = len(self.chars)
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.int64)

    def encode(self, text: str) -> np.ndarray:
        """str → int64 ids (len(text),). A character outside the vocabulary is a ValueError
        naming it."""
        codes = np.array([ord(c) for c in text], dtype=np.int64)
        ids = np.searchsorted(self._codes, codes)
        bad = (ids >= self.vocab_size) | (self._codes[np.minimum(ids, self.vocab_size - 1)] != codes)
        if bad.any():
            raise ValueError(f"the character {text[int(np.flatnonzero(bad)[0])]!r} is not in the vocabulary")
        return ids.astype(np.int64)

    def decode(self, ids) -> str:
        """ids (any integers in 0 … vocab_size − 1) → str."""
        return "".join(self.chars[int(i)] for i in np.asarray(ids).reshape(-1))


def train_val_split(ids: np.ndarray, val_fraction: float = 0.1):
    """``(train, val)``: the first ⌊len·(1 − val_fraction)⌋ ids and the rest, in order (no
    shuffling: the validation text is text the model never trained on)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n = int(len(ids) * (1.0 - val_fraction))
    return ids[:n], ids[n:]


def get_batch(data: np.ndarray, batch_size: int, block_size: int, rng: np.random.Generator):
    """A random batch of ``batch_size`` windows of ``block_size`` consecutive ids.

    Draws the starts with one call ``rng.integers(0, len(data) − block_size, size=batch_size)``
    (so a seed gives the same batches everywhere); returns ``(x, y)``, both (B, block_size)
    int64, with y the window shifted one ahead (``y[b, t] = data[start_b + t + 1]``).
    """
    check_length(batch_size, "batch_size")
    check_length(block_size, "block_size")
    if len(data) <= block_size:
        raise ValueError(f"data of {len(data)} ids is too short for windows of {block_size} + 1")
    starts = rng.integers(0, len(data) - block_size, size=batch_size)
    idx = starts[:, None] + np.arange(block_size)
    data = np.asarray(data)
    return data[idx].astype(np.int64), data[idx + 1].astype(np.int64)


# -- the training step ------------------------------------------------------------------------

def train_step(model: GPTModel, optimizer: AdamW, x: np.ndarray, y: np.ndarray, *, lr: float | None = None,
               max_norm: float | None = None, rng: np.random.Generator | None = None):
    """One step: loss and gradients, global-norm clipping (when ``max_norm`` is given), the
    learning rate set (when ``lr`` is given), one AdamW step. Returns ``(loss, grad_norm)``
    as Python floats (the norm before clipping)."""
    loss, grads = loss_and_grads(model, x, y, rng=rng)
    if max_norm is not None:
        grads, norm = clip_grad_norm(grads, max_norm)
    else:
        norm = global_norm(grads)
    if lr is not None:
        optimizer.lr = lr
    optimizer.step(grads)
    return float(loss), norm


def estimate_loss(model: GPTModel, data: np.ndarray, *, batch_size: int, block_size: int, iters: int,
                  rng: np.random.Generator) -> float:
    """The mean loss over ``iters`` batches from ``get_batch(data, …, rng)``, in eval mode
    (no dropout); the model's mode is restored afterwards."""
    was_training = model.training
    model.eval()
    draw = partial(get_batch, data, batch_size, block_size)
    losses = [_batch_loss(model, *draw(rng)) for _ in repeat(None, check_length(iters, "iters"))]
    model.train(was_training)
    return reduce(add, losses) / len(losses)


def _batch_loss(model: GPTModel, x: np.ndarray, y: np.ndarray) -> float:
    return float(softmax_cross_entropy(gpt_forward(model, x)[0], y)[0])


# -- checkpoints -----------------------------------------------------------------------------

_DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "int64": "I64", "int32": "I32"}


def write_safetensors(path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Path:
    """Write ``tensors`` as a ``.safetensors`` file: the mirror image of lab 05's reader.

    Layout: 8 bytes, the little-endian length n of the header; n bytes of JSON (padded with
    spaces to a multiple of 8), ``{name: {"dtype": "F32", "shape": [...], "data_offsets":
    [start, end]}, …}`` plus ``"__metadata__": {str: str}`` when given; then every tensor's
    bytes, little-endian, C order, back to back (offsets count from the end of the header).
    Names in sorted order. dtypes: float32, float64, float16, int64, int32. Returns the path.
    """
    names = sorted(tensors)
    values = [_storable(name, tensors[name]) for name in names]
    chunks = [np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<")).tobytes() for v in values]
    ends = list(accumulate(map(len, chunks)))
    starts = [0, *ends[:-1]]
    entries: dict = {name: {"dtype": _DTYPES[v.dtype.name], "shape": list(v.shape), "data_offsets": [s, e]}
                     for name, v, s, e in zip(names, values, starts, ends)}
    if metadata:
        entries["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    text = text + b" " * ((8 - len(text) % 8) % 8)  # the data starts on an 8-byte boundary
    path = Path(path)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for raw in chunks:
            f.write(raw)
    return path


def _storable(name: str, value) -> np.ndarray:
    value = np.asarray(value)
    if value.dtype.name not in _DTYPES:
        raise TypeError(f"{name}: cannot store dtype {value.dtype} (only {', '.join(_DTYPES)})")
    return value


def gpt2_config(model: GPTModel) -> dict:
    """``config.json``'s contents for ``model``: HuggingFace GPT-2's names (``n_embd``,
    ``n_layer``, ``n_head``, ``n_positions``, ``n_inner``, ``vocab_size``,
    ``layer_norm_epsilon``, ``activation_function = "gelu_new"``, ``model_type = "gpt2"``,
    ``architectures = ["GPT2LMHeadModel"]``, ``tie_word_embeddings = true``), which lab 05's
    ``read_config`` reads back."""
    block = model.h[0]
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": model.vocab_size,
            "n_embd": model.d_model, "n_layer": model.num_layers, "n_head": block.attn.num_heads,
            "n_positions": model.max_seq_len, "n_inner": block.mlp.c_fc.d_out,
            "layer_norm_epsilon": model.ln_f.eps, "activation_function": "gelu_new",
            "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": None}


def save_checkpoint(folder, model: GPTModel, metadata: dict[str, str] | None = None) -> Path:
    """Write ``folder/model.safetensors`` (the state dict under GPT-2's hub names, float32)
    and ``folder/config.json`` (``gpt2_config``); create the folder if needed. Lab 05's
    ``load_gpt2(folder)`` and HuggingFace's ``GPT2LMHeadModel.from_pretrained(folder)``
    both load it. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", model.state_dict(), {"format": "pt", **(metadata or {})})
    with open(folder / "config.json", "w") as f:
        f.write(json.dumps(gpt2_config(model), indent=1))
    return folder
