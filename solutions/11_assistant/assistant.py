"""Lab 11 · The assistant: a chat format, supervised fine-tuning on the assistant's tokens,
LoRA adapters, a group of sampled answers with a verifiable reward, reinforcement learning
in GRPO's form, and DPO, all on lab 04's GPTModel with lab 07's backward.

Shapes: B sequences in a batch, T tokens per sequence, V vocabulary size, L = T − 1
next-token positions (position t of a (B, L) array is the log-probability of token t + 1
given tokens 0 … t), P prompts, G answers sampled per prompt, N preference pairs. Token
ids are int64, masks bool, everything else float32.

    conversation ─ render_chat ─ (ids, mask) ─ SFT on the masked tokens
    prompt ─ sample_group ─ G answers ─ reward ─ group_advantages ─ grpo_loss ─ lab 07's backward
    (correct, wrong) answer pairs ─ dpo_loss ─ lab 07's backward

Every gradient here reaches the parameters the same way: the loss gives d loss / d logp for
each scored token; since logp = log_softmax(logits)[target], d logp / d logits =
onehot(target) − softmax(logits); lab 07's ``gpt_backward`` takes it from the logits on.
"""

from __future__ import annotations

import numpy as np

from generation import generate, log_softmax
from gpt import GPTModel
from gptkit import Layer, as_float_array, check_length, check_ndim, make_rng
from training import gpt_backward, gpt_forward

USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END = "<|end|>"
CHAT_SPECIAL_TOKENS = (USER, ASSISTANT, END)  # what a chat tokenizer needs; lab 10's <|endoftext|> is not used
ROLES = {"user": USER, "assistant": ASSISTANT}


# -- the chat format ---------------------------------------------------------------------------

def special_id(tokenizer, token: str) -> int:
    """The id of the special token ``token`` in ``tokenizer`` (a lab-10 ``Tokenizer`` built
    with ``special_tokens=CHAT_SPECIAL_TOKENS``). A tokenizer that does not encode it as a
    single id is a ValueError that says how to build one that does."""
    ids = list(tokenizer.encode(token))
    if len(ids) != 1:
        raise ValueError(f"the tokenizer encodes {token!r} as {len(ids)} ids, not one: build it with "
                         f"special_tokens=CHAT_SPECIAL_TOKENS ({', '.join(CHAT_SPECIAL_TOKENS)})")
    return int(ids[0])


def _check_messages(tokenizer, messages) -> list[tuple[str, str]]:
    """``messages`` as (role, content) pairs, or a ValueError naming the problem."""
    if isinstance(messages, (str, dict)) or not hasattr(messages, "__len__"):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if len(messages) == 0:
        raise ValueError("an empty conversation has nothing to render: give at least one message")
    specials = set(CHAT_SPECIAL_TOKENS) | set(getattr(tokenizer, "special_tokens", ()) or ())
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise ValueError(f"message {i} must be a dict with exactly the keys 'role' and 'content', got {message!r}")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise ValueError(f"message {i} has the unknown role {role!r}: a role is 'user' or 'assistant'")
        if not isinstance(content, str):
            raise ValueError(f"message {i}'s content must be a string, got {type(content).__name__}")
        inside = [s for s in sorted(specials) if s in content]
        if inside:
            raise ValueError(f"message {i}'s content contains the special token {inside[0]!r}: a message may not "
                             "open or close turns itself (the chat format alone places special tokens)")
        turns.append((role, content))
    return turns


def render_chat(tokenizer, messages) -> tuple[np.ndarray, np.ndarray]:
    """A conversation as token ids, with the mask of the tokens the model must learn to say.

    Args:
        tokenizer: a lab-10 ``Tokenizer`` whose special tokens include ``CHAT_SPECIAL_TOKENS``.
        messages: a non-empty list of ``{"role": "user" | "assistant", "content": str}``, in
            any order (several turns of each are fine).

    Returns:
        ``(ids, mask)``: int64 (T,) and bool (T,). A user turn is ``USER`` followed by the
        content's ids; an assistant turn is ``ASSISTANT``, the content's ids, then ``END``:
        ``<|user|>What is 347+85?<|assistant|>432<|end|>``. Nothing is added between turns
        or at the ends. ``mask`` is True exactly on each assistant turn's content tokens and
        its ``END``; False on ``USER``, ``ASSISTANT`` and every user token. An assistant
        turn with empty content still has its ``END`` marked.

    Raises:
        ValueError: an empty conversation, a message that is not a dict with the keys
        ``role`` and ``content``, an unknown role, content that is not a string, or content
        that contains the text of a special token (the chat tokens or the tokenizer's own):
        such text is refused, not encoded, so a message cannot fake a turn.
    """
    turns = _check_messages(tokenizer, messages)
    ### BEGIN SOLUTION per turn: the role's id (not learned), the content's ids (learned in assistant turns), END after an assistant turn (learned)
    end_id = special_id(tokenizer, END)
    ids: list[int] = []
    mask: list[bool] = []
    for role, content in turns:
        content_ids = [int(i) for i in tokenizer.encode(content)]
        ids.append(special_id(tokenizer, ROLES[role]))
        mask.append(False)  # the role token is given, never predicted
        ids.extend(content_ids)
        mask.extend([role == "assistant"] * len(content_ids))
        if role == "assistant":
            ids.append(end_id)
            mask.append(True)  # the model must learn to stop
    return np.array(ids, dtype=np.int64), np.array(mask, dtype=bool)
    ### END SOLUTION


