"""Fixtures for lab 05, made by HuggingFace: small GPT-2 checkpoints with every parameter
random, stored as the exact files (``model.safetensors``, ``config.json``) the tests write
back to disk, with HuggingFace's logits and ``generate()`` output for them, and the logits
that two classic mistakes would give (exact GELU; ``attn.c_proj`` transposed on loading).

Three layouts: ``save_pretrained``'s (``transformer.`` prefix, no buffers), the hub's
(bare names plus the ``attn.bias`` mask buffers), and half precision (float16 weights,
bfloat16 biases).
"""

import json
import tempfile
from pathlib import Path

import numpy as np

from gptkit.checkpoints import GPT2Shape, hf_model, hub_layout, random_gpt2_state, safetensors_bytes

NEEDS_TORCH = True

SHAPES = {
    "hf_layout": GPT2Shape(vocab_size=64, d_model=16, num_layers=2, num_heads=2, max_seq_len=16),
    "hub_layout": GPT2Shape(vocab_size=80, d_model=24, num_layers=3, num_heads=4, max_seq_len=20, d_ff=40,
                            layer_norm_eps=1e-3),
    "half": GPT2Shape(vocab_size=48, d_model=16, num_layers=1, num_heads=4, max_seq_len=12),
}
PROMPT, NEW_TOKENS = 4, 8


def _bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).copy()


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


def _diagnoses(state, shape, ids):
    """Logits of the same checkpoint under two classic mistakes."""
    from transformers.activations import ACT2FN

    exact = hf_model(state, shape)
    for block in exact.transformer.h:
        block.mlp.act = ACT2FN["gelu"]
    transposed = dict(state)
    for i in range(shape.num_layers):
        transposed[f"h.{i}.attn.c_proj.weight"] = np.ascontiguousarray(state[f"h.{i}.attn.c_proj.weight"].T)
    return {"logits_exact_gelu": _logits(exact, ids),
            "logits_c_proj_transposed": _logits(hf_model(transposed, shape), ids)}


def _trace(state, shape, ids):
    """Every sub-layer's inputs and outputs in the reference lab 04 model holding ``state``:
    a failing logits test names the first sub-layer that differs (``firstdiff``)."""
    import gpt  # the reference lab 04: the solutions are on the path while fixtures are made

    from gptkit.testing.firstdiff import record_trace, trace_arrays

    model = gpt.GPTModel(**shape.model_kwargs()).load_state_dict(state).eval()
    with record_trace(model) as calls:
        model(ids)
    return trace_arrays(calls)


def _case(shape, state, files, rng):
    import torch

    model = hf_model(state, shape)
    ids = rng.integers(0, shape.vocab_size, (2, 6))
    prompt = ids[:, :PROMPT]
    with torch.no_grad():
        greedy = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(torch.from_numpy(prompt)),
                                max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0).numpy()
    expected_config = shape.model_kwargs()
    return {
        "model_safetensors": _bytes(files["model.safetensors"]),
        "config_json": _bytes(files["config.json"]),
        "expected_config_json": _bytes(json.dumps(expected_config, sort_keys=True).encode()),
        "ids": ids, "logits": _logits(model, ids), "prompt": prompt, "greedy": greedy,
        **{f"param.{k}": v for k, v in state.items()},
        **_diagnoses(state, shape, ids),
        **_trace(state, shape, ids),
    }


def _saved_by_transformers(state, shape) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        hf_model(state, shape).save_pretrained(tmp)
        config = json.loads((Path(tmp) / "config.json").read_text())
        config.pop("transformers_version", None)  # the file must not change with the library's version
        return {"model.safetensors": (Path(tmp) / "model.safetensors").read_bytes(),
                "config.json": json.dumps(config, indent=2, sort_keys=True).encode()}


def _hub_config(shape) -> bytes:
    from transformers import GPT2Config

    cfg = shape.hf_config()
    cfg.pop("model_type")
    config = GPT2Config(**cfg).to_dict()
    config.pop("transformers_version", None)
    return json.dumps(config, indent=2, sort_keys=True).encode()


def build() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(505)
    cases = {}

    shape = SHAPES["hf_layout"]
    state = random_gpt2_state(shape, rng)
    cases["hf_layout"] = _case(shape, state, _saved_by_transformers(state, shape), rng)

    shape = SHAPES["hub_layout"]
    state = random_gpt2_state(shape, rng)
    files = {"model.safetensors": safetensors_bytes(hub_layout(state, shape), {"format": "pt"}),
             "config.json": _hub_config(shape)}
    cases["hub_layout"] = _case(shape, state, files, rng)

    shape = SHAPES["half"]
    state = random_gpt2_state(shape, rng)
    biases = tuple(k for k in state if k.endswith(".bias"))
    stored = {k: (v if k in biases else v.astype(np.float16)) for k, v in state.items()}
    # What the file holds, read back exactly: float16 weights, bfloat16 (truncated) biases.
    as_read = {k: (v.astype(np.float32) if k not in biases
                   else ((v.view(np.uint32) >> 16) << 16).astype(np.uint32).view(np.float32)) for k, v in stored.items()}
    files = {"model.safetensors": safetensors_bytes({"transformer." + k: v for k, v in stored.items()},
                                                    {"format": "pt"}, bf16=tuple("transformer." + b for b in biases)),
             "config.json": _hub_config(shape)}
    cases["half"] = _case(shape, as_read, files, rng)
    return cases
