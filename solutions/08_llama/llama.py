"""Lab 08 · From GPT-2 to Llama: RMSNorm, SwiGLU, rotary positions, grouped-query attention.

What changes from lab 04's GPT-2, block by block:

    GPT-2                                   Llama
    LayerNorm (mean, variance, gain, bias)  RMSNorm (root mean square, gain only)
    GELU MLP  c_proj(gelu(c_fc(x)))         SwiGLU  down(silu(gate(x)) * up(x)), no biases
    learned positions added to the input    rotary positions: q and k rotated in every block
    H heads of q, k and v                   H query heads, H_kv ≤ H key/value heads (GQA)
    head tied to the token embedding        own lm_head (unless tie_word_embeddings)

Shapes: B batch, T tokens in this call, S keys (cached + new), D ``d_model``, H query
heads, H_kv key/value heads, d = D / H per head, F ``d_ff``, V vocabulary size, L
``max_seq_len``. Positions are explicit int arrays: a token's position is where it sits
in its sequence, which is not its index in this call's input once a cache holds the
earlier tokens.

Weights: every ``Linear`` weight has shape ``(in, out)`` as in labs 03–04. HuggingFace's
Llama uses ``torch.nn.Linear``, whose weight is ``(out, in)``: loading a checkpoint
transposes each projection (and an untied ``lm_head``).
"""

from __future__ import annotations

import math

import numpy as np

from causal_mask import causal_mask, softmax
from embeddings import TokenEmbedding
from generation import KVCache, sample_next
from gpt2_weights import checkpoint_file, decode_tensor, parse_header, read_config_json
from gptkit import Layer, as_float_array, check_last_dim, check_length, check_ndim, make_rng, state_diff
from layers import Linear


def projection(d_in: int, d_out: int, rng: np.random.Generator) -> Linear:
    """A Linear d_in → d_out without bias, for every projection of the Llama."""
    return Linear(d_in, d_out, bias=False, rng=rng)


# -- RMSNorm -----------------------------------------------------------------------------------

class RMSNorm(Layer):
    """y = x / sqrt(mean(x², last axis) + eps) * weight: no mean subtracted, no bias.

    ``weight`` (D,) is the gain (ones at initialisation). ``eps`` comes from the config's
    ``rms_norm_eps`` (Llama: 1e-6 or 1e-5): it sits inside the square root.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        self.d_model = check_length(d_model, "d_model")
        self.eps = float(eps)
        self.weight = np.ones(d_model, dtype=np.float32)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., D) → (..., D); the statistics are computed in float32 (or the input's
        dtype when wider), and the output has the dtype of ``x · weight`` (float32 in,
        float32 out; float16 in with a float32 gain: float32)."""
        x = as_float_array(x, "x")
        check_last_dim(x, "x", self.d_model)
        ### BEGIN SOLUTION mean of squares over the last axis, + eps inside the root, divide, times the gain
        xf = x.astype(np.promote_types(x.dtype, np.float32), copy=False)
        mean_square = np.mean(xf * xf, axis=-1, keepdims=True)  # (..., 1)
        normed = xf / np.sqrt(mean_square + xf.dtype.type(self.eps))
        return (normed * self.weight).astype(np.promote_types(x.dtype, self.weight.dtype), copy=False)
        ### END SOLUTION


# -- SwiGLU ------------------------------------------------------------------------------------

