"""Fixtures for lab 08, made by HuggingFace's Llama and checked against the reference solution.

Unit cases: ``rope`` (HuggingFace's ``apply_rotary_pos_emb`` at non-contiguous, offset
positions, for two ``rope_theta``; the interleaved form from its own equations in float64),
``rmsnorm`` (``LlamaRMSNorm`` on inputs small enough that eps 1e-5 and 1e-6 differ),
``swiglu`` (``LlamaMLP`` with gate and up weights that differ), ``gqa`` (``repeat_kv``,
and the reference LlamaAttention at offset positions, whose q/k/v HuggingFace's model
checks below).

Checkpoint cases: three tiny random ``LlamaForCausalLM`` (every parameter random, RMSNorm
gains included), saved by ``save_pretrained``, stored as their exact files with
HuggingFace's logits and ``generate()`` tokens:

- ``gqa_untied``: 4 query heads over 2 key/value heads, its own lm_head;
- ``mha_tied``: 3 heads over 3 key/value heads, head tied to the embedding, eps 1e-5;
- ``mqa_theta``: 4 query heads over 1 key/value head, ``rope_theta`` 500000.

``<checkpoint>_trace``: every sub-layer's inputs and outputs in the reference model on the
checkpoint's ``ids`` (``gptkit.testing.firstdiff``), so a failing logits test names the
first sub-layer that differs.

Whole-model cases, with their own random generator (the cases above stay as they are):

- ``positions``: a random 2-block Llama run by HuggingFace at ``position_ids`` with gaps and
  an offset: its logits, and the first block's input and output (``output_hidden_states``),
  so that a block or a model that drops its ``positions`` argument shows;
- ``eos``: greedy ``generate()`` of the same model with three EOS ids, one that every row
  emits before the limit, one that only some rows emit, one that no row emits.

What each catalogued mistake outputs is stored beside the right answer for the cases its
``diagnose`` names (cases ``rope``, ``rmsnorm``, ``swiglu``, ``gqa``, the checkpoints,
``positions`` and ``eos``).
"""

import json
import tempfile
from pathlib import Path

import numpy as np

from gptkit.llama_checkpoints import LlamaShape, hf_llama, random_llama_state, saved_files
from gptkit.testing.firstdiff import record_trace, trace_arrays
from gptkit.testing.fixtures import eos_choices
from grader.fixtures import diagnoses

NEEDS_TORCH = True
LAB = "08_llama"

