"""Lab 09's references, shared by its fixture recipe, its live tests and the benchmark:
random encoder–decoder parameters under lab 09's names (MarianMT's, without ``model.``),
a HuggingFace ``MarianMTModel`` holding them, and the renaming onto
``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer``.

Why MarianMT: of HuggingFace's encoder–decoders it is the one built like the original
Transformer: post-norm blocks (``LN(x + sublayer(x))``) with no final or embedding
LayerNorm, fixed sinusoidal positions (sines in the first half of the columns, cosines in
the second), embeddings scaled by √D, and one embedding matrix shared by source, target
and the output head. torch is imported only inside the functions that need it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Seq2SeqShape:
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    max_seq_len: int
    num_decoder_layers: int | None = None
    activation: str = "relu"
    pad_id: int = 0
    eos_id: int = 1

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    def model_kwargs(self) -> dict:
        """Keyword arguments of lab 09's ``EncoderDecoderModel`` (post-norm, shared
        embeddings, sinusoidal positions: MarianMT's layout)."""
        return dict(vocab_size=self.vocab_size, d_model=self.d_model, num_layers=self.num_layers,
                    num_heads=self.num_heads, d_ff=self.d_ff, max_seq_len=self.max_seq_len,
                    num_decoder_layers=self.decoder_layers, activation=self.activation, pad_id=self.pad_id)


_ATTN = ("q_proj", "k_proj", "v_proj", "out_proj")


def layer_shapes(d_model: int, d_ff: int, *, cross: bool) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of one lab 09 EncoderLayer (``cross=False``) or DecoderLayer."""
    D, F = d_model, d_ff
    shapes = {}
    for attn in ("self_attn", "encoder_attn") if cross else ("self_attn",):
        for p in _ATTN:
            shapes[f"{attn}.{p}.weight"], shapes[f"{attn}.{p}.bias"] = (D, D), (D,)
        shapes[f"{attn}_layer_norm.weight"] = shapes[f"{attn}_layer_norm.bias"] = (D,)
    shapes.update({"fc1.weight": (D, F), "fc1.bias": (F,), "fc2.weight": (F, D), "fc2.bias": (D,),
                   "final_layer_norm.weight": (D,), "final_layer_norm.bias": (D,)})
    return shapes


def random_layer_state(d_model: int, d_ff: int, rng: np.random.Generator, *, cross: bool,
                       scale: float = 1.5) -> dict[str, np.ndarray]:
    """Every parameter random: q/k/v weights ~ 2·scale/√fan_in (sharp attention), fc1
    ~ scale/√fan_in, out_proj and fc2 ~ 0.6/√fan_in, LayerNorm gains N(1, 0.2²), every bias N(0, 0.1²)."""
    state = {}
    for name, dims in layer_shapes(d_model, d_ff, cross=cross).items():
        if "layer_norm.weight" in name:
            state[name] = (1 + 0.2 * rng.standard_normal(dims)).astype(np.float32)
        elif name.endswith(".weight"):
            if any(p in name for p in ("q_proj", "k_proj", "v_proj")):
                std = 2 * scale / np.sqrt(dims[0])  # sharp attention: a wrong mask shows
            else:
                std = (0.6 if "out_proj" in name or "fc2" in name else scale) / np.sqrt(dims[0])
            state[name] = (std * rng.standard_normal(dims)).astype(np.float32)
        else:
            state[name] = (0.1 * rng.standard_normal(dims)).astype(np.float32)
    return state


def random_seq2seq_state(shape: Seq2SeqShape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A whole model's parameters under lab 09's names, every one random (the output
    bias ``final_logits_bias`` too: HuggingFace's zero default would hide a missing one)."""
    state = {"shared.weight": (0.5 * rng.standard_normal((shape.vocab_size, shape.d_model))).astype(np.float32)}
    for side, n, cross in (("encoder", shape.num_layers, False), ("decoder", shape.decoder_layers, True)):
        for i in range(n):
            for k, v in random_layer_state(shape.d_model, shape.d_ff, rng, cross=cross).items():
                state[f"{side}.layers.{i}.{k}"] = v
    state["final_logits_bias"] = (0.2 * rng.standard_normal(shape.vocab_size)).astype(np.float32)
    return state