def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish): x · sigmoid(x) = x / (1 + exp(−x)); same shape and dtype as ``x``,
    no overflow warning for large negative x."""
    x = as_float_array(x, "x")
    ### BEGIN SOLUTION x times the logistic sigmoid of x, stable for both signs
    z = np.exp(-np.abs(x))  # in (0, 1]: never overflows
    sigmoid = np.where(x >= 0, 1, z) / (1 + z)  # 1 / (1 + e^−x) for x ≥ 0, e^x / (1 + e^x) below
    return (x * sigmoid).astype(x.dtype, copy=False)
    ### END SOLUTION


class SwiGLU(Layer):
    """Llama's feed-forward: down_proj(silu(gate_proj(x)) * up_proj(x)).

    ``gate_proj`` and ``up_proj`` are Linear D → F, ``down_proj`` Linear F → D, none
    with a bias. The SiLU goes on the *gate* branch only.
    """

    def __init__(self, d_model: int, d_ff: int, *, rng: np.random.Generator | None = None):
        rng = make_rng(rng)
        self.gate_proj = projection(d_model, d_ff, rng)
        self.up_proj = projection(d_model, d_ff, rng)
        self.down_proj = projection(d_ff, d_model, rng)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., D) → (..., D)."""
        ### BEGIN SOLUTION silu of the gate branch times the up branch, then down_proj
        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))
        ### END SOLUTION


# -- rotary positional embeddings (RoPE) ---------------------------------------------------------

def _check_positions(positions, T: int) -> np.ndarray:
    positions = np.asarray(positions)
    if positions.dtype.kind not in "iu":
        raise TypeError(f"positions must be integers, got dtype {positions.dtype}")
    if positions.shape != (T,):
        raise ValueError(f"positions must be one position per token, shape ({T},), got {positions.shape}")
    if T and positions.min() < 0:
        raise ValueError(f"positions must be ≥ 0, got {positions.min()}")
    return positions


def _check_rope_input(x, positions) -> tuple[np.ndarray, np.ndarray]:
    x = as_float_array(x, "x")
    check_ndim(x, "x", min_ndim=2, shape_hint="(..., T, d)")
    if x.shape[-1] % 2:
        raise ValueError(f"RoPE rotates pairs of features: the last dimension must be even, got {x.shape[-1]}")
    return x, _check_positions(positions, x.shape[-2])


def rope_frequencies(d_head: int, base: float = 10000.0) -> np.ndarray:
    """The rotation speeds θ_i = base^(−2i/d) for i = 0 … d/2 − 1, float64 (d/2,)."""
    d = check_length(d_head, "d_head")
    if d % 2:
        raise ValueError(f"RoPE rotates pairs of features: d_head must be even, got {d}")
    ### BEGIN SOLUTION base to the power −2i/d for each pair i
    return float(base) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ### END SOLUTION


