"""GPT-2 checkpoints for the kit's tests, the demo and the benchmarks (not for student
code): random parameters under GPT-2's names, safetensors files written with NumPy alone,
HuggingFace models built from the same arrays, and where a real GPT-2 small lives on this
machine (if anywhere).

Random checkpoints randomise *every* parameter (LayerNorm gains and biases, every bias):
GPT-2's own initialisation (unit gains, zero biases) would hide bugs such as a LayerNorm
without its affine part. The scales keep activations in the range where mistakes show
(GELU inputs of a few units, attention that is neither uniform nor one-hot).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptkit.gpt2 import gpt2_parameter_shapes

# safetensors dtype names of the arrays this writer can store
_ST_DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64"}

@dataclass(frozen=True)
class GPT2Shape:
    """A GPT-2's sizes, under GPTModel's argument names."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    max_seq_len: int
    d_ff: int | None = None  # None: 4·d_model, as GPT-2's n_inner=None
    layer_norm_eps: float = 1e-5

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    def model_kwargs(self) -> dict:
        return {"vocab_size": self.vocab_size, "d_model": self.d_model, "num_layers": self.num_layers,
                "num_heads": self.num_heads, "d_ff": self.ff, "max_seq_len": self.max_seq_len,
                "layer_norm_eps": self.layer_norm_eps}

    def hf_config(self) -> dict:
        """config.json's GPT-2 settings (what transformers' GPT2Config takes)."""
        return {"model_type": "gpt2", "vocab_size": self.vocab_size, "n_embd": self.d_model,
                "n_layer": self.num_layers, "n_head": self.num_heads, "n_positions": self.max_seq_len,
                "n_inner": self.d_ff, "layer_norm_epsilon": self.layer_norm_eps,
                "activation_function": "gelu_new", "bos_token_id": None, "eos_token_id": None,
                "tie_word_embeddings": True}


GPT2_SMALL = GPT2Shape(vocab_size=50257, d_model=768, num_layers=12, num_heads=12, max_seq_len=1024)

# Small random GPT-2s for the live checks, by name: each lab's tests pick a few (the names
# become test ids). Head counts, n_inner and eps vary so that layout mistakes show.
SMALL_SHAPES = {
    "2 heads": GPT2Shape(vocab_size=101, d_model=16, num_layers=2, num_heads=2, max_seq_len=24),
    "6 heads, n_inner": GPT2Shape(vocab_size=64, d_model=48, num_layers=3, num_heads=6, max_seq_len=40, d_ff=72),
    "1 head, eps 1e-3": GPT2Shape(vocab_size=33, d_model=8, num_layers=1, num_heads=1, max_seq_len=16,
                                  layer_norm_eps=1e-3),
    "1 head": GPT2Shape(vocab_size=64, d_model=16, num_layers=2, num_heads=1, max_seq_len=32),
    "4 heads": GPT2Shape(vocab_size=97, d_model=32, num_layers=3, num_heads=4, max_seq_len=40, d_ff=48),
    "8 heads, eps 1e-3": GPT2Shape(vocab_size=50, d_model=64, num_layers=2, num_heads=8, max_seq_len=48,
                                   layer_norm_eps=1e-3),
}