SHAPES = {
    "gqa_untied": LlamaShape(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48,
                             max_seq_len=32),
    "mha_tied": LlamaShape(vocab_size=48, d_model=24, num_layers=2, num_heads=3, num_kv_heads=3, d_ff=40,
                           max_seq_len=32, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "mqa_theta": LlamaShape(vocab_size=40, d_model=32, num_layers=1, num_heads=4, num_kv_heads=1, d_ff=32,
                            max_seq_len=32, rope_theta=500000.0),
}
CHUNKS = [6, 1, 1, 4, 1, 7]  # the cache tests feed the 20 tokens in these pieces
POSITIONS = np.array([3, 4, 9, 17, 30, 31])  # gaps and an offset: a RoPE that ignores them fails
NEW_TOKENS = 12


def _hf_rope(x, positions, theta):
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    d = x.shape[-1]
    config = LlamaConfig(hidden_size=d * 2, num_attention_heads=2, rope_theta=theta, max_position_embeddings=64)
    rot = LlamaRotaryEmbedding(config=config)
    t = torch.from_numpy(x)
    cos, sin = rot(t, torch.from_numpy(positions)[None])
    q, _ = apply_rotary_pos_emb(t, t, cos, sin)
    return q.numpy()


def _interleaved64(x, positions, theta):
    d = x.shape[-1]
    theta_i = theta ** (-np.arange(0, d, 2) / d)
    ang = positions[:, None].astype(np.float64) * theta_i
    x = x.astype(np.float64)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
    out[..., 1::2] = a * np.sin(ang) + b * np.cos(ang)
    return out.astype(np.float32)


def _rope_case(ll, rng):
    x = rng.standard_normal((2, 3, len(POSITIONS), 8)).astype(np.float32)
    case = {"x": x, "positions": POSITIONS, "rope": _hf_rope(x, POSITIONS, 10000.0),
            "rope_theta_500000": _hf_rope(x, POSITIONS, 500000.0),
            "interleaved": _interleaved64(x, POSITIONS, 10000.0),
            "rotate_half": np.concatenate([-x[..., 4:], x[..., :4]], axis=-1)}
    assert np.allclose(ll.apply_rope(x, POSITIONS), case["rope"], atol=1e-5)
    assert np.allclose(ll.apply_rope_interleaved(x, POSITIONS), case["interleaved"], atol=1e-5)

    def outputs(g):
        return {"rope": g.apply_rope(x, POSITIONS), "rope_theta_500000": g.apply_rope(x, POSITIONS, 500000.0),
                "interleaved": g.apply_rope_interleaved(x, POSITIONS)}

    return {**case, **diagnoses(LAB, "rope", case, outputs, "llama")}


def _rmsnorm_case(ll, rng):
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    D = 16
    weight = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    small = (rng.standard_normal((3, 5, D)) * 2e-3).astype(np.float32)  # mean square ~4e-6: eps shows
    big = (rng.standard_normal((3, 5, D)) * 3 + 1).astype(np.float32)  # a mean far from 0
    case = {"weight": weight, "small": small, "big": big, "eps": np.float64(1e-5)}
    for name in ("small", "big"):
        norm = LlamaRMSNorm(D, eps=1e-5)
        norm.weight.data = torch.from_numpy(weight)
        with torch.no_grad():
            case[f"out_{name}"] = norm(torch.from_numpy(case[name])).numpy()

    def outputs(g):
        norm = g.RMSNorm(D, eps=1e-5)
        norm.weight = weight.copy()
        return {"out_small": norm(small), "out_big": norm(big)}

    assert all(np.allclose(v, case[k], atol=1e-5, rtol=1e-5) for k, v in outputs(ll).items())
    return {**case, **diagnoses(LAB, "rmsnorm", case, outputs, "llama")}


def _swiglu_case(ll, rng):
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    D, F = 12, 20
    hf = {n: (rng.standard_normal(s) / np.sqrt(s[1]) * g).astype(np.float32)
          for n, s, g in (("gate_proj", (F, D), 2.0), ("up_proj", (F, D), 1.0), ("down_proj", (D, F), 1.0))}
    x = rng.standard_normal((2, 7, D)).astype(np.float32)
    mlp = LlamaMLP(LlamaConfig(hidden_size=D, intermediate_size=F, num_attention_heads=2, num_key_value_heads=2))
    mlp.load_state_dict({f"{n}.weight": torch.from_numpy(w) for n, w in hf.items()})
    with torch.no_grad():
        out = mlp(torch.from_numpy(x)).numpy()
    silu_in = np.linspace(-12, 12, 49, dtype=np.float32)
    case = {"x": x, "out": out, "silu_in": silu_in,
            "silu_out": torch.nn.functional.silu(torch.from_numpy(silu_in)).numpy(),
            **{f"param.{n}.weight": np.ascontiguousarray(w.T) for n, w in hf.items()}}

    def outputs(g):
        m = g.SwiGLU(D, F, rng=np.random.default_rng(0))
        for n, w in hf.items():
            getattr(m, n).weight = np.ascontiguousarray(w.T)
        return {"out": m(x)}

    assert np.allclose(outputs(ll)["out"], out, atol=1e-5)
    return {**case, **diagnoses(LAB, "swiglu", case, outputs, "llama")}


def _gqa_case(ll, rng):
    import torch
    from transformers.models.llama.modeling_llama import repeat_kv

    kv = rng.standard_normal((2, 2, 5, 4)).astype(np.float32)
    D, H, Hkv = 32, 4, 2
    params = {"q_proj.weight": (D, D), "k_proj.weight": (D, Hkv * 8), "v_proj.weight": (D, Hkv * 8),
              "o_proj.weight": (D, D)}
    params = {n: (rng.standard_normal(s) * 1.5 / np.sqrt(s[0])).astype(np.float32) for n, s in params.items()}
    x = rng.standard_normal((2, 6, D)).astype(np.float32)
    case = {"kv": kv, "repeated": repeat_kv(torch.from_numpy(kv), 3).numpy(), "x": x, "positions": POSITIONS,
            **{f"param.{n}": w for n, w in params.items()}}

    def outputs(g):
        attn = g.LlamaAttention(D, H, Hkv, 10000.0, rng=np.random.default_rng(0))
        attn.load_state_dict(params)
        return {"repeated": g.repeat_kv(kv, 3), "attention": attn(x, POSITIONS)}

    case["attention"] = outputs(ll)["attention"]
    return {**case, **diagnoses(LAB, "gqa", case, outputs, "llama")}


def _checkpoint_case(ll, name, rng):
    import torch

    shape = SHAPES[name]
    state = random_llama_state(shape, rng)
    hf = hf_llama(state, shape)
    files = saved_files(state, shape)
    ids = rng.integers(0, shape.vocab_size, (2, sum(CHUNKS)))
    prompt = ids[:, :4]
    with torch.no_grad():
        logits = hf(torch.from_numpy(ids)).logits.numpy()
        p = torch.from_numpy(prompt)
        greedy = hf.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=0).numpy()
    case = {"model_safetensors": np.frombuffer(files["model.safetensors"], np.uint8).copy(),
            "config_json": np.frombuffer(files["config.json"], np.uint8).copy(),
            "expected_config_json": np.frombuffer(json.dumps(shape.model_kwargs(), sort_keys=True).encode(),
                                                  np.uint8).copy(),
            "ids": ids, "chunks": np.array(CHUNKS), "logits": logits, "prompt": prompt, "greedy": greedy}
    if name == "gqa_untied":  # the parameters in LlamaModel's names and layout, for tests that skip loading
        case.update({f"param.{ll.model_name(k)}": ll.to_model_layout(ll.model_name(k), v) for k, v in state.items()})

    with tempfile.TemporaryDirectory() as tmp:
        for fname, data in files.items():
            (Path(tmp) / fname).write_bytes(data)

        def outputs(g):
            model = g.load_llama(tmp)
            cache, parts, start = g.LlamaCache(model, 2), [], 0
            for n in CHUNKS:
                parts.append(g.forward_with_cache(model, ids[:, start : start + n], cache))
                start += n
            return {"logits": model(ids), "cached_logits": np.concatenate(parts, axis=1)}

        mine = outputs(ll)
        assert np.allclose(mine["logits"], logits, atol=1e-4), f"{name}: the reference differs from HuggingFace"
        assert np.allclose(mine["cached_logits"], logits, atol=1e-4), f"{name}: cached logits differ"
        assert np.array_equal(ll.generate(ll.load_llama(tmp), prompt, NEW_TOKENS), greedy), f"{name}: generate"
        case["cached_logits"] = logits
        return {**case, **diagnoses(LAB, name, case, outputs, "llama")}