def rope_angles(positions: np.ndarray, d_head: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles m·θ_i, in the rotate-half layout.

    Args:
        positions: int (T,), the position m of each token.
        d_head: d, even.
        base: the config's ``rope_theta``.

    Returns:
        (cos, sin), each float32 (T, d): column j and column j + d/2 both hold angle
        m·θ_j (the pair that rotate-half rotates together). The angles are computed in
        float64 (a float32 angle near position 500,000 is off by up to 0.03 radians);
        only their cos and sin are float32.
    """
    positions = np.asarray(positions)
    check_ndim(positions, "positions", ndim=1, shape_hint="(T,)")
    positions = _check_positions(positions, positions.shape[0])
    ### BEGIN SOLUTION outer product of positions and θ (in float64), repeated for both halves; cos, sin as float32
    angles = positions.astype(np.float64)[:, None] * rope_frequencies(d_head, base)[None, :]  # (T, d/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (T, d)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    ### END SOLUTION


def rotate_half(x: np.ndarray) -> np.ndarray:
    """(x1, x2) → (−x2, x1), where x1 is the first half of the last axis and x2 the second."""
    x = as_float_array(x, "x")
    ### BEGIN SOLUTION split the last axis in halves, return (−second half, first half)
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    ### END SOLUTION


def apply_rope(x: np.ndarray, positions: np.ndarray, base: float = 10000.0,
               angles: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Rotary positions as HuggingFace's Llama applies them (rotate-half pairing).

    Feature i is paired with feature i + d/2 and the pair (x_i, x_{i+d/2}) is rotated by
    the angle m·θ_i, m the token's position:  x·cos + rotate_half(x)·sin.

    Args:
        x: (..., T, d) float, queries or keys (heads in the leading axes).
        positions: int (T,), token t's position (any values: an offset, gaps, …).
        base: ``rope_theta``.
        angles: ``rope_angles(positions, d, base)`` when the caller has it already (a
            model computes it once per pass and hands it to every block, as
            HuggingFace's Llama does); None: computed here.

    Returns:
        (..., T, d), same dtype as ``x``. Position 0 leaves x unchanged; every pair keeps
        its length.
    """
    x, positions = _check_rope_input(x, positions)
    ### BEGIN SOLUTION cos and sin of m·θ for these positions (unless given as angles); x·cos + rotate_half(x)·sin
    cos, sin = rope_angles(positions, x.shape[-1], base) if angles is None else angles  # (T, d)
    return (x * cos + rotate_half(x) * sin).astype(x.dtype, copy=False)
    ### END SOLUTION


def apply_rope_interleaved(x: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """The same rotation in the paper's interleaved form: feature 2i is paired with
    feature 2i + 1, and the pair is rotated by m·θ_i:

        y_2i   = x_2i · cos(m·θ_i) − x_2i+1 · sin(m·θ_i)
        y_2i+1 = x_2i · sin(m·θ_i) + x_2i+1 · cos(m·θ_i)

    Same arguments and result shape as ``apply_rope``.
    """
    x, positions = _check_rope_input(x, positions)
    ### BEGIN SOLUTION even and odd features as the pairs; rotate each pair by m·θ_i; interleave back
    d = x.shape[-1]
    angles = positions.astype(np.float64)[:, None] * rope_frequencies(d, base)[None, :]  # (T, d/2)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., T, d/2)
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out
    ### END SOLUTION


def interleaved_to_half(d_head: int) -> np.ndarray:
    """The permutation that turns the interleaved layout into the rotate-half one.

    Returns int64 (d,) ``perm`` with ``perm[j] = 2j`` for j < d/2 and ``perm[j] =
    2(j − d/2) + 1`` for j ≥ d/2, so that for any x

        apply_rope(x[..., perm], pos) == apply_rope_interleaved(x, pos)[..., perm]

    (the permutation a checkpoint converter applies to the rows of q and k weights).
    """
    d = check_length(d_head, "d_head")
    if d % 2:
        raise ValueError(f"d_head must be even, got {d}")
    ### BEGIN SOLUTION the even features first, then the odd ones
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)]).astype(np.int64)
    ### END SOLUTION


# -- grouped-query attention ---------------------------------------------------------------------

def repeat_kv(x: np.ndarray, n_rep: int) -> np.ndarray:
    """Key/value heads repeated for their groups of query heads.

    Args:
        x: (B, H_kv, S, d).
        n_rep: H / H_kv, query heads per key/value head.

    Returns:
        (B, H_kv·n_rep, S, d) where head h is key/value head h // n_rep: kv head 0 serves
        query heads 0 … n_rep−1, kv head 1 the next n_rep, and so on (grouped, not
        interleaved).
    """
    x = as_float_array(x, "x")
    check_ndim(x, "x", ndim=4, shape_hint="(B, H_kv, S, d)")
    n_rep = check_length(n_rep, "n_rep")
    ### BEGIN SOLUTION each kv head n_rep times in a row along the head axis
    return x if n_rep == 1 else np.repeat(x, n_rep, axis=1)
    ### END SOLUTION


