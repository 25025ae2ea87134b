# Lab 07: fill in each `# YOUR CODE HERE` block in this file, then run `uv run pytest -m lab07`.
"""Lab 07 · Training: the backward pass of every piece of the GPT, AdamW, gradient
clipping, a learning-rate schedule, and a character-level training loop.

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
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · linear_backward: dx = dout @ weightᵀ; dweight = xᵀ @ dout over all positions; dbias = dout summed')


def layernorm_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float = 1e-5):
    """Backward of lab 03's LayerNorm over the last axis: y = x̂ · weight + bias, where
    x̂ = (x − mean) / √(var + eps) with the biased variance.

    Args:
        dout: (..., D). x: (..., D) the forward's input. weight: (D,) the gain.

    Returns:
        ``(dx, dweight, dbias)``: (..., D), (D,), (D,). The mean and the variance depend on
        every element of the row, so dx has three terms, not one.
    """
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · layernorm_backward: recompute x̂ and 1/σ; dx = (dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)) / σ')


def gelu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Backward of lab 03's ``gelu`` (the tanh form, GPT-2's): dout · gelu'(x), same shape.

    With u = √(2/π)·(x + 0.044715·x³): gelu(x) = 0.5·x·(1 + tanh u), so
    gelu'(x) = 0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²).
    """
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · gelu_backward: differentiate the tanh form (not the erf form) by the chain rule; x³ as x*x*x, not x**3')


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
    # YOUR CODE HERE
    raise NotImplementedError("Lab 07 · dropout_backward: the forward's mask, the same scale")


def softmax_backward(dout: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Backward of ``probs = softmax(x, axis=-1)``, given the forward's output ``probs``.

    Each output depends on every input of its row (they share the normaliser), so the
    Jacobian is diag(p) − p pᵀ, not diagonal: dx = p · (dout − Σ_j dout_j p_j).
    """
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · softmax_backward: the full Jacobian-vector product, row by row')


def softmax_cross_entropy(logits: np.ndarray, targets: np.ndarray):
    """The mean cross-entropy of ``logits`` (..., V) against integer ``targets`` (...), and
    its gradient with respect to the logits, in one stable pass.

    Returns:
        ``(loss, dlogits)``: loss a float32 scalar (``np.float32``; the logits' dtype for
        float64), the mean over all N target tokens of −log softmax(logits)[target];
        dlogits (..., V) = (softmax(logits) − onehot(target)) / N. The arrays given are
        not modified.
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
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · softmax_cross_entropy: log-softmax with the max subtracted; loss = mean −log p[target]; dlogits = (p − onehot) / N')


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
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · causal_attention_backward: the weights (given, or recomputed: scale, mask, softmax); back through @v, dropout, softmax, the scale')


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
    # YOUR CODE HERE
    raise NotImplementedError("Lab 07 · embedding_backward: scatter-add every position's gradient into its id's row (np.add.at: repeats accumulate)")


def tied_head_backward(dlogits: np.ndarray, x: np.ndarray, wte: np.ndarray):
    """Backward of the tied output head ``logits = x @ wte.T``.

    Args:
        dlogits: (..., V). x: (..., D) the final LayerNorm's output. wte: (V, D).

    Returns:
        ``(dx, dwte)``: (..., D) and (V, D), this use's share of the embedding's gradient.
    """
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · tied_head_backward: the transposed linear: dx = dlogits @ wte; dwte = dlogitsᵀ @ x over all positions')


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
    # YOUR CODE HERE
    raise NotImplementedError("Lab 07 · gpt_forward: the lab-04 forward, saving each layer's input (and dropout masks) in the cache")


def gpt_backward(model: GPTModel, cache: dict, dlogits: np.ndarray) -> dict[str, np.ndarray]:
    """The gradient of the loss with respect to every parameter, from ``gpt_forward``'s
    cache and the gradient of the loss with respect to the logits (B, T, V).

    Returns:
        ``{name: gradient}`` with exactly ``model.state_dict()``'s names and shapes
        (``wte.weight``, ``wpe.weight``, ``h.0.ln_1.weight``, …, ``ln_f.bias``).
        ``wte.weight`` is used twice (the token embedding and the tied output head): its
        gradient is the sum of both uses. ``wpe.weight``'s rows past T get zeros. Each
        LayerNorm's backward takes that LayerNorm's own ``eps`` (the model's
        ``layer_norm_eps``). Everything read from the forward comes from ``cache``, never
        from the model: two batches may be between forward and backward at once.
    """
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · gpt_backward: head, ln_f, then every block in reverse (mlp, then attention, each with its residual), then the embeddings')


def loss_and_grads(model: GPTModel, token_ids: np.ndarray, targets: np.ndarray, *,
                   rng: np.random.Generator | None = None):
    """``(loss, grads)``: the mean next-token cross-entropy of ``model`` on ``token_ids``
    (B, T) against ``targets`` (B, T) (usually the ids shifted by one), and the gradient of
    that loss for every parameter (``gpt_backward``'s dict). ``rng`` as in ``gpt_forward``,
    passed on to it: with dropout in training mode, the loss is that of
    ``gpt_forward(model, token_ids, rng=rng)``'s logits."""
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · loss_and_grads: forward with a cache, fused softmax cross-entropy, backward')


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
        # YOUR CODE HERE
        raise NotImplementedError('Lab 07 · AdamW.step: t += 1; decay the weights; update m and v; bias-correct both; step with eps outside the square root')


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float):
    """Scale every gradient by the same factor so that their *global* norm (the square
    root of the sum of all squared elements of all gradients) is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` does: factor min(1, max_norm / (norm + 1e-6)).

    Returns:
        ``(clipped, norm)``: a new dict, same names, of the scaled gradients (the given
        arrays themselves where no scaling is needed), and the norm before clipping as a
        Python float. The arrays given are not modified.
    """
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · clip_grad_norm: one norm over all gradients together; one factor for all of them')