def hf_marian(state: dict[str, np.ndarray], shape: Seq2SeqShape, device=None):
    """A ``MarianMTModel`` in eval mode holding exactly ``state`` (Linear weights transposed
    to torch's (out, in)); no dropout, no forced EOS, no banned tokens."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=shape.vocab_size, decoder_vocab_size=shape.vocab_size, d_model=shape.d_model,
        encoder_layers=shape.num_layers, decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.num_heads, decoder_attention_heads=shape.num_heads,
        encoder_ffn_dim=shape.d_ff, decoder_ffn_dim=shape.d_ff, max_position_embeddings=shape.max_seq_len,
        activation_function=shape.activation, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=shape.pad_id, eos_token_id=shape.eos_id, decoder_start_token_id=shape.pad_id,
        forced_eos_token_id=None, bad_words_ids=None)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = MarianMTModel(cfg).eval()
    tensors = {}
    for name, value in state.items():
        t = torch.from_numpy(np.array(value, dtype=np.float32))
        if name == "final_logits_bias":
            tensors[name] = t[None, :]
            continue
        if name.endswith(".weight") and t.ndim == 2 and name != "shared.weight":
            t = t.T.contiguous()  # lab 09 stores (d_in, d_out); torch's Linear (out, in)
        tensors["model." + name] = t
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if "embed_positions" not in m and "embed_tokens" not in m and m != "lm_head.weight"]
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, model.model.shared.weight)
    return model.to(device or "cpu").eval()


def torch_layer_state(state: dict[str, np.ndarray], *, cross: bool) -> dict[str, np.ndarray]:
    """One lab 09 layer's parameters renamed (and transposed) for
    ``torch.nn.TransformerDecoderLayer`` (``cross=True``) or ``TransformerEncoderLayer``."""
    out = {}
    for attn, torch_name in (("self_attn", "self_attn"), ("encoder_attn", "multihead_attn")):
        if attn == "encoder_attn" and not cross:
            continue
        out[f"{torch_name}.in_proj_weight"] = np.concatenate([state[f"{attn}.{p}.weight"].T for p in _ATTN[:3]])
        out[f"{torch_name}.in_proj_bias"] = np.concatenate([state[f"{attn}.{p}.bias"] for p in _ATTN[:3]])
        out[f"{torch_name}.out_proj.weight"] = state[f"{attn}.out_proj.weight"].T
        out[f"{torch_name}.out_proj.bias"] = state[f"{attn}.out_proj.bias"]
    norms = ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"] if cross else \
        ["self_attn_layer_norm", "final_layer_norm"]
    for i, n in enumerate(norms, start=1):
        out[f"norm{i}.weight"], out[f"norm{i}.bias"] = state[f"{n}.weight"], state[f"{n}.bias"]
    out["linear1.weight"], out["linear1.bias"] = state["fc1.weight"].T, state["fc1.bias"]
    out["linear2.weight"], out["linear2.bias"] = state["fc2.weight"].T, state["fc2.bias"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def torch_layer(state: dict[str, np.ndarray], *, d_model: int, num_heads: int, d_ff: int, cross: bool,
                norm_first: bool, activation: str, device=None):
    """``torch.nn.TransformerDecoderLayer`` / ``TransformerEncoderLayer`` (batch_first, no
    dropout, eval) holding ``state``. Its parameters keep requires_grad, so torch takes its
    plain path, not the fused inference one."""
    import torch

    cls = torch.nn.TransformerDecoderLayer if cross else torch.nn.TransformerEncoderLayer
    layer = cls(d_model, num_heads, d_ff, dropout=0.0, activation=activation, batch_first=True,
                norm_first=norm_first)
    tensors = {k: torch.from_numpy(v) for k, v in torch_layer_state(state, cross=cross).items()}
    layer.load_state_dict(tensors, strict=True)
    return layer.to(device or "cpu").eval()


# --- a real MarianMT checkpoint on this machine ------------------------------------------------------

MARIAN_DIR_ENV = "MARIAN_DIR"
HOW_TO_GET_MARIAN = (
    "no MarianMT checkpoint found: set $MARIAN_DIR to a folder holding a MarianMT config.json (model_type "
    "\"marian\") and its weights, or put one in the HuggingFace cache, e.g. `uv run --extra torch python -c "
    "\"from transformers import MarianMTModel; MarianMTModel.from_pretrained('Helsinki-NLP/opus-mt-en-de')\"` "
    "on a machine with internet"
)


def find_real_marian():
    """A folder with a MarianMT ``config.json`` (model_type "marian") and its weights:
    $MARIAN_DIR, else any snapshot in the HuggingFace cache; None when there is none."""
    import json

    from gptkit.checkpoints import local_checkpoints

    for folder in local_checkpoints(MARIAN_DIR_ENV):
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            continue
        weights = any((folder / name).is_file() for name in ("model.safetensors", "pytorch_model.bin"))
        if config.get("model_type") == "marian" and weights:
            return folder
    return None


def marian_as_lab09(hf) -> tuple[dict, dict[str, np.ndarray]]:
    """A HuggingFace ``MarianMTModel``'s ``EncoderDecoderModel`` keyword arguments and its
    parameters under lab 09's names and layout (the inverse of :func:`hf_marian`)."""
    cfg = hf.config
    if getattr(cfg, "normalize_before", None):
        raise ValueError("a pre-norm Marian config (normalize_before) is not MarianMT's post-norm layout")
    if cfg.d_model % cfg.encoder_attention_heads or cfg.encoder_ffn_dim != cfg.decoder_ffn_dim:
        raise ValueError("lab 09's model needs one feed-forward width and whole heads")
    kwargs = dict(vocab_size=cfg.vocab_size, d_model=cfg.d_model, num_layers=cfg.encoder_layers,
                  num_decoder_layers=cfg.decoder_layers, num_heads=cfg.encoder_attention_heads,
                  d_ff=cfg.encoder_ffn_dim, max_seq_len=cfg.max_position_embeddings,
                  activation=cfg.activation_function, scale_embedding=bool(cfg.scale_embedding),
                  pad_id=cfg.pad_token_id)
    state = {}
    for name, tensor in hf.state_dict().items():
        value = tensor.detach().float().cpu().numpy()
        if name == "final_logits_bias":
            state[name] = value[0]
            continue
        if "embed_positions" in name or "embed_tokens" in name or name == "lm_head.weight":
            continue  # the fixed sinusoids, and the shared embedding under other names
        name = name.removeprefix("model.")
        state[name] = value.T.copy() if name.endswith(".weight") and value.ndim == 2 and name != "shared.weight" \
            else value
    return kwargs, state