def _trace_case(ll, case):
    """Every sub-layer's inputs and outputs in the reference model on the checkpoint's
    ``ids``: a failing logits test names the first sub-layer that differs."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "model.safetensors").write_bytes(case["model_safetensors"].tobytes())
        (Path(tmp) / "config.json").write_bytes(case["config_json"].tobytes())
        model = ll.load_llama(tmp)
    with record_trace(model) as calls:
        model(case["ids"])
    return trace_arrays(calls)


POSITIONS_SHAPE = LlamaShape(vocab_size=24, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=40,
                             max_seq_len=48, rms_norm_eps=1e-5, rope_theta=500.0)
MODEL_POSITIONS = np.array([5, 6, 7, 11, 12, 19, 20, 21, 30, 41])  # an offset and gaps
EOS_PROMPT_LEN, EOS_NEW_TOKENS = 3, 10


def _positions_case(ll, rng):
    """Logits and the first block's output at gapped, offset positions, from HuggingFace."""
    import torch

    shape = POSITIONS_SHAPE
    state = random_llama_state(shape, rng)
    hf = hf_llama(state, shape)
    ids = rng.integers(0, shape.vocab_size, (2, len(MODEL_POSITIONS)))
    with torch.no_grad():
        out = hf(torch.from_numpy(ids), position_ids=torch.from_numpy(MODEL_POSITIONS)[None].expand(2, -1),
                 output_hidden_states=True)
    params = {ll.model_name(k): ll.to_model_layout(ll.model_name(k), v) for k, v in state.items()}
    case = {"ids": ids, "positions": MODEL_POSITIONS, "logits": out.logits.numpy(),
            "block_in": out.hidden_states[0].numpy(), "block_out": out.hidden_states[1].numpy(),
            "expected_config_json": np.frombuffer(json.dumps(shape.model_kwargs(), sort_keys=True).encode(),
                                                  np.uint8).copy(),
            **{f"param.{k}": np.ascontiguousarray(v) for k, v in params.items()}}

    def outputs(g):
        model = g.LlamaModel(**shape.model_kwargs(), rng=np.random.default_rng(0))
        model.load_state_dict(params)
        block = model.layers[0]
        return {"logits": model(ids, MODEL_POSITIONS), "block_out": block(case["block_in"], MODEL_POSITIONS)}

    mine = outputs(ll)
    assert np.allclose(mine["logits"], case["logits"], atol=1e-4), "positions: the reference differs from HuggingFace"
    assert np.allclose(mine["block_out"], case["block_out"], atol=1e-4), "positions: the first block differs"
    return {**case, **diagnoses(LAB, "positions", case, outputs, "llama")}, state