def lr_schedule(step: int, *, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate for ``step`` (0-based): linear warm-up, then cosine decay.

    - ``step < warmup_steps``: ``max_lr · (step + 1) / warmup_steps`` (step 0 already
      moves; the last warm-up step reaches max_lr);
    - ``warmup_steps ≤ step ≤ total_steps``: ``min_lr + ½(max_lr − min_lr)(1 + cos(π·r))``
      with ``r = (step − warmup_steps) / (total_steps − warmup_steps)``;
    - ``step > total_steps``: ``min_lr``.
    """
    check_length(step, "step", minimum=0)
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · lr_schedule: the three pieces, as a Python float')


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
        self._ids = {c: i for i, c in enumerate(self.chars)}  # character → id

    def encode(self, text: str) -> np.ndarray:
        """str → int64 ids (len(text),). A character outside the vocabulary is a ValueError
        naming it."""
        # YOUR CODE HERE
        raise NotImplementedError('Lab 07 · CharTokenizer.encode: look each character up in the sorted vocabulary')

    def decode(self, ids) -> str:
        """ids (any integers in 0 … vocab_size − 1) → str."""
        # YOUR CODE HERE
        raise NotImplementedError("Lab 07 · CharTokenizer.decode: each id's character, joined")


def train_val_split(ids: np.ndarray, val_fraction: float = 0.1):
    """``(train, val)``: the first ⌊len·(1 − val_fraction)⌋ ids and the rest, in order (no
    shuffling: the validation text is text the model never trained on)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · train_val_split: one cut, in order')


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
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · get_batch: the starts from rng, x the windows, y the same windows one id later')


# -- the training step ------------------------------------------------------------------------

def train_step(model: GPTModel, optimizer: AdamW, x: np.ndarray, y: np.ndarray, *, lr: float | None = None,
               max_norm: float | None = None, rng: np.random.Generator | None = None):
    """One step: loss and gradients, global-norm clipping (when ``max_norm`` is given), the
    learning rate set (when ``lr`` is given), one AdamW step. The optimizer steps with the
    *clipped* gradients, at the learning rate set *before* its step; without ``max_norm``
    nothing is clipped, without ``lr`` the optimizer keeps its own. Returns
    ``(loss, grad_norm)`` as Python floats (the global norm before clipping)."""
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · train_step: loss_and_grads, clip_grad_norm, optimizer.lr, optimizer.step')


def estimate_loss(model: GPTModel, data: np.ndarray, *, batch_size: int, block_size: int, iters: int,
                  rng: np.random.Generator) -> float:
    """The mean loss over ``iters`` batches from ``get_batch(data, …, rng)``, in eval mode
    (no dropout); the model's mode is restored afterwards."""
    was_training = model.training
    model.eval()
    losses = []
    for _ in range(check_length(iters, "iters")):
        x, y = get_batch(data, batch_size, block_size, rng)
        losses.append(float(softmax_cross_entropy(gpt_forward(model, x)[0], y)[0]))
    model.train(was_training)
    return sum(losses) / len(losses)


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
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · write_safetensors: a header entry per tensor (dtype, shape, offsets), JSON padded to 8, then the raw bytes')


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
    """Write ``folder/model.safetensors`` (the state dict under GPT-2's hub names, float32,
    with ``"format": "pt"`` added to ``metadata``: HuggingFace refuses a file without it)
    and ``folder/config.json`` (``gpt2_config``); create the folder if needed. Lab 05's
    ``load_gpt2(folder)`` and HuggingFace's ``GPT2LMHeadModel.from_pretrained(folder)``
    both load it. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # YOUR CODE HERE
    raise NotImplementedError('Lab 07 · save_checkpoint: the state dict through write_safetensors (format "pt" in the metadata), the config as JSON')