def render_prompt(tokenizer, messages) -> np.ndarray:
    """The ids that ask the model for the next assistant turn: ``render_chat``'s ids of
    ``messages`` followed by ``ASSISTANT``, int64 (T,). The conversation must end with a
    user turn (a ValueError otherwise: there is no question to answer); the other checks
    are ``render_chat``'s."""
    turns = _check_messages(tokenizer, messages)
    if turns[-1][0] != "user":
        raise ValueError("a prompt must end with a user turn: the model answers the last user message")
    ### BEGIN SOLUTION the rendered conversation, then the assistant's role token to start its answer
    ids, _ = render_chat(tokenizer, messages)
    return np.concatenate([ids, np.array([special_id(tokenizer, ASSISTANT)], dtype=np.int64)])
    ### END SOLUTION


def pad_batch(examples, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad ``(ids, mask)`` pairs (each (T_i,), as ``render_chat`` returns) to the
    longest: ``(ids, mask)``, int64 (B, T_max) and bool (B, T_max). Row i holds example i's
    ids then ``pad_id``; its mask is the example's mask then False, so padding is never
    learned. An empty list, a pair whose ids and mask differ in length, or a mask that is
    not boolean is a ValueError."""
    pad_id = check_length(pad_id, "pad_id", minimum=0)
    examples = list(examples)
    if not examples:
        raise ValueError("pad_batch needs at least one (ids, mask) example")
    pairs = []
    for i, example in enumerate(examples):
        ids, mask = (np.asarray(a) for a in example)
        if ids.ndim != 1 or mask.shape != ids.shape:
            raise ValueError(f"example {i}: ids and mask must both be 1-D and the same length, got {ids.shape} "
                             f"and {mask.shape}")
        if mask.dtype != bool or ids.dtype.kind not in "iu":
            raise ValueError(f"example {i}: ids must be integers and mask booleans, got {ids.dtype} and {mask.dtype}")
        pairs.append((ids, mask))
    ### BEGIN SOLUTION a (B, T_max) array full of pad_id and one of False; copy each example into the start of its row
    T = max(len(ids) for ids, _ in pairs)
    out_ids = np.full((len(pairs), T), pad_id, dtype=np.int64)
    out_mask = np.zeros((len(pairs), T), dtype=bool)
    for row, (ids, mask) in enumerate(pairs):
        out_ids[row, : len(ids)] = ids
        out_mask[row, : len(mask)] = mask
    return out_ids, out_mask
    ### END SOLUTION


# -- supervised fine-tuning ------------------------------------------------------------------------

def _check_ids_mask(ids, mask, name: str = "ids"):
    ids, mask = np.asarray(ids), np.asarray(mask)
    check_ndim(ids, name, ndim=2, shape_hint="(B, T)")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    if mask.shape != ids.shape or mask.dtype != bool:
        raise ValueError(f"mask must be booleans of {name}' shape {ids.shape}, got {mask.dtype} {mask.shape}")
    if ids.shape[1] < 2:
        raise ValueError(f"{name} needs at least 2 tokens per row (one to read, one to predict), got {ids.shape}")
    return ids, mask


def masked_cross_entropy(logits: np.ndarray, targets: np.ndarray, mask: np.ndarray):
    """Cross-entropy over the masked positions only, and its gradient.

    Args:
        logits: (B, T, V) float. targets: (B, T) int ids. mask: (B, T) bool, True where the
            target counts (the assistant's tokens).

    Returns:
        ``(loss, dlogits)``: loss, a float32 scalar, the mean of −log softmax(logits)[target]
        over the M positions where ``mask`` is True (each counted token weighs 1/M, whatever
        its row); dlogits (B, T, V) float32 = (softmax(logits) − onehot(target)) / M on
        those positions and exactly 0 elsewhere. Targets at masked-out positions are
        never read (padding may hold any id).

    Raises:
        ValueError: shapes that do not line up, a mask that is not boolean or has no True
        (a mean over no tokens), a counted target outside 0 … V − 1.
    """
    logits = as_float_array(logits, "logits")
    check_ndim(logits, "logits", ndim=3, shape_hint="(B, T, V)")
    targets, mask = np.asarray(targets), np.asarray(mask)
    if targets.shape != logits.shape[:2] or targets.dtype.kind not in "iu":
        raise ValueError(f"targets must be integer ids of shape {logits.shape[:2]}, got {targets.dtype} {targets.shape}")
    if mask.shape != targets.shape or mask.dtype != bool:
        raise ValueError(f"mask must be booleans of shape {targets.shape}, got {mask.dtype} {mask.shape}")
    if not mask.any():
        raise ValueError("the mask has no True position: the mean loss over no tokens is undefined")
    V = logits.shape[-1]
    counted = targets[mask]
    if counted.min() < 0 or counted.max() >= V:
        raise ValueError(f"counted targets must be ids in 0 … {V - 1}, got values from {counted.min()} to {counted.max()}")
    ### BEGIN SOLUTION log-softmax; −log p[target] averaged over the M masked positions; gradient (p − onehot)/M on those positions, 0 elsewhere
    M = int(mask.sum())
    logp = log_softmax(logits, axis=-1)  # (B, T, V)
    safe = np.where(mask, targets, 0)  # (B, T): a masked-out target may be any id
    picked = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]  # (B, T) log p[target]
    loss = -(picked * mask).sum() / M
    dlogits = np.exp(logp)  # (B, T, V) the probabilities
    onehot = np.zeros_like(dlogits)
    np.put_along_axis(onehot, safe[..., None], 1.0, axis=-1)
    dlogits = (dlogits - onehot) * mask[..., None] / M  # (B, T, V)
    return logits.dtype.type(loss), dlogits.astype(logits.dtype)
    ### END SOLUTION


def sft_loss_and_grads(model: GPTModel, ids: np.ndarray, mask: np.ndarray):
    """``(loss, grads)`` of supervised fine-tuning on a padded batch.

    Args:
        model: a lab-04 GPTModel. ids: (B, T) int, e.g. from ``pad_batch``. mask: (B, T)
            bool, True on the tokens to learn (``render_chat``'s mask, padded).

    Returns:
        loss: ``masked_cross_entropy`` of the logits of ``ids[:, :-1]`` against the next
        tokens ``ids[:, 1:]``, counted where ``mask[:, 1:]`` (a token is learned where it is
        the target, so the mask of the target's position counts); grads: lab 07's
        ``gpt_backward`` dict, ``model.state_dict()``'s names. The model runs as
        ``gpt_forward`` runs it (no dropout unless in training mode and given an rng: none
        is given here).
    """
    ids, mask = _check_ids_mask(ids, mask)
    ### BEGIN SOLUTION the model reads ids[:, :-1]; targets ids[:, 1:]; mask[:, 1:]; masked_cross_entropy; gpt_backward
    logits, cache = gpt_forward(model, ids[:, :-1])  # (B, T−1, V)
    loss, dlogits = masked_cross_entropy(logits, ids[:, 1:], mask[:, 1:])
    return loss, gpt_backward(model, cache, dlogits)
    ### END SOLUTION


# -- LoRA ----------------------------------------------------------------------------------------

class LoRALinear(Layer):
    """A lab-03 ``Linear`` with a low-rank adapter: ``y = x @ W + b + (α/r)·(x @ A) @ B``.

    ``LoRALinear(base, rank, alpha, *, rng=None)``.

    Attributes:
        base: the wrapped Linear (its ``weight`` W (d_in, d_out) and ``bias`` are frozen:
            they get no gradient here).
        A: (d_in, rank) float32, drawn from N(0, 1/d_in) (standard deviation 1/√d_in, so
            ``x @ A`` keeps the scale of x) with ``rng``.
        B: (rank, d_out) float32 zeros: the adapted layer starts equal to the base.
        rank (r), alpha (α), scale = α / r, d_in, d_out.
        merged: True once ``merge()`` has added scale·A @ B into ``base.weight``.
        weight, bias (read-only): the effective weight W + scale·A @ B (just ``base.weight``
            when merged) and the base's bias, so that lab 07's ``gpt_backward`` runs through
            an adapted model as through a plain one; the forward never forms the sum.

    ``rank`` must be at least 1 and at most min(d_in, d_out); ``alpha`` a positive number.
    """

    def __init__(self, base, rank: int, alpha: float, *, rng: np.random.Generator | None = None):
        if not hasattr(base, "weight") or np.asarray(base.weight).ndim != 2:
            raise ValueError(f"LoRALinear wraps a Linear (with a 2-D weight), got {type(base).__name__}")
        if isinstance(base, LoRALinear):
            raise ValueError("this layer already has a LoRA adapter")
        d_in, d_out = base.weight.shape
        self.rank = check_length(rank, "rank")
        if rank > min(d_in, d_out):
            raise ValueError(f"rank {rank} is more than min(d_in, d_out) = {min(d_in, d_out)}: not a low-rank adapter")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) or not alpha > 0:
            raise ValueError(f"alpha must be a positive number, got {alpha!r}")
        self.base = base
        self.d_in, self.d_out = int(d_in), int(d_out)
        self.alpha = float(alpha)
        self.scale = self.alpha / self.rank
        self.merged = False
        ### BEGIN SOLUTION A random with standard deviation 1/√d_in; B zeros, so the adapter adds nothing at the start
        self.A = (make_rng(rng).standard_normal((d_in, rank)) / np.sqrt(d_in)).astype(np.float32)
        self.B = np.zeros((rank, d_out), dtype=np.float32)
        ### END SOLUTION

    @property
    def weight(self) -> np.ndarray:
        if self.merged:
            return self.base.weight
        return self.base.weight + np.float32(self.scale) * (self.A @ self.B)

    @property
    def bias(self):
        return self.base.bias

    def named_parameters(self, prefix: str = ""):
        """The layer as lab 07 and ``state_dict()`` see it: a plain Linear's names, ``weight``
        (the effective weight above) and ``bias`` (the base's), both read-only. So an adapted
        model's ``state_dict()`` has GPT-2's names, ``gpt_backward``'s dict has them too, and a
        checkpoint of it is the merged model. The trainable arrays are ``lora_parameters``'
        ``A`` and ``B``; the frozen ones are ``base``'s."""
        for name, value in (("weight", self.weight), ("bias", self.bias)):
            if value is not None:
                view = np.asarray(value).view()
                view.flags.writeable = False  # not a place to write: train A and B, load into base
                yield f"{prefix}{name}", view

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., d_in) → (..., d_out): ``base(x) + scale · (x @ A) @ B``, through the rank-r
        bottleneck (W + scale·A @ B is never formed); just ``base(x)`` when merged."""
        x = as_float_array(x, "x")
        if x.ndim == 0 or x.shape[-1] != self.d_in:
            raise ValueError(f"x must have last dimension {self.d_in}, got shape {x.shape}")
        ### BEGIN SOLUTION the base's output, plus the scaled low-rank path (x @ A) @ B unless merged
        out = self.base(x)  # (..., d_out)
        if self.merged:
            return out
        return out + np.float32(self.scale) * ((x @ self.A) @ self.B)  # (..., r) → (..., d_out)
        ### END SOLUTION

    def backward(self, dout: np.ndarray, x: np.ndarray):
        """Backward of the forward above, for the adapter only.

        Args:
            dout: (..., d_out) gradient of the loss with respect to the output. x: (..., d_in)
                the forward's input.

        Returns:
            ``(dx, dA, dB)``: (..., d_in), (d_in, r), (r, d_out). W and the bias are frozen
            and get nothing. dB = scale · (x @ A)ᵀ @ dout and dA = scale · xᵀ @ (dout @ Bᵀ),
            each summed over every leading position; dx = dout @ Wᵀ + scale · (dout @ Bᵀ) @ Aᵀ
            (when merged, W already holds the adapter: dx = dout @ Wᵀ; dA and dB are the same).
        """
        dout, x = as_float_array(dout, "dout"), as_float_array(x, "x")
        if dout.shape[-1:] != (self.d_out,) or x.shape[-1:] != (self.d_in,) or dout.shape[:-1] != x.shape[:-1]:
            raise ValueError(f"dout must be (..., {self.d_out}) and x (..., {self.d_in}) with the same leading shape, "
                             f"got {dout.shape} and {x.shape}")
        ### BEGIN SOLUTION through the bottleneck: h = x @ A; dB = scale·hᵀ dout; dh = scale·dout Bᵀ; dA = xᵀ dh; dx through W and through A
        x2 = x.reshape(-1, self.d_in)  # (N, d_in), N = every leading position
        g2 = dout.reshape(-1, self.d_out)  # (N, d_out)
        h = x2 @ self.A  # (N, r)
        dB = self.scale * (h.T @ g2)  # (r, d_out)
        dh = self.scale * (g2 @ self.B.T)  # (N, r)
        dA = x2.T @ dh  # (d_in, r)
        dx = g2 @ self.base.weight.T  # (N, d_in)
        if not self.merged:
            dx = dx + dh @ self.A.T
        return dx.reshape(x.shape).astype(x.dtype), dA.astype(np.float32), dB.astype(np.float32)
        ### END SOLUTION

    def merge(self) -> None:
        """Add scale · A @ B into ``base.weight`` (in place) and set ``merged``: the layer then
        costs what the base costs. Merging a merged layer is a ValueError."""
        if self.merged:
            raise ValueError("this adapter is already merged into the base weight")
        ### BEGIN SOLUTION W += scale · A @ B, in place; merged = True
        self.base.weight += np.float32(self.scale) * (self.A @ self.B)
        self.merged = True
        ### END SOLUTION

    def unmerge(self) -> None:
        """Take scale · A @ B back out of ``base.weight`` (in place; equal to the weight before
        ``merge`` up to float32 rounding) and clear ``merged``. Unmerging a layer that is not
        merged is a ValueError."""
        if not self.merged:
            raise ValueError("this adapter is not merged: there is nothing to take out of the base weight")
        ### BEGIN SOLUTION W −= scale · A @ B, in place; merged = False
        self.base.weight -= np.float32(self.scale) * (self.A @ self.B)
        self.merged = False
        ### END SOLUTION


LORA_TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def _parent(model, name: str):
    *path, attr = name.split(".")
    node = model
    for part in path:
        node = node[int(part)] if part.isdigit() else getattr(node, part, None)
        if node is None:
            raise ValueError(f"the model has no layer {name!r}")
    return node, attr


def add_lora(model: GPTModel, rank: int, alpha: float, targets=LORA_TARGETS, *,
             rng: np.random.Generator | None = None) -> dict[str, LoRALinear]:
    """Put a ``LoRALinear`` in place of the Linear layers named by ``targets`` in every block.

    Args:
        model: a lab-04 GPTModel, changed in place.
        rank, alpha, rng: for each ``LoRALinear`` (drawn block by block, in ``targets``'
            order, from the one ``rng``).
        targets: names within a block (default all four Linears: ``attn.c_attn``,
            ``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``).

    Returns:
        ``{name: adapter}`` with full names (``h.0.attn.c_attn``, …). The model's forward
        (and lab 06's cached generation) then runs through the adapters. Its
        ``state_dict()`` keeps GPT-2's names, each adapted layer showing its effective
        weight and its bias (read-only), so lab 07's ``gpt_backward`` gives
        ``grads["<name>.weight"]`` = ∂L/∂W_eff. Train with ``lora_grads`` and
        ``lora_parameters``; ``merge_lora`` gives back a plain GPTModel. An unknown target, or a layer that already has an
        adapter, is a ValueError.
    """
    rng = make_rng(rng)
    if isinstance(targets, str):
        targets = (targets,)
    adapters: dict[str, LoRALinear] = {}
    for i in range(len(model.h)):
        for target in targets:
            name = f"h.{i}.{target}"
            parent, attr = _parent(model, name)
            layer = getattr(parent, attr, None)
            if layer is None:
                raise ValueError(f"the model has no layer {name!r}")
            adapters[name] = LoRALinear(layer, rank, alpha, rng=rng)
            setattr(parent, attr, adapters[name])
    return adapters


def lora_parameters(adapters: dict[str, LoRALinear]) -> dict[str, np.ndarray]:
    """``{"<name>.A": A, "<name>.B": B}`` for every adapter: the arrays themselves, for lab
    07's AdamW to update in place (the base weights are not among them: they stay frozen)."""
    params = {}
    for name, adapter in adapters.items():
        params[f"{name}.A"], params[f"{name}.B"] = adapter.A, adapter.B
    return params


def lora_grads(grads: dict[str, np.ndarray], adapters: dict[str, LoRALinear]) -> dict[str, np.ndarray]:
    """The adapters' gradients from lab 07's dense ones.

    Args:
        grads: ``gpt_backward``'s dict for a model with adapters: ``grads["<name>.weight"]``
            is G = ∂L/∂W_eff, the gradient with respect to the effective weight
            W + scale·A @ B of each adapted layer (the other entries are ignored).
        adapters: ``add_lora``'s dict.

    Returns:
        ``{"<name>.A": dA, "<name>.B": dB}`` (``lora_parameters``' names), with
        dA = scale · G @ Bᵀ (d_in, r) and dB = scale · Aᵀ @ G (r, d_out): since
        W_eff = W + scale·A @ B, a change dA moves W_eff by scale·dA @ B.
    """
    out = {}
    for name, adapter in adapters.items():
        if f"{name}.weight" not in grads:
            raise ValueError(f"grads has no {name}.weight: give lab 07's gpt_backward dict for the adapted model, "
                             "which has exactly model.state_dict()'s names (an adapted layer shows up there as "
                             "<name>.weight, its effective weight)")
        G = np.asarray(grads[f"{name}.weight"])
        if G.shape != (adapter.d_in, adapter.d_out):
            raise ValueError(f"grads[{name}.weight] must be ({adapter.d_in}, {adapter.d_out}), got {G.shape}")
        ### BEGIN SOLUTION chain rule through W_eff = W + scale·A @ B
        out[f"{name}.A"] = (adapter.scale * (G @ adapter.B.T)).astype(np.float32)  # (d_in, r)
        out[f"{name}.B"] = (adapter.scale * (adapter.A.T @ G)).astype(np.float32)  # (r, d_out)
        ### END SOLUTION
    return out


def merge_lora(model: GPTModel, adapters: dict[str, LoRALinear]) -> GPTModel:
    """Merge every adapter into its base weight and put the base Linear back in the model,
    in place: the model is a plain GPTModel again (GPT-2's state-dict names), computing what
    the adapted model computed. Returns the model."""
    for name, adapter in adapters.items():
        parent, attr = _parent(model, name)
        if getattr(parent, attr, None) is not adapter:
            raise ValueError(f"{name} of this model is not the adapter given")
        if not adapter.merged:
            adapter.merge()
        setattr(parent, attr, adapter.base)
    return model


# -- log-probabilities, sampling and the reward ----------------------------------------------------

def token_logprobs(model: GPTModel, ids: np.ndarray) -> np.ndarray:
    """log p(token t + 1 | tokens 0 … t) for every position: float32 (B, T − 1), from one
    forward pass of ``model`` (in whatever mode it is in) on ``ids`` (B, T), T ≥ 2."""
    ids = np.asarray(ids)
    check_ndim(ids, "ids", ndim=2, shape_hint="(B, T)")
    if ids.shape[1] < 2:
        raise ValueError(f"ids needs at least 2 tokens per row, got {ids.shape}")
    ### BEGIN SOLUTION log_softmax of the logits of ids[:, :-1], picked at the next tokens ids[:, 1:]
    logp = log_softmax(model(ids[:, :-1]), axis=-1)  # (B, T−1, V)
    return np.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0].astype(np.float32)  # (B, T−1)
    ### END SOLUTION


def sequence_logprobs(model: GPTModel, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """log p of the masked tokens of each row, summed: float32 (B,). ``mask`` (B, T) marks
    the tokens scored (an answer's tokens); position 0 cannot be scored (nothing precedes
    it), so it must be False."""
    ids, mask = _check_ids_mask(ids, mask)
    if mask[:, 0].any():
        raise ValueError("mask[:, 0] must be False: the first token has no log-probability (nothing precedes it)")
    ### BEGIN SOLUTION token_logprobs summed over mask[:, 1:]
    return (token_logprobs(model, ids) * mask[:, 1:]).sum(axis=1).astype(np.float32)
    ### END SOLUTION


def sample_group(model: GPTModel, prompt_ids: np.ndarray, group_size: int, max_new_tokens: int, *,
                 temperature: float = 1.0, rng: np.random.Generator | None = None, end_id: int) -> np.ndarray:
    """``group_size`` answers to one prompt, sampled together.

    Args:
        model: a GPTModel in eval mode. prompt_ids: (T,) int, e.g. ``render_prompt``'s.
        group_size: G ≥ 1 rows. max_new_tokens: n ≥ 1, at most max_seq_len − T.
        temperature, rng: as lab 06's ``generate`` (every draw comes from ``rng``).
        end_id: the ``END`` id: a row stops there.

    Returns:
        int64 (G, T + m), m ≤ n: every row starts with the prompt; lab 06's ``generate``
        (KV cache on, ``eos_token_id=end_id``) appends the answers, a row that has ended is
        filled with ``end_id``, and m < n only when every row has ended.
    """
    prompt_ids = np.asarray(prompt_ids)
    check_ndim(prompt_ids, "prompt_ids", ndim=1, shape_hint="(T,)")
    group_size = check_length(group_size, "group_size")
    max_new_tokens = check_length(max_new_tokens, "max_new_tokens")
    ### BEGIN SOLUTION the prompt repeated G times, one generate call with the cache and end_id as EOS
    prompts = np.repeat(prompt_ids[None, :].astype(np.int64), group_size, axis=0)  # (G, T)
    return generate(model, prompts, max_new_tokens, temperature=temperature, rng=rng, eos_token_id=end_id,
                    use_cache=True)
    ### END SOLUTION


def completion_mask(sequences: np.ndarray, prompt_len: int, end_id: int) -> np.ndarray:
    """bool (G, S) for ``sample_group``'s (G, S) rows: True on each row's answer tokens, from
    position ``prompt_len`` up to and including the answer's first ``end_id``, searched from
    ``prompt_len`` on (a prompt of several turns holds ENDs of its own), to the end of the
    row if it has none; False on the prompt and on the ``end_id`` filling after the first."""
    sequences = np.asarray(sequences)
    check_ndim(sequences, "sequences", ndim=2, shape_hint="(G, S)")
    prompt_len = check_length(prompt_len, "prompt_len", minimum=0)
    if prompt_len > sequences.shape[1]:
        raise ValueError(f"prompt_len {prompt_len} is longer than the sequences ({sequences.shape[1]} tokens)")
    ### BEGIN SOLUTION positions ≥ prompt_len that come no later than the row's first end_id
    answer = sequences[:, prompt_len:]  # (G, n)
    is_end = answer == end_id
    ends_before = np.cumsum(is_end, axis=1) - is_end  # how many END come strictly before each position
    mask = np.zeros(sequences.shape, dtype=bool)
    mask[:, prompt_len:] = ends_before == 0
    return mask
    ### END SOLUTION


def reward(tokenizer, prompt_len: int, sequence: np.ndarray, answer: str) -> float:
    """1.0 if the sampled answer is exactly ``answer``, else 0.0.

    The completion is ``sequence[prompt_len:]`` (tokens after the prompt) up to its first
    ``END``, searched from ``prompt_len`` on (ENDs inside the prompt, closing earlier turns,
    do not count); it scores 1.0 when that END is there and the tokens before it decode to
    exactly ``answer`` (no spaces trimmed). An answer that never reaches ``END`` is
    unfinished and scores 0.0. Nothing in the prompt counts, even if it contains the
    answer's text.
    """
    sequence = np.asarray(sequence)
    check_ndim(sequence, "sequence", ndim=1, shape_hint="(T,)")
    prompt_len = check_length(prompt_len, "prompt_len", minimum=0)
    if prompt_len > len(sequence):
        raise ValueError(f"prompt_len {prompt_len} is longer than the sequence ({len(sequence)} tokens)")
    if not isinstance(answer, str):
        raise ValueError(f"answer must be a string, got {type(answer).__name__}")
    ### BEGIN SOLUTION the tokens after the prompt; 0 without an END; else decode those before the first END and compare
    completion = [int(i) for i in sequence[prompt_len:]]
    end_id = special_id(tokenizer, END)
    if end_id not in completion:
        return 0.0
    said = tokenizer.decode(completion[: completion.index(end_id)])
    return 1.0 if said == answer else 0.0
    ### END SOLUTION


# -- reinforcement learning: GRPO's form --------------------------------------------------------

def group_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Each answer's advantage within its own prompt's group: float32 (P, G),
    (r − mean of the group) / (std of the group + eps), with the population standard
    deviation (divide by G). A group whose rewards are all equal (all right or all wrong)
    teaches nothing: its advantages are exactly 0. ``rewards`` (P, G), G ≥ 1."""
    rewards = as_float_array(rewards, "rewards")
    check_ndim(rewards, "rewards", ndim=2, shape_hint="(P prompts, G answers each)")
    ### BEGIN SOLUTION mean and population std along each row (the group), not over the whole batch
    mean = rewards.mean(axis=1, keepdims=True)  # (P, 1)
    std = rewards.std(axis=1, keepdims=True)  # (P, 1), ddof=0
    advantages = (rewards - mean) / (std + eps)  # (P, G)
    advantages[(rewards == rewards[:, :1]).all(axis=1)] = 0.0  # a group of equal rewards: exactly 0
    return advantages.astype(np.float32)
    ### END SOLUTION


def kl_k3(logp: np.ndarray, logp_ref: np.ndarray) -> np.ndarray:
    """The k3 estimator of KL(policy ‖ reference) per sampled token, elementwise:
    exp(ref − logp) − (ref − logp) − 1 (≥ 0, and 0 exactly where the two agree)."""
    logp, logp_ref = as_float_array(logp, "logp"), as_float_array(logp_ref, "logp_ref")
    if logp.shape != logp_ref.shape:
        raise ValueError(f"logp and logp_ref must have the same shape, got {logp.shape} and {logp_ref.shape}")
    ### BEGIN SOLUTION with d = ref − logp: exp(d) − d − 1
    d = logp_ref - logp
    return np.exp(d) - d - 1.0
    ### END SOLUTION


def grpo_loss(logp: np.ndarray, logp_old: np.ndarray, logp_ref: np.ndarray, advantages: np.ndarray,
              mask: np.ndarray, *, clip_eps: float = 0.2, kl_coef: float = 0.04):
    """The clipped policy-gradient loss with a KL penalty, GRPO's form, and its gradient.

    Args:
        logp: (B, L) log-probabilities of the sampled tokens under the policy being trained.
        logp_old: (B, L) the same under the policy that sampled them (constant).
        logp_ref: (B, L) the same under the frozen reference (the SFT model; constant).
        advantages: (B,) one per sequence (``group_advantages``, flattened).
        mask: (B, L) bool, True on the answer's tokens (the sampled ones).
        clip_eps: ε of the clip. kl_coef: β, the weight of the KL penalty.

    Per token, with ratio = exp(logp − logp_old) and A the row's advantage:
        objective = min(ratio·A, clip(ratio, 1 − ε, 1 + ε)·A) − β · k3,
        k3 = exp(ref − logp) − (ref − logp) − 1 (``kl_k3``).

    Returns:
        ``(loss, dlogp)``: loss = − the mean of the objective over all masked tokens of the
        batch (each answer token weighs the same, whatever the length of its answer; a
        float32 scalar); dlogp (B, L) float32, its gradient with respect to ``logp`` only
        (logp_old and logp_ref are constants), 0 where mask is False. Where the clip is
        active (the clipped term is the smaller) the ratio term gives no gradient.
        A mask with no True is a ValueError.
    """
    logp = as_float_array(logp, "logp")
    check_ndim(logp, "logp", ndim=2, shape_hint="(B, L)")
    logp_old, logp_ref = as_float_array(logp_old, "logp_old"), as_float_array(logp_ref, "logp_ref")
    advantages, mask = as_float_array(advantages, "advantages"), np.asarray(mask)
    if logp_old.shape != logp.shape or logp_ref.shape != logp.shape:
        raise ValueError(f"logp, logp_old and logp_ref must share the shape (B, L), got {logp.shape}, "
                         f"{logp_old.shape}, {logp_ref.shape}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be one per sequence, shape ({logp.shape[0]},), got {advantages.shape}")
    if mask.shape != logp.shape or mask.dtype != bool:
        raise ValueError(f"mask must be booleans of shape {logp.shape}, got {mask.dtype} {mask.shape}")
    if not mask.any():
        raise ValueError("the mask has no True position: the mean over no tokens is undefined")
    if not 0 <= clip_eps < 1 or kl_coef < 0:
        raise ValueError(f"clip_eps must be in [0, 1) and kl_coef ≥ 0, got {clip_eps} and {kl_coef}")
    ### BEGIN SOLUTION per token: ratio, the smaller of the plain and clipped terms, minus β·k3; −mean over masked tokens; dlogp by hand
    M = mask.sum()
    A = advantages[:, None]  # (B, 1): every token of a row shares its advantage
    ratio = np.exp(logp - logp_old)  # (B, L)
    unclipped = ratio * A
    clipped = np.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * A
    d = logp_ref - logp
    k3 = np.exp(d) - d - 1.0
    objective = np.minimum(unclipped, clipped) - kl_coef * k3  # (B, L)
    loss = -(objective * mask).sum() / M
    # d(ratio·A)/dlogp = ratio·A; the clipped term is flat where it is the one chosen and
    # the clip is active; d k3/dlogp = 1 − exp(ref − logp).
    clip_active = (clipped < unclipped) & ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + clip_eps))
    dobjective = np.where(clip_active, 0.0, ratio * A) - kl_coef * (1.0 - np.exp(d))
    dlogp = -dobjective * mask / M
    return np.float32(loss), dlogp.astype(np.float32)
    ### END SOLUTION


def rl_loss_and_grads(model: GPTModel, ids: np.ndarray, mask: np.ndarray, logp_old: np.ndarray,
                      logp_ref: np.ndarray, advantages: np.ndarray, *, clip_eps: float = 0.2,
                      kl_coef: float = 0.04):
    """``(loss, grads)`` of one GRPO update on a batch of sampled sequences.

    Args:
        model: the policy (a GPTModel, possibly with adapters).
        ids: (B, T) int, prompts and sampled answers, right-padded.
        mask: (B, T) bool, True on the answer tokens (``completion_mask``, padded); the
            scored positions are ``mask[:, 1:]``.
        logp_old, logp_ref: (B, T − 1) ``token_logprobs`` of ``ids`` under the sampling
            policy and under the frozen reference.
        advantages: (B,). clip_eps, kl_coef: as ``grpo_loss``.

    Returns:
        loss: ``grpo_loss`` with the policy's own ``token_logprobs`` of ``ids``; grads:
        ``gpt_backward``'s dict. The chain: d loss/d logits[b, t] = dlogp[b, t] ·
        (onehot(ids[b, t + 1]) − softmax(logits[b, t])), then lab 07's backward. Only the
        sampled (masked) tokens carry gradient.
    """
    ids, mask = _check_ids_mask(ids, mask)
    ### BEGIN SOLUTION forward with the cache; logp of the next tokens; grpo_loss; dlogits = dlogp·(onehot − softmax); gpt_backward
    logits, cache = gpt_forward(model, ids[:, :-1])  # (B, T−1, V)
    logp_all = log_softmax(logits, axis=-1)
    targets = ids[:, 1:, None]  # (B, T−1, 1)
    logp = np.take_along_axis(logp_all, targets, axis=-1)[..., 0]  # (B, T−1)
    loss, dlogp = grpo_loss(logp, logp_old, logp_ref, advantages, mask[:, 1:], clip_eps=clip_eps, kl_coef=kl_coef)
    dlogits = -np.exp(logp_all) * dlogp[..., None]  # the softmax part, (B, T−1, V)
    np.put_along_axis(dlogits, targets, np.take_along_axis(dlogits, targets, axis=-1) + dlogp[..., None], axis=-1)
    return loss, gpt_backward(model, cache, dlogits.astype(np.float32))
    ### END SOLUTION


# -- DPO -------------------------------------------------------------------------------------------

def dpo_loss(policy_chosen: np.ndarray, policy_rejected: np.ndarray, ref_chosen: np.ndarray,
             ref_rejected: np.ndarray, beta: float = 0.1):
    """Direct preference optimisation's loss on N pairs, and its gradient.

    Args:
        policy_chosen, policy_rejected: (N,) summed log-probabilities of the chosen
            (preferred) and rejected answers under the policy being trained.
        ref_chosen, ref_rejected: (N,) the same under the frozen reference (constants).
        beta: β > 0, how far the policy may move from the reference.

    Returns:
        ``(loss, d_policy_chosen, d_policy_rejected)``: with
        z = β·((πc − rc) − (πr − rr)), loss = −mean log σ(z) (computed stably, as
        mean log(1 + e^(−z))), a float32 scalar; the gradients (N,) float32:
        dπc = −β·σ(−z)/N and dπr = +β·σ(−z)/N.
    """
    arrays = [as_float_array(a, name) for a, name in ((policy_chosen, "policy_chosen"),
              (policy_rejected, "policy_rejected"), (ref_chosen, "ref_chosen"), (ref_rejected, "ref_rejected"))]
    if any(a.ndim != 1 or a.shape != arrays[0].shape for a in arrays) or arrays[0].size == 0:
        raise ValueError("policy_chosen, policy_rejected, ref_chosen and ref_rejected must be four non-empty (N,) "
                         f"arrays, got shapes {[a.shape for a in arrays]}")
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.integer, np.floating)) or not beta > 0:
        raise ValueError(f"beta must be a positive number, got {beta!r}")
    pc, pr, rc, rr = arrays
    ### BEGIN SOLUTION z from the two log-ratios (policy − reference, chosen minus rejected); −log σ(z) = log(1 + e^(−z)); gradients through z
    N = pc.shape[0]
    z = beta * ((pc - rc) - (pr - rr))  # (N,)
    loss = np.logaddexp(0.0, -z).mean()
    sig_neg = np.exp(-np.logaddexp(0.0, z))  # σ(−z) = 1 / (1 + e^z), without overflow for large z
    d_chosen = -beta * sig_neg / N
    return np.float32(loss), d_chosen.astype(np.float32), (-d_chosen).astype(np.float32)
    ### END SOLUTION


def dpo_loss_and_grads(model: GPTModel, chosen_ids: np.ndarray, chosen_mask: np.ndarray, rejected_ids: np.ndarray,
                       rejected_mask: np.ndarray, ref_chosen: np.ndarray, ref_rejected: np.ndarray, *,
                       beta: float = 0.1):
    """``(loss, grads)`` of one DPO update.

    Args:
        model: the policy. chosen_ids, chosen_mask, rejected_ids, rejected_mask: (N, T) ids
            and masks of the answers' tokens (as ``sequence_logprobs`` takes them; both
            padded to the same T). ref_chosen, ref_rejected: (N,) ``sequence_logprobs``
            under the frozen reference. beta: as ``dpo_loss``.

    Returns:
        loss: ``dpo_loss`` of the policy's ``sequence_logprobs``; grads: ``gpt_backward``'s
        dict. As in ``sequence_logprobs``, a mask with position 0 True is a ValueError (the
        first token has no log-probability). Each scored token of a chosen answer gets d loss/d logp = dπc of its pair (a
        sum's gradient reaches every term), of a rejected one dπr, and lab 07's backward
        runs once on the chosen and rejected rows together.
    """
    chosen_ids, chosen_mask = _check_ids_mask(chosen_ids, chosen_mask, "chosen_ids")
    rejected_ids, rejected_mask = _check_ids_mask(rejected_ids, rejected_mask, "rejected_ids")
    if chosen_ids.shape != rejected_ids.shape:
        raise ValueError(f"chosen and rejected must be padded to the same shape, got {chosen_ids.shape} and "
                         f"{rejected_ids.shape}")
    if chosen_mask[:, 0].any() or rejected_mask[:, 0].any():
        raise ValueError("mask[:, 0] must be False in chosen_mask and rejected_mask: the first token has no "
                         "log-probability (nothing precedes it), as in sequence_logprobs")
    N = chosen_ids.shape[0]
    ### BEGIN SOLUTION one forward on chosen and rejected stacked; summed masked logp; dpo_loss; spread each pair's gradient on its tokens; back as in rl_loss_and_grads
    ids = np.concatenate([chosen_ids, rejected_ids])  # (2N, T)
    scored = np.concatenate([chosen_mask, rejected_mask])[:, 1:]  # (2N, T−1)
    logits, cache = gpt_forward(model, ids[:, :-1])
    logp_all = log_softmax(logits, axis=-1)
    targets = ids[:, 1:, None]
    logp = np.take_along_axis(logp_all, targets, axis=-1)[..., 0]  # (2N, T−1)
    seq = (logp * scored).sum(axis=1)  # (2N,)
    loss, d_chosen, d_rejected = dpo_loss(seq[:N], seq[N:], ref_chosen, ref_rejected, beta)
    dlogp = np.concatenate([d_chosen, d_rejected])[:, None] * scored  # (2N, T−1)
    dlogits = -np.exp(logp_all) * dlogp[..., None]
    np.put_along_axis(dlogits, targets, np.take_along_axis(dlogits, targets, axis=-1) + dlogp[..., None], axis=-1)
    return loss, gpt_backward(model, cache, dlogits.astype(np.float32))
    ### END SOLUTION