class LlamaAttention(Layer):
    """Causal self-attention with rotary positions and H_kv key/value heads.

    ``q_proj`` Linear D → H·d, ``k_proj`` and ``v_proj`` Linear D → H_kv·d, ``o_proj``
    Linear H·d → D, none with a bias. Head h of q is columns h·d … (h+1)·d − 1 of
    ``q_proj``'s output (likewise for k and v). Scores are scaled by 1/√d.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 rope_theta: float = 10000.0, *, rng: np.random.Generator | None = None):
        self.d_model = check_length(d_model, "d_model")
        self.num_heads = check_length(num_heads, "num_heads")
        self.num_kv_heads = check_length(num_heads if num_kv_heads is None else num_kv_heads, "num_kv_heads")
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of num_heads={num_heads}")
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}: "
                             "each key/value head must serve a whole group of query heads")
        self.d_head = d_model // num_heads
        if self.d_head % 2:
            raise ValueError(f"RoPE needs an even head width, got d_model/num_heads = {self.d_head}")
        self.rope_theta = float(rope_theta)
        rng = make_rng(rng)
        kv = self.num_kv_heads * self.d_head
        self.q_proj = projection(d_model, d_model, rng)
        self.k_proj = projection(d_model, kv, rng)
        self.v_proj = projection(d_model, kv, rng)
        self.o_proj = projection(d_model, d_model, rng)

    def split_heads(self, x: np.ndarray) -> np.ndarray:
        """(B, T, n·d) → (B, n, T, d) for any number of heads n."""
        B, T, width = x.shape
        return x.reshape(B, T, width // self.d_head, self.d_head).transpose(0, 2, 1, 3)

    def project(self, x: np.ndarray, positions: np.ndarray, angles: tuple[np.ndarray, np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Queries, keys and values of T tokens, with q and k rotated to their positions.

        Args:
            x: (B, T, D), already normalised.
            positions: int (T,).
            angles: ``rope_angles(positions, d, rope_theta)`` if the caller has it, else None.

        Returns:
            q (B, H, T, d), k (B, H_kv, T, d), v (B, H_kv, T, d). Values are not rotated.
        """
        x = as_float_array(x, "x")
        check_ndim(x, "x", ndim=3, shape_hint="(B, T, D)")
        positions = _check_positions(positions, x.shape[1])
        ### BEGIN SOLUTION project, split into heads, rotate q and k (not v) by their positions with rope_theta (and angles)
        q = apply_rope(self.split_heads(self.q_proj(x)), positions, self.rope_theta, angles)
        k = apply_rope(self.split_heads(self.k_proj(x)), positions, self.rope_theta, angles)
        v = self.split_heads(self.v_proj(x))
        return q, k, v
        ### END SOLUTION

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Causal attention of T queries over S ≥ T keys, heads merged and projected.

        Args:
            q: (B, H, T, d), the queries of the last T of S positions (query i sits at
                S − T + i).
            k, v: (B, H_kv, S, d).

        Returns:
            (B, T, D): ``o_proj`` of the merged heads.
        """
        B, H, T, d = q.shape
        H_kv, S = k.shape[1], k.shape[2]
        ### BEGIN SOLUTION query heads grouped by their kv head (a reshape, or repeat_kv), causal attention over S keys, merge heads, o_proj
        k, v = repeat_kv(k, H // H_kv), repeat_kv(v, H // H_kv)  # (B, H, S, d)
        scores = q @ k.swapaxes(-1, -2) / math.sqrt(d)  # (B, H, T, S); a Python float keeps float32
        scores = np.where(causal_mask(T, S), scores, -np.inf)  # query i sits at S − T + i
        weights = softmax(scores, axis=-1)  # (B, H, T, S)
        out = weights @ v  # (B, H, T, d)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, T, H * d))  # heads side by side, (B, T, D)
        ### END SOLUTION

    def forward(self, x: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """x (B, T, D) → (B, T, D); positions int (T,), default 0 … T−1."""
        x = as_float_array(x, "x")
        check_ndim(x, "x", ndim=3, shape_hint="(B, T, D)")
        positions = np.arange(x.shape[1]) if positions is None else positions
        return self.attend(*self.project(x, positions))


# -- the block and the model ---------------------------------------------------------------------

class LlamaBlock(Layer):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(·)).

    ``input_layernorm`` and ``post_attention_layernorm`` are RMSNorm, ``self_attn`` a
    LlamaAttention, ``mlp`` a SwiGLU (HuggingFace's names).
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, d_ff: int, rms_norm_eps: float = 1e-6,
                 rope_theta: float = 10000.0, *, rng: np.random.Generator | None = None):
        rng = make_rng(rng)
        self.input_layernorm = RMSNorm(d_model, rms_norm_eps)
        self.self_attn = LlamaAttention(d_model, num_heads, num_kv_heads, rope_theta, rng=rng)
        self.post_attention_layernorm = RMSNorm(d_model, rms_norm_eps)
        self.mlp = SwiGLU(d_model, d_ff, rng=rng)

    def forward(self, x: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """x (B, T, D) → (B, T, D); positions int (T,), default 0 … T−1."""
        x = as_float_array(x, "x")
        positions = np.arange(x.shape[1]) if positions is None else positions
        ### BEGIN SOLUTION two pre-norm residual branches: attention (with positions), then the SwiGLU
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))
        ### END SOLUTION


class LlamaModel(Layer):
    """A Llama-family decoder: embed_tokens → layers → norm → lm_head.

    Attributes (state-dict names are HuggingFace's without the ``model.`` prefix):
        embed_tokens: TokenEmbedding (V, D).
        layers: list of LlamaBlock.
        norm: the final RMSNorm.
        lm_head: Linear D → V without bias, or None when ``tie_word_embeddings`` (the
            logits then use ``embed_tokens.weight`` (V, D) transposed).
    """

    def __init__(self, vocab_size: int, d_model: int, num_layers: int, num_heads: int, num_kv_heads: int,
                 d_ff: int, max_seq_len: int, rms_norm_eps: float = 1e-6, rope_theta: float = 10000.0,
                 tie_word_embeddings: bool = False, *, rng: np.random.Generator | None = None):
        rng = make_rng(rng)
        self.vocab_size = check_length(vocab_size, "vocab_size")
        self.d_model = check_length(d_model, "d_model")
        self.max_seq_len = check_length(max_seq_len, "max_seq_len")
        self.tie_word_embeddings = bool(tie_word_embeddings)
        self.embed_tokens = TokenEmbedding(vocab_size, d_model, rng=rng)
        self.layers = [LlamaBlock(d_model, num_heads, num_kv_heads, d_ff, rms_norm_eps, rope_theta, rng=rng)
                       for _ in range(check_length(num_layers, "num_layers"))]
        self.norm = RMSNorm(d_model, rms_norm_eps)
        self.lm_head = None if self.tie_word_embeddings else projection(d_model, vocab_size, rng)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Final hidden states (B, T, D), already normalised, → logits (B, T, V)."""
        ### BEGIN SOLUTION the tied head (embed_tokens.weight transposed) or lm_head
        if self.lm_head is None:
            return x @ self.embed_tokens.weight.T  # (B, T, D) @ (D, V) → (B, T, V)
        return self.lm_head(x)  # (B, T, V)
        ### END SOLUTION

    def forward(self, token_ids: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """token_ids (B, T) int → float32 logits (B, T, V); positions int (T,), default 0 … T−1."""
        token_ids = np.asarray(token_ids)
        check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, T)")
        positions = np.arange(token_ids.shape[1]) if positions is None else positions
        ### BEGIN SOLUTION embed (no position embedding: the blocks rotate q and k), blocks, final norm, head
        x = self.embed_tokens(token_ids)
        for block in self.layers:
            x = block(x, positions)
        return self.logits(self.norm(x))
        ### END SOLUTION


def llama_parameter_shapes(*, vocab_size: int, d_model: int, num_layers: int, num_heads: int, num_kv_heads: int,
                           d_ff: int, tie_word_embeddings: bool = False, **_ignored) -> dict[str, tuple[int, ...]]:
    """Every parameter of a LlamaModel by name and shape, as ``state_dict()`` holds them
    (Linear weights (in, out)). Takes LlamaModel's keyword arguments."""
    D, F, kv = d_model, d_ff, num_kv_heads * (d_model // num_heads)
    shapes = {"embed_tokens.weight": (vocab_size, D)}
    for i in range(num_layers):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (D,), p + "self_attn.q_proj.weight": (D, D),
                       p + "self_attn.k_proj.weight": (D, kv), p + "self_attn.v_proj.weight": (D, kv),
                       p + "self_attn.o_proj.weight": (D, D), p + "post_attention_layernorm.weight": (D,),
                       p + "mlp.gate_proj.weight": (D, F), p + "mlp.up_proj.weight": (D, F),
                       p + "mlp.down_proj.weight": (F, D)})
    shapes["norm.weight"] = (D,)
    if not tie_word_embeddings:
        shapes["lm_head.weight"] = (D, vocab_size)
    return shapes


