# Lab 05: fill in each `# YOUR CODE HERE` block in this file, then run `uv run pytest -m lab05`.
"""Lab 05 · Reading a HuggingFace GPT-2 checkpoint with NumPy alone, and greedy generation.

A ``.safetensors`` file is three parts, one after the other:

    [8 bytes]  n, the header's length: an unsigned 64-bit little-endian integer
    [n bytes]  the header: JSON, {name: {"dtype": "F32", "shape": [768, 2304],
               "data_offsets": [begin, end]}, ...} plus an optional "__metadata__" entry
    [the rest] the data: tensor ``name`` is bytes begin … end-1 *of this part*, row-major,
               little-endian

``config.json`` beside it holds the sizes (``n_embd``, ``n_layer``, …). GPT-2 stores its
linear layers as ``Conv1D`` with weights (in, out): exactly our ``Linear``, so nothing is
transposed on the way in.

Shapes: B batch, T prompt length, n new tokens, V vocabulary size.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gpt import GPTModel
from gptkit import check_length, check_ndim, gpt2_parameter_names, gpt2_parameter_shapes, state_diff

# The tensor dtypes read here, as stored (little-endian), with their sizes in bytes.
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}

# GPT-2's tanh-approximated GELU goes by these names in config.json.
TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh")


# -- safetensors ------------------------------------------------------------------------

def parse_header(buf: np.ndarray) -> tuple[dict, int]:
    """Split a safetensors file's bytes into its header and the start of its data.

    Args:
        buf: uint8 (N,), the file's bytes (all of them, or at least the first 8 + n).

    Returns:
        header: the JSON header as parsed (a dict; ``"__metadata__"`` included if present).
        data_start: the index in the file of the data part's first byte (8 + header length).
    """
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
        raise TypeError("buf must be a 1-D uint8 array holding the file's bytes")
    if buf.size < 8:
        raise ValueError(f"a safetensors file starts with an 8-byte header length; got only {buf.size} bytes")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 05 · parse_header: read the 8-byte little-endian header length n, then parse the next n bytes as JSON')


def decode_tensor(raw: np.ndarray, dtype: str, shape: list[int]) -> np.ndarray:
    """One tensor's bytes as a float32 array.

    Args:
        raw: uint8 (nbytes,), the tensor's bytes (little-endian, row-major).
        dtype: "F32", "F16" or "BF16". bfloat16 is the top 16 bits of a float32.
        shape: the tensor's shape.

    Returns:
        float32 array of ``shape`` (for F32 it may be a view of ``raw``'s memory).
    """
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}: only {', '.join(DTYPES)} can be read")
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise TypeError("raw must be a 1-D uint8 array of the tensor's bytes")
    if raw.size != math.prod(shape) * DTYPES[dtype].itemsize:
        raise ValueError(
            f"a {dtype} tensor of shape {tuple(shape)} needs {math.prod(shape) * DTYPES[dtype].itemsize} "
            f"bytes, got {raw.size}"
        )
    # YOUR CODE HERE
    raise NotImplementedError('Lab 05 · decode_tensor: view the bytes as the stored dtype (BF16: the top half of a float32), as float32, reshape')


def hub_name(name: str) -> str | None:
    """A stored tensor name as the hub's GPT-2 name, or None for a tensor to skip.

    ``save_pretrained`` writes ``transformer.h.0.ln_1.weight`` where the hub has
    ``h.0.ln_1.weight``. ``h.<i>.attn.bias`` and ``h.<i>.attn.masked_bias`` are not
    parameters but stored causal-mask buffers: skip them. Other names pass unchanged.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    # YOUR CODE HERE
    raise NotImplementedError('Lab 05 · hub_name: strip a leading "transformer.", return None for the attention-mask buffers')


def checkpoint_file(path) -> Path:
    """The ``.safetensors`` file that ``path`` names: the file itself, or a model
    directory's ``model.safetensors``."""
    path = Path(path)
    if path.is_dir():
        file = path / "model.safetensors"
        if not file.is_file():
            others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".json", ".safetensors"))
            hint = ""
            if "model.safetensors.index.json" in others:
                hint = " (sharded checkpoints are not supported)"
            elif "pytorch_model.bin" in others:
                hint = " (only safetensors can be read without torch: re-save with save_pretrained)"
            raise FileNotFoundError(
                f"{path} holds no model.safetensors{hint}; it has: {', '.join(others) or 'nothing relevant'}"
            )
        return file
    if not path.is_file():
        raise FileNotFoundError(f"no such checkpoint file or model directory: {path}")
    return path