def _eos_case(ll, state, rng):
    """Greedy generate() with an EOS that every row, some rows or no row emits."""
    import torch

    shape = POSITIONS_SHAPE
    hf = hf_llama(state, shape)
    model = ll.LlamaModel(**shape.model_kwargs(), rng=np.random.default_rng(0))
    model.load_state_dict({ll.model_name(k): ll.to_model_layout(ll.model_name(k), v) for k, v in state.items()})

    def hf_generate(prompt, eos):
        p = torch.from_numpy(prompt)
        with torch.no_grad():
            return hf.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=EOS_NEW_TOKENS, do_sample=False,
                               eos_token_id=eos, pad_token_id=eos).numpy()

    for _ in range(200):  # prompts until one has EOS ids for all three situations
        prompt = rng.integers(0, shape.vocab_size, (3, EOS_PROMPT_LEN))
        eos = eos_choices(ll.generate(model, prompt, EOS_NEW_TOKENS)[:, EOS_PROMPT_LEN:])
        if eos:
            break
    else:
        raise AssertionError("eos: no prompt gives an EOS for all, some and no rows")
    case = {"prompt": prompt, **{f"eos_{k}": np.int64(v) for k, v in eos.items()},
            **{f"tokens_{k}": hf_generate(prompt, v) for k, v in eos.items()}}

    def outputs(g):
        return {f"tokens_{k}": g.generate(model, prompt, EOS_NEW_TOKENS, eos_token_id=v) for k, v in eos.items()}

    for key, value in outputs(ll).items():
        assert np.array_equal(value, case[key]), f"eos: the reference's {key} differs from HuggingFace's"
    for k, v in eos.items():
        assert np.array_equal(ll.generate(model, prompt, EOS_NEW_TOKENS, eos_token_id=v, use_cache=False),
                              case[f"tokens_{k}"]), f"eos: generate(use_cache=False) differs ({k})"
    return {**case, **diagnoses(LAB, "eos", case, outputs, "llama")}


def build() -> dict[str, dict[str, np.ndarray]]:
    import llama as ll

    rng = np.random.default_rng(808)
    cases = {"rope": _rope_case(ll, rng), "rmsnorm": _rmsnorm_case(ll, rng), "swiglu": _swiglu_case(ll, rng),
             "gqa": _gqa_case(ll, rng)}
    for name in SHAPES:
        cases[name] = _checkpoint_case(ll, name, rng)
    for name in SHAPES:
        cases[f"{name}_trace"] = _trace_case(ll, cases[name])
    whole = np.random.default_rng(818)
    cases["positions"], state = _positions_case(ll, whole)
    cases["eos"] = _eos_case(ll, state, whole)
    return cases