# -- HuggingFace checkpoints -----------------------------------------------------------------------

def model_name(name: str) -> str | None:
    """A HuggingFace Llama tensor name as LlamaModel's, or None for a tensor to skip.

    ``model.layers.0.self_attn.q_proj.weight`` → ``layers.0.self_attn.q_proj.weight``;
    ``lm_head.weight`` stays; stored rotary buffers (names ending ``rotary_emb.inv_freq``)
    are skipped.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    ### BEGIN SOLUTION None for the rotary buffers; strip a leading "model."
    if name.endswith("rotary_emb.inv_freq"):
        return None
    return name[len("model."):] if name.startswith("model.") else name
    ### END SOLUTION


def to_model_layout(name: str, array: np.ndarray) -> np.ndarray:
    """A checkpoint tensor (HuggingFace's layout) in LlamaModel's layout.

    ``torch.nn.Linear``'s weight has shape (out, in); our ``Linear``'s (in, out). So every
    projection (``…_proj.weight``) and ``lm_head.weight`` is transposed (a view is enough:
    loading copies it); embeddings and RMSNorm gains are not.
    """
    ### BEGIN SOLUTION transpose the Linear weights (q/k/v/o, gate/up/down, lm_head); everything else as stored
    if name.endswith("_proj.weight") or name == "lm_head.weight":
        return array.T
    return array
    ### END SOLUTION


def read_llama_checkpoint(path) -> dict[str, np.ndarray]:
    """A Llama checkpoint's tensors as float32 arrays, in LlamaModel's names and layout.

    Args:
        path: a ``.safetensors`` file or a model directory holding ``model.safetensors``.

    Returns:
        {``embed_tokens.weight``: (V, D), ``layers.0.self_attn.q_proj.weight``: (D, D), …}:
        names from ``model_name``, arrays through ``to_model_layout``. An ``lm_head.weight``
        equal to ``embed_tokens.weight`` (a tied head saved anyway) is dropped.
    """
    file = checkpoint_file(path)
    buf = np.fromfile(file, dtype=np.uint8)  # (file size,)
    try:
        header, start = parse_header(buf)
    except ValueError as exc:
        raise ValueError(f"{file} is not a safetensors file: its header does not parse ({exc})") from None
    state = {}
    for stored, info in header.items():
        if stored == "__metadata__":
            continue
        name = model_name(stored)
        if name is None:
            continue
        begin, end = info["data_offsets"]
        if start + end > buf.size:
            raise ValueError(f"{file} is truncated: tensor {stored!r} ends past the end of the file")
        raw = buf[start + begin : start + end]
        state[name] = to_model_layout(name, decode_tensor(raw, info["dtype"], info["shape"]).copy())
    head = state.get("lm_head.weight")
    if head is not None and head.shape[::-1] == state.get("embed_tokens.weight", head).shape \
            and np.array_equal(head.T, state["embed_tokens.weight"]):
        del state["lm_head.weight"]
    return state


def read_config(path) -> dict:
    """LlamaModel's keyword arguments from a Llama ``config.json``.

    Args:
        path: ``config.json``, a model directory, or the ``.safetensors`` file in one.

    Returns:
        {"vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff",
        "max_seq_len", "rms_norm_eps", "rope_theta", "tie_word_embeddings"} from
        ``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
        ``num_key_value_heads`` (absent or null: as many as the attention heads),
        ``intermediate_size``, ``max_position_embeddings``, ``rms_norm_eps`` (default 1e-6),
        ``rope_theta`` (default 10000.0; newer files keep it in
        ``rope_parameters["rope_theta"]``) and ``tie_word_embeddings`` (default False).
    """
    config, file = read_config_json(path)
    _check_llama_config(config, file)
    rope = config.get("rope_parameters") or {}
    ### BEGIN SOLUTION map HuggingFace's Llama config names onto LlamaModel's arguments, with Llama's defaults
    return {
        "vocab_size": config["vocab_size"],
        "d_model": config["hidden_size"],
        "num_layers": config["num_hidden_layers"],
        "num_heads": config["num_attention_heads"],
        "num_kv_heads": config.get("num_key_value_heads") or config["num_attention_heads"],
        "d_ff": config["intermediate_size"],
        "max_seq_len": config["max_position_embeddings"],
        "rms_norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    ### END SOLUTION


def _check_llama_config(config, file) -> None:
    """Raise ValueError when ``config`` is not a Llama that LlamaModel computes exactly."""
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object")
    if config.get("model_type", "llama") != "llama":
        raise ValueError(f"{file} describes a {config.get('model_type')!r} model, not a Llama")
    needed = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings")
    missing = [k for k in needed if not isinstance(config.get(k), int)]
    if missing:
        raise ValueError(f"{file} lacks Llama's integer settings {', '.join(missing)}")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{file} asks for hidden_act={config['hidden_act']!r}; LlamaModel uses SiLU")
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * config["num_attention_heads"] != config["hidden_size"]:
        raise ValueError(f"{file} sets head_dim={head_dim}; LlamaModel needs hidden_size / num_attention_heads")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"{file} asks for rope scaling {rope!r}; LlamaModel implements plain RoPE only")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ValueError(f"{file} sets {key}=true; LlamaModel's projections have no biases")


def load_llama(path) -> LlamaModel:
    """A LlamaModel (in eval mode) holding the checkpoint in the directory ``path``
    (``config.json`` + ``model.safetensors``)."""
    config = read_config(path)
    state = read_llama_checkpoint(path)
    diff = state_diff(llama_parameter_shapes(**config), state)
    if diff:
        raise ValueError(f"checkpoint {checkpoint_file(path)} does not match its config.json: "
                         + diff.describe(expected="config", actual="checkpoint", unexpected="not in the config"))
    ### BEGIN SOLUTION build the model from the config, load the state
    model = LlamaModel(**config, rng=np.random.default_rng(0))
    model.load_state_dict(state)
    return model.eval()
    ### END SOLUTION


# -- generation with a cache ---------------------------------------------------------------------------

class LlamaCache(KVCache):
    """Lab 06's KV cache, for a Llama: every block's *rotated* keys and its values.

    Attributes (as lab 06's ``KVCache``):
        keys, values: one float32 buffer (B, H_kv, L, d) per block, allocated once;
            positions 0 … length−1 hold data.
        length: how many positions are filled (the position of the next token).
        batch_size (B), max_seq_len (L), num_kv_heads (H_kv) = num_heads, d_head (d).

    ``update(layer, k, v)`` and ``reorder(rows)`` are lab 06's: k and v (B, H_kv, T, d)
    in, views (B, H_kv, length+T, d) out. Only the shapes are Llama's: H_kv heads.
    """

    def __init__(self, model: LlamaModel, batch_size: int):
        self.batch_size = check_length(batch_size, "batch_size")
        self.max_seq_len = model.max_seq_len
        attn = model.layers[0].self_attn
        self.num_kv_heads, self.d_head = attn.num_kv_heads, attn.d_head
        self.num_heads = self.num_kv_heads  # the heads lab 06's update expects
        shape = (self.batch_size, self.num_kv_heads, self.max_seq_len, self.d_head)
        self.keys = [np.zeros(shape, np.float32) for _ in model.layers]
        self.values = [np.zeros(shape, np.float32) for _ in model.layers]
        self.length = 0


def forward_with_cache(model: LlamaModel, token_ids: np.ndarray, cache: LlamaCache) -> np.ndarray:
    """Run the model on T new tokens that follow the ``cache.length`` cached ones.

    Returns float32 logits (B, T, V), equal to ``model(all tokens so far)[:, -T:]``.
    The new tokens sit at positions cache.length … cache.length+T−1; their keys are
    rotated once, before they are stored. ``cache.length`` grows by T.
    """
    token_ids = np.asarray(token_ids)
    check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, T)")
    if not isinstance(cache, LlamaCache):
        raise TypeError(f"cache must be a LlamaCache, got {type(cache).__name__}")
    B, T = token_ids.shape
    if B != cache.batch_size:
        raise ValueError(f"token_ids has {B} rows but the cache was built for batch_size={cache.batch_size}")
    if cache.length + T > cache.max_seq_len:
        raise ValueError(f"the cache holds {cache.length} tokens; {T} more would go past max_seq_len="
                         f"{cache.max_seq_len}")
    ### BEGIN SOLUTION positions length…length+T−1 and their rope_angles; per block: norm, project (rotating k), cache.update, attend, residuals, mlp; norm, head; advance length
    start = cache.length
    positions = np.arange(start, start + T)
    attn = model.layers[0].self_attn
    angles = rope_angles(positions, attn.d_head, attn.rope_theta)  # once for every block, not twice per block
    x = model.embed_tokens(token_ids)
    for i, block in enumerate(model.layers):
        q, k, v = block.self_attn.project(block.input_layernorm(x), positions, angles)
        keys, values = cache.update(i, k, v)  # (B, H_kv, start+T, d), keys already rotated
        x = x + block.self_attn.attend(q, keys, values)
        x = x + block.mlp(block.post_attention_layernorm(x))
    cache.length = start + T
    return model.logits(model.norm(x))
    ### END SOLUTION


def generate(model: LlamaModel, token_ids: np.ndarray, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, rng: np.random.Generator | None = None,
             eos_token_id: int | None = None, use_cache: bool = True) -> np.ndarray:
    """Append up to ``max_new_tokens`` tokens to every row, each chosen by lab 06's
    ``sample_next`` (temperature 0, the default, is greedy).

    Args:
        model: a LlamaModel.
        token_ids: (B, T) int prompt, T ≥ 1; T + max_new_tokens ≤ max_seq_len.
        eos_token_id: a row that emits it emits only it afterwards; generation stops once
            every row has. Any id is an EOS, 0 included; None means none.
        use_cache: True feeds the prompt once, then one token per step through a
            LlamaCache; False reruns the whole sequence every step.

    Returns:
        int64 (B, T + m), m ≤ max_new_tokens: with temperature 0, HuggingFace's
        ``generate(do_sample=False)``.
    """
    token_ids = np.asarray(token_ids)
    check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, T)")
    n = check_length(max_new_tokens, "max_new_tokens", minimum=0)
    B, T = token_ids.shape
    if T < 1:
        raise ValueError("token_ids needs at least one token per row to start from")
    if T + n > model.max_seq_len:
        raise ValueError(f"cannot add {n} tokens to a prompt of {T}: max_seq_len={model.max_seq_len}")
    rng = make_rng(rng)
    ### BEGIN SOLUTION prompt once through the cache, then one token per step; sample_next; EOS bookkeeping
    out = np.empty((B, T + n), dtype=np.int64)
    out[:, :T] = token_ids
    length, new = T, out[:, :T]
    cache = LlamaCache(model, B) if use_cache else None
    finished = np.zeros(B, dtype=bool)
    for _ in range(n):
        if use_cache:
            logits = forward_with_cache(model, new, cache)[:, -1]
        else:
            logits = model(out[:, :length])[:, -1]
        nxt = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, rng=rng)
        if eos_token_id is not None:
            nxt[finished] = eos_token_id
            finished |= nxt == eos_token_id
        out[:, length] = nxt
        length += 1
        new = out[:, length - 1 : length]
        if eos_token_id is not None and finished.all():
            break
    return out[:, :length].copy()
    ### END SOLUTION