def read_checkpoint(path) -> dict[str, np.ndarray]:
    """A GPT-2 checkpoint's parameters under the hub's names, as float32 arrays.

    Args:
        path: a ``.safetensors`` file, or a model directory holding ``model.safetensors``.

    Returns:
        {"wte.weight": (V, D), "wpe.weight": (L, D), "h.0.ln_1.weight": (D,), …,
        "ln_f.bias": (D,)}: exactly GPT-2's parameters. The mask buffers are skipped and a
        ``lm_head.weight`` equal to ``wte.weight`` (the tied output head) is dropped.

    Each tensor is read from disk once, straight into its own array, and the mask
    buffers are not read at all: reading needs about the checkpoint's size in memory
    (float16/bfloat16: twice it, as float32).
    """
    file = checkpoint_file(path)
    size = file.stat().st_size
    if size < 8:
        raise ValueError(f"{file} is not a safetensors file: {size} bytes, too short for a header")
    head = np.memmap(file, dtype=np.uint8, mode="r")  # only the header's pages are ever read from it
    try:
        header, data_start = parse_header(np.asarray(head))
    except ValueError as exc:  # JSON and UTF-8 errors are ValueErrors
        raise ValueError(f"{file} is not a safetensors file: its header does not parse ({exc})") from None
    finally:
        del head
    entries = _checked_entries(header, data_start, size, file)

    state: dict[str, np.ndarray] = {}
    with open(file, "rb") as fh:
        for stored, (dtype, shape, begin, end) in sorted(entries.items(), key=lambda e: e[1][2]):
            name = hub_name(stored)
            if name is None:
                continue
            if name in state:
                raise ValueError(f"{file}: two tensors are both named {name!r} once normalised")
            if dtype not in DTYPES:
                raise ValueError(
                    f"{file}: tensor {stored!r} has dtype {dtype}; only {', '.join(DTYPES)} can be read"
                )
            fh.seek(data_start + begin)
            raw = np.fromfile(fh, dtype=np.uint8, count=end - begin)  # (nbytes,)
            state[name] = decode_tensor(raw, dtype, shape)

    _drop_tied_head(state, file)
    _check_gpt2_names(state, file)
    return state


def _checked_entries(header, data_start: int, size: int, file: Path) -> dict[str, tuple]:
    """The header's tensors as {name: (dtype, shape, begin, end)}, or a ValueError saying
    what is wrong with the file."""
    if data_start > size:
        raise ValueError(
            f"{file} is not a safetensors file or is truncated: its header claims "
            f"{data_start - 8} bytes but the file has only {size}"
        )
    if not isinstance(header, dict):
        raise ValueError(f"{file} is not a safetensors file: its header is not a JSON object")
    data_size = size - data_start
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            ok = (isinstance(dtype, str) and all(isinstance(s, int) and s >= 0 for s in shape)
                  and isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end)
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{file}: bad header entry for {name!r}: {info!r}")
        if end > data_size:
            raise ValueError(
                f"{file} is truncated: tensor {name!r} ends at data byte {end} but the file "
                f"holds only {data_size} bytes of data"
            )
        if dtype in DTYPES and end - begin != math.prod(shape) * DTYPES[dtype].itemsize:
            raise ValueError(
                f"{file}: bad header entry for {name!r}: {dtype} {tuple(shape)} needs "
                f"{math.prod(shape) * DTYPES[dtype].itemsize} bytes, data_offsets give {end - begin}"
            )
        entries[name] = (dtype, list(shape), begin, end)
    return entries


def _drop_tied_head(state: dict[str, np.ndarray], file: Path) -> None:
    """Remove ``lm_head.weight`` when it is a copy of ``wte.weight``; refuse an untied head."""
    head = state.pop("lm_head.weight", None)
    if head is None or "wte.weight" not in state:
        return
    if head.shape != state["wte.weight"].shape or not np.array_equal(head, state["wte.weight"]):
        raise ValueError(
            f"{file}: lm_head.weight differs from wte.weight. This model's output head is "
            f"untied, and GPTModel only supports GPT-2's tied head (logits = x @ wte.weight.T)"
        )


def _check_gpt2_names(state: dict[str, np.ndarray], file: Path) -> None:
    """Raise ValueError unless ``state`` has exactly GPT-2's parameter names."""
    if "wte.weight" not in state:
        sample = ", ".join(sorted(state)[:5]) or "no tensors"
        raise ValueError(
            f"{file} does not look like a GPT-2 checkpoint: no wte.weight (it has {sample}, …)"
        )
    layers = {int(n.split(".")[1]) for n in state if n.startswith("h.") and n.split(".")[1].isdigit()}
    diff = state_diff(gpt2_parameter_names(len(layers)), state)
    if diff:
        raise ValueError(f"{file} is not a complete GPT-2 checkpoint: {diff.describe()}")


# -- config.json -----------------------------------------------------------------------

