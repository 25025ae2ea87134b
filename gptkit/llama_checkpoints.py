"""Llama checkpoints for lab 08's tests, fixtures and benchmark (not for student code):
random parameters under HuggingFace's Llama names and layout (``torch.nn.Linear``
weights stored (out, in)), ``LlamaForCausalLM`` models built from the same arrays, and
where a real Llama-family checkpoint lives on this machine (if anywhere).

Every parameter is random, RMSNorm gains included (N(1, 0.2²)): unit gains would hide a
norm that forgets its gain, and equal gate and up weights would hide swapping them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptkit.checkpoints import local_checkpoints


@dataclass(frozen=True)
class LlamaShape:
    """A Llama's sizes, under lab 08's LlamaModel argument names."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    max_seq_len: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    def model_kwargs(self) -> dict:
        return {"vocab_size": self.vocab_size, "d_model": self.d_model, "num_layers": self.num_layers,
                "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads, "d_ff": self.d_ff,
                "max_seq_len": self.max_seq_len, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "tie_word_embeddings": self.tie_word_embeddings}

    def hf_config(self) -> dict:
        """``LlamaConfig``'s keyword arguments for this shape."""
        return {"vocab_size": self.vocab_size, "hidden_size": self.d_model, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                "intermediate_size": self.d_ff, "max_position_embeddings": self.max_seq_len,
                "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
                "tie_word_embeddings": self.tie_word_embeddings, "hidden_act": "silu",
                "attention_bias": False, "mlp_bias": False, "bos_token_id": None, "eos_token_id": None,
                "pad_token_id": None}


def hf_parameter_shapes(shape: LlamaShape) -> dict[str, tuple[int, ...]]:
    """``LlamaForCausalLM``'s parameters by name and (out, in) shape."""
    D, F, kv = shape.d_model, shape.d_ff, shape.num_kv_heads * shape.d_head
    out = {"model.embed_tokens.weight": (shape.vocab_size, D)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (D,), p + "self_attn.q_proj.weight": (D, D),
                    p + "self_attn.k_proj.weight": (kv, D), p + "self_attn.v_proj.weight": (kv, D),
                    p + "self_attn.o_proj.weight": (D, D), p + "post_attention_layernorm.weight": (D,),
                    p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                    p + "mlp.down_proj.weight": (D, F)})
    out["model.norm.weight"] = (D,)
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = (shape.vocab_size, D)
    return out


def random_llama_state(shape: LlamaShape, rng: np.random.Generator, *, scale: float = 1.5) -> dict[str, np.ndarray]:
    """float32 parameters under HuggingFace's names and layout, every one random.

    Projections N(0, (s/√fan_in)²) so activations stay unit-sized and attention is
    neither uniform nor one-hot; RMSNorm gains N(1, 0.2²); embeddings N(0, 0.5²) (RMSNorm
    follows them, so their scale is free)."""
    state = {}
    for name, dims in hf_parameter_shapes(shape).items():
        if name.endswith("norm.weight"):
            state[name] = (1 + 0.2 * rng.standard_normal(dims)).astype(np.float32)
            continue
        fan_in = dims[-1]
        std = {"embed_tokens": 0.5, "q_proj": scale / np.sqrt(fan_in), "k_proj": scale / np.sqrt(fan_in),
               "gate_proj": 1.5 / np.sqrt(fan_in), "up_proj": 1.0 / np.sqrt(fan_in)}
        key = next((k for k in std if k in name), None)
        s = std[key] if key else 0.7 / np.sqrt(fan_in)
        state[name] = (rng.standard_normal(dims) * s).astype(np.float32)
    return state


def hf_llama(state: dict[str, np.ndarray], shape: LlamaShape, device=None):
    """A ``LlamaForCausalLM`` in eval mode (eager attention, float32) holding exactly ``state``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape.hf_config())
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    tensors = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and shape.tie_word_embeddings)]
    assert not missing and not unexpected, (missing, unexpected)
    if shape.tie_word_embeddings:
        model.tie_weights()
    # buffers (the rotary inv_freq) were made on the meta device: rebuild them for real
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model.to(device or "cpu").eval()


def saved_files(state: dict[str, np.ndarray], shape: LlamaShape) -> dict[str, bytes]:
    """``model.safetensors`` and ``config.json`` as ``save_pretrained`` writes them (the
    config without its transformers version, so the bytes do not change with the library)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        hf_llama(state, shape).save_pretrained(tmp)
        config = json.loads((Path(tmp) / "config.json").read_text())
        config.pop("transformers_version", None)
        return {"model.safetensors": (Path(tmp) / "model.safetensors").read_bytes(),
                "config.json": json.dumps(config, indent=2, sort_keys=True).encode()}


# -- a real Llama-family checkpoint ------------------------------------------------------------------

LLAMA_DIR_ENV = "LLAMA_DIR"
HOW_TO_GET_LLAMA = (
    "no real Llama-family checkpoint found: set $LLAMA_DIR to a folder holding a Llama's config.json "
    "(model_type \"llama\", plain RoPE) and a single model.safetensors, or put one in the HuggingFace cache, "
    "e.g. `uv run --extra torch python -c \"from transformers import AutoModelForCausalLM; "
    "AutoModelForCausalLM.from_pretrained('HuggingFaceTB/SmolLM2-135M')\"` on a machine with internet"
)


def _usable(folder: Path) -> bool:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return (config.get("model_type") == "llama" and (folder / "model.safetensors").is_file()
            and rope.get("rope_type", rope.get("type", "default")) == "default"
            and config.get("num_hidden_layers", 99) <= 40)


def find_real_llama() -> Path | None:
    """A folder with a real Llama-family ``config.json`` and ``model.safetensors``: $LLAMA_DIR,
    else any snapshot in the HuggingFace cache whose config says ``model_type: llama``."""
    for folder in local_checkpoints(LLAMA_DIR_ENV):
        if _usable(folder):
            return folder
    return None