def random_gpt2_state(shape: GPT2Shape, rng: np.random.Generator, *, scale: float = 1.5) -> dict[str, np.ndarray]:
    """float32 parameters under GPT-2's hub names, every one random.

    Weights are N(0, (scale/√fan_in)²)-ish so each layer keeps unit-sized activations;
    LayerNorm gains N(1, 0.2²), biases N(0, 0.1²). ``scale`` > 1 sharpens attention and
    widens GELU inputs.
    """
    def std(key: str, dims: tuple[int, ...], gain: bool) -> float:
        if key in ("attn.c_attn.weight", "mlp.c_fc.weight"):
            return scale * 1.5 / np.sqrt(dims[0])  # dims[0] is the fan-in
        if key in ("attn.c_proj.weight", "mlp.c_proj.weight"):
            return 0.5 / np.sqrt(dims[0])
        return {"wte.weight": 0.15, "mlp.c_fc.bias": 0.2}.get(key, 0.2 if gain else 0.1)

    state = {}
    for name, dims in gpt2_parameter_shapes(**shape.model_kwargs()).items():
        key = name.split(".", 2)[2] if name.startswith("h.") else name  # the name within a block
        gain = key.startswith("ln") and key.endswith(".weight")  # LayerNorm gains are 1 + noise
        noise = (rng.standard_normal(dims, dtype=np.float32) * np.float32(std(key, dims, gain))).astype(np.float32)
        state[name] = 1 + noise if gain else noise
    return state


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None,
                      *, bf16: tuple[str, ...] = ()) -> bytes:
    """A safetensors file's bytes. Names in ``bf16`` are stored as bfloat16 (truncated
    float32, the way the format stores it); other arrays keep their dtype."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        if name in bf16:
            data = (arr.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
            dtype = "BF16"
        else:
            arr = arr.astype(arr.dtype.newbyteorder("<"))
            dtype = _ST_DTYPES[arr.dtype]
            data = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format pads the header to 8 bytes
    return len(head).to_bytes(8, "little") + head + b"".join(blobs)


def read_safetensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``(tensors, metadata)`` of a ``.safetensors`` file of float32 tensors (what the kit
    writes), the tensors by name; another dtype is a ValueError naming the tensor."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        if entry["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {entry['dtype']}, not F32")
        a, b = entry["data_offsets"]
        tensors[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(entry["shape"]).copy()
    return tensors, metadata


def hub_layout(state: dict[str, np.ndarray], shape: GPT2Shape) -> dict[str, np.ndarray]:
    """The tensors as the hub's ``gpt2`` repository stores them: bare names plus each
    block's ``attn.bias`` causal-mask buffer (1, 1, L, L)."""
    out = dict(state)
    mask = np.tril(np.ones((shape.max_seq_len, shape.max_seq_len), np.float32))[None, None]
    for i in range(shape.num_layers):
        out[f"h.{i}.attn.bias"] = mask
    return out


def write_checkpoint(folder: Path, state: dict[str, np.ndarray], shape: GPT2Shape, *,
                     prefix: str = "", config: dict | None = None) -> Path:
    """``folder/model.safetensors`` + ``folder/config.json``; returns ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(
        safetensors_bytes({prefix + k: v for k, v in state.items()}, {"format": "pt"}))
    (folder / "config.json").write_text(json.dumps(config or shape.hf_config(), indent=1))
    return folder


# -- HuggingFace (only where torch is installed) -------------------------------------------

def hf_model(state: dict[str, np.ndarray], shape: GPT2Shape, device=None):
    """A ``GPT2LMHeadModel`` in eval mode holding exactly ``state`` (float32)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = shape.hf_config()
    cfg.pop("model_type")
    with torch.device("meta"):  # no time spent on a random init that is overwritten at once
        model = GPT2LMHeadModel(GPT2Config(**cfg))
    tensors = {"transformer." + k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    missing = [m for m in missing if m != "lm_head.weight" and not m.endswith(".attn.bias")]
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    return model.to(device or "cpu").eval()


# -- real GPT-2 small -------------------------------------------------------------------------

GPT2_DIR_ENV = "GPT2_DIR"
HOW_TO_GET_GPT2 = (
    "real GPT-2 small weights not found: on a machine with internet run "
    "`uv run --extra torch python -c \"from transformers import AutoTokenizer, GPT2LMHeadModel; "
    "GPT2LMHeadModel.from_pretrained('gpt2'); AutoTokenizer.from_pretrained('gpt2')\"` "
    "(fills the HuggingFace cache with the weights and the tokenizer), "
    f"or set {GPT2_DIR_ENV} to a folder holding GPT-2's config.json and model.safetensors"
)


def hub_cache() -> Path:
    """The HuggingFace hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    return Path(os.environ.get("HF_HUB_CACHE") or (
        Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"))


def local_checkpoints(env_var: str) -> list[Path]:
    """Folders that may hold a checkpoint, nothing downloaded: the one $env_var names, then
    every snapshot in the HuggingFace hub cache."""
    candidates = [Path(os.environ[env_var]).expanduser()] if os.environ.get(env_var) else []
    return candidates + sorted(hub_cache().glob("models--*/snapshots/*"))


def find_real_gpt2() -> Path | None:
    """A folder with real GPT-2 small's ``config.json`` and ``model.safetensors``: the
    folder named by $GPT2_DIR, else the HuggingFace cache's ``gpt2`` (or
    ``openai-community/gpt2``) snapshot, else None."""
    candidates = []
    if os.environ.get(GPT2_DIR_ENV):
        candidates.append(Path(os.environ[GPT2_DIR_ENV]).expanduser())
    hub = hub_cache()
    for repo in ("models--gpt2", "models--openai-community--gpt2"):  # the hub's old and new names
        candidates += sorted((Path(hub) / repo / "snapshots").glob("*"), reverse=True)
    for folder in candidates:
        if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
            return folder
    return None