def config_file(path) -> Path:
    """The ``config.json`` that ``path`` names: the file itself, the one in a model
    directory, or the one beside a ``.safetensors`` file."""
    path = Path(path)
    if path.is_dir():
        file = path / "config.json"
    elif path.name.endswith(".safetensors"):
        file = path.parent / "config.json"
    else:
        file = path
    if not file.is_file():
        raise FileNotFoundError(f"no config.json for {path} (looked for {file})")
    return file


def read_config_json(path) -> tuple[dict, Path]:
    """The parsed ``config.json`` that ``path`` names (see ``config_file``), and that file;
    ValueError when it is not JSON. What it holds is for the caller to check."""
    file = config_file(path)
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file} is not valid JSON ({exc})") from None
    return config, file


def read_config(path) -> dict:
    """``GPTModel``'s keyword arguments from a GPT-2 ``config.json``.

    Args:
        path: ``config.json``, a model directory, or the ``.safetensors`` file in one.

    Returns:
        {"vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_seq_len",
        "layer_norm_eps"}: from ``vocab_size``, ``n_embd``, ``n_layer``, ``n_head``,
        ``n_inner`` (None means 4·n_embd), ``n_positions``, ``layer_norm_epsilon``.
    """
    config, file = read_config_json(path)
    _check_gpt2_config(config, file)
    # YOUR CODE HERE
    raise NotImplementedError("Lab 05 · read_config: map GPT-2's config names onto GPTModel's arguments (n_inner None → 4·n_embd)")


def _check_gpt2_config(config, file: Path) -> None:
    """Raise ValueError when ``config`` is not a GPT-2 that ``GPTModel`` computes exactly."""
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object")
    model_type = config.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ValueError(f"{file} describes a {model_type!r} model, not GPT-2")
    needed = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions")
    missing = [k for k in needed if not isinstance(config.get(k), int)]
    if missing:
        raise ValueError(f"{file} lacks GPT-2's integer settings {', '.join(missing)}")
    activation = config.get("activation_function", "gelu_new")
    if activation not in TANH_GELU_NAMES:
        raise ValueError(
            f"{file} asks for activation_function={activation!r}; GPTModel uses GPT-2's tanh "
            f"GELU ({' or '.join(TANH_GELU_NAMES)})"
        )
    unsupported = {  # setting: the value GPTModel computes
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
    }
    for key, value in unsupported.items():
        if config.get(key, value) != value:
            raise ValueError(f"{file} sets {key}={config[key]!r}; GPTModel only supports {key}={value!r}")


# -- the model ---------------------------------------------------------------------------

def _check_against_config(state: dict[str, np.ndarray], config: dict, file: Path) -> None:
    """Raise ValueError listing every parameter whose shape disagrees with config.json."""
    diff = state_diff(gpt2_parameter_shapes(**config), state)
    if diff:
        raise ValueError(f"checkpoint {file} does not match its config.json: "
                         + diff.describe(expected="config", actual="checkpoint", unexpected="not in the config"))


def load_gpt2(path) -> GPTModel:
    """A ``GPTModel`` (in eval mode) holding the GPT-2 checkpoint in the directory ``path``
    (``config.json`` + ``model.safetensors``; or the ``.safetensors`` file, with its
    ``config.json`` beside it)."""
    config = read_config(path)
    state = read_checkpoint(path)
    _check_against_config(state, config, checkpoint_file(path))
    # YOUR CODE HERE
    raise NotImplementedError('Lab 05 · load_gpt2: build GPTModel from the config, load the weights as stored (no transposes)')


def generate_greedy(model: GPTModel, token_ids: np.ndarray, max_new_tokens: int) -> np.ndarray:
    """Append ``max_new_tokens`` tokens, each the argmax of the last position's logits.

    Args:
        model: a GPTModel; call ``model.eval()`` first, or dropout makes the output random.
        token_ids: (B, T) int prompt, T ≥ 1.
        max_new_tokens: n ≥ 0.

    Returns:
        int64 (B, T + n): the prompt followed by the n generated tokens.

    Raises ValueError when T + n > the model's ``max_seq_len``: every token of the result
    must have a position embedding.
    """
    token_ids = np.asarray(token_ids)
    check_ndim(token_ids, "token_ids", ndim=2, shape_hint="(B, T)")
    if token_ids.dtype.kind not in "iu":
        raise TypeError(f"token_ids must be integers, got dtype {token_ids.dtype}")
    if token_ids.shape[1] < 1:
        raise ValueError("token_ids needs at least one token per row to start from")
    n = check_length(max_new_tokens, "max_new_tokens", minimum=0)
    T, limit = token_ids.shape[1], model.max_seq_len
    if T + n > limit:
        raise ValueError(
            f"cannot generate {n} tokens after a prompt of {T}: the result would be {T + n} "
            f"tokens long but the model has positions for only max_seq_len={limit}"
        )
    # YOUR CODE HERE
    raise NotImplementedError("Lab 05 · generate_greedy: run the model, append the last position's argmax, repeat n times")
