"""Lab 05 · reading GPT-2 checkpoints with NumPy alone, matching HuggingFace, greedy generation.

The checkpoints are real files written by HuggingFace (stored in the fixtures and put back
on disk here), so no test needs PyTorch.
"""

import json

import numpy as np
import pytest

from gptkit.testing import (arguments_written_back, assert_close, assert_float32, assert_ndarray, checkpoint_on_disk,
                            explains_errors, first_difference, fixture_params, lab, raises_clearly)
from gptkit.checkpoints import safetensors_bytes

W = lab("gpt2_weights")
LAB = "05_gpt2_weights"
CASES = ["hf_layout", "hub_layout", "half"]
LAYOUT = {"hf_layout": "save_pretrained's layout (transformer.-prefixed names)",
          "hub_layout": "the hub's layout (bare names, attn.bias mask buffers)",
          "half": "float16 weights and bfloat16 biases"}

C_PROJ_TRANSPOSED = ("attn.c_proj.weight transposed: GPT-2's Conv1D stores every weight (in, out), "
                     "exactly as Linear does, so nothing is transposed on loading (the square c_proj "
                     "is the one a transpose cannot break loudly)")
EXACT_GELU = "GPT-2 computed with the exact (erf) GELU: GPT-2 uses the tanh form (gelu_new)"
LENGTH_HINT = ("the first 8 bytes are the header length n, an unsigned 64-bit little-endian integer; "
               "the JSON header is the next n bytes")


# --- the safetensors format -------------------------------------------------------------------

def _file_bytes(tensors, **kw):
    return np.frombuffer(safetensors_bytes(tensors, {"format": "pt"}, **kw), dtype=np.uint8)


def test_parse_header_reads_the_length_then_the_json():
    buf = _file_bytes({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)})
    n = int(buf[:8].view("<u8")[0])
    with explains_errors("parse_header on a valid safetensors file", LENGTH_HINT):
        header, start = W.parse_header(buf)
    assert isinstance(header, dict), f"parse_header must return the header as a dict, got {type(header).__name__}"
    assert start == 8 + n, (
        f"parse_header: the data starts at byte 8 + n = {8 + n} (8 bytes of length, then n bytes of "
        f"header), got {start}")
    assert header.get("a") == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, (
        f"parse_header: tensor 'a' should be {{'dtype': 'F32', 'shape': [2, 3], 'data_offsets': [0, 24]}}, "
        f"got {header.get('a')}")
    assert header.get("__metadata__") == {"format": "pt"}, "parse_header must keep the __metadata__ entry"


def test_parse_header_length_is_little_endian():
    buf = _file_bytes({"w": np.zeros((3, 5), np.float32)})
    prefix = buf[: 8 + int(buf[:8].view("<u8")[0])]
    with explains_errors("parse_header on a valid safetensors file", LENGTH_HINT):
        header, start = W.parse_header(np.concatenate([prefix, np.zeros(64, np.uint8)]))
    assert start == prefix.size and header["w"]["shape"] == [3, 5], f"parse_header: {LENGTH_HINT}"


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_decode_tensor(dtype):
    rng = np.random.default_rng(3)
    values = rng.normal(size=(3, 4)).astype(np.float32)
    if dtype == "F32":
        raw, expected = values.astype("<f4").view(np.uint8).ravel(), values
    elif dtype == "F16":
        raw, expected = values.astype("<f2").view(np.uint8).ravel(), values.astype(np.float16).astype(np.float32)
    else:  # bfloat16: the top 16 bits of each float32
        top = (values.view(np.uint32) >> 16).astype("<u2")
        raw, expected = top.view(np.uint8).ravel(), (top.astype(np.uint32) << 16).view(np.float32)
    out = W.decode_tensor(raw.copy(), dtype, [3, 4])
    assert_float32(out, f"decode_tensor(..., {dtype!r})")
    bits = raw.view("<u2").astype(np.uint32)  # as if raw were bfloat16: read only for dtype BF16
    misplaced = {} if dtype != "BF16" else {"the bfloat16 bits put in the lower half of the float32 (bfloat16 is the upper half: shift left by "
                 "16)": bits.view(np.float32).reshape(3, 4),
                 **{f"the bfloat16 bits shifted left by {n} instead of 16: they are the float32's upper half":
                    (bits << n).view(np.float32).reshape(3, 4) for n in (8, 15, 17)},
                 "the bfloat16 bits read as float16: bfloat16 is the upper half of a float32, not a float16":
                    raw.view("<f2").astype(np.float32).reshape(3, 4)}
    assert_close(out, expected, what=f"decode_tensor of a {dtype} (3, 4) tensor", atol=0, rtol=0,
                 diagnoses=misplaced,
                 hint="view the bytes as the stored little-endian type, convert to float32, reshape")


def test_hub_name_maps_and_skips():
    cases = {
        "transformer.h.0.ln_1.weight": "h.0.ln_1.weight",
        "transformer.wte.weight": "wte.weight",
        "h.11.mlp.c_proj.bias": "h.11.mlp.c_proj.bias",
        "h.3.attn.c_attn.bias": "h.3.attn.c_attn.bias",
        "transformer.h.2.attn.c_attn.bias": "h.2.attn.c_attn.bias",
        "h.3.attn.bias": None,
        "transformer.h.0.attn.bias": None,
        "h.0.attn.masked_bias": None,
        "lm_head.weight": "lm_head.weight",
    }
    for stored, expected in cases.items():
        got = W.hub_name(stored)
        if got != expected:
            why = ("h.<i>.attn.bias and masked_bias are causal-mask buffers, not parameters: skip them (None)"
                   if expected is None else
                   "only the mask buffers are skipped; attn.c_attn.bias is a real parameter"
                   if "c_attn.bias" in stored else
                   "save_pretrained's names start with 'transformer.': strip it")
            raise AssertionError(f"hub_name({stored!r}) should be {expected!r}, got {got!r}: {why}")


# --- reading a whole checkpoint -------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_read_checkpoint(tmp_path, case):
    folder, f = checkpoint_on_disk(tmp_path, LAB, case)
    state = W.read_checkpoint(folder)
    expected = fixture_params(f)
    assert isinstance(state, dict), f"read_checkpoint must return a dict, got {type(state).__name__}"
    assert set(state) == set(expected), (
        f"read_checkpoint on {LAYOUT[case]}: names must be GPT-2's hub names; missing "
        f"{sorted(set(expected) - set(state))[:5]}, extra {sorted(set(state) - set(expected))[:5]}")
    for name, value in expected.items():
        assert_close(state[name], value, what=f"read_checkpoint: {name} from {LAYOUT[case]}", atol=0, rtol=0,
                     hint="tensor bytes are data_offsets counted from the end of the header (8 + n), "
                          "not from the start of the file")
        assert_float32(state[name], f"read_checkpoint: {name}")


def test_read_checkpoint_takes_the_file_or_its_folder(tmp_path):
    folder, f = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    a, b = W.read_checkpoint(folder), W.read_checkpoint(folder / "model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), (
        "read_checkpoint(folder) and read_checkpoint(folder / 'model.safetensors') must agree")


@pytest.mark.parametrize("case", CASES)
def test_read_config(tmp_path, case):
    folder, f = checkpoint_on_disk(tmp_path, LAB, case)
    expected = json.loads(f["expected_config_json"].tobytes())
    got = W.read_config(folder)
    assert isinstance(got, dict), f"read_config must return a dict, got {type(got).__name__}"
    wrong = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    extra = sorted(set(got) - set(expected))
    if wrong or extra:
        notes = []
        if "d_ff" in wrong:
            notes.append("n_inner is null in GPT-2's config, which means 4·n_embd")
        if "layer_norm_eps" in wrong:
            notes.append("layer_norm_eps comes from layer_norm_epsilon")
        raise AssertionError(
            f"read_config on {LAYOUT[case]}: wrong values (got, expected): {wrong}; extra keys {extra}"
            + (f" ({'; '.join(notes)})" if notes else ""))


# --- the model -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_load_gpt2_matches_huggingface(tmp_path, case):
    folder, f = checkpoint_on_disk(tmp_path, LAB, case)
    try:
        model = W.load_gpt2(folder)
    except ValueError as exc:
        if "mis-shaped" not in str(exc):
            raise
        raise AssertionError(f"load_gpt2 on the checkpoint in {LAYOUT[case]}: {exc}. A weight was transposed on "
                             "loading: GPT-2's Conv1D stores every weight (in, out), exactly as Linear does, so "
                             "nothing is transposed") from None
    assert not model.training, "load_gpt2 must return the model in eval mode (dropout off)"
    logits = model(f["ids"])
    assert_close(logits, f["logits"], what=f"logits of the checkpoint in {LAYOUT[case]} vs HuggingFace",
                 atol=1e-4, rtol=1e-4,
                 diagnoses={C_PROJ_TRANSPOSED: f["logits_c_proj_transposed"], EXACT_GELU: f["logits_exact_gelu"]},
                 locate=lambda: first_difference(model, f))
    assert_float32(logits, "logits")


@pytest.mark.parametrize("case", CASES)
def test_generate_greedy_matches_huggingface(tmp_path, case):
    folder, f = checkpoint_on_disk(tmp_path, LAB, case)
    model = W.load_gpt2(folder)
    prompt = f["prompt"].copy()
    with arguments_written_back():  # to see whether it changes the prompt
        out = W.generate_greedy(model, prompt, f["greedy"].shape[1] - prompt.shape[1])
    assert_ndarray(out, "generate_greedy (integer token ids, (B, T + n))", dtype="iu", shape=f["greedy"].shape)
    assert np.array_equal(prompt, f["prompt"]), "generate_greedy must not modify the caller's prompt"
    wrong = np.argwhere(out != f["greedy"])
    if len(wrong):
        b, t = (int(i) for i in wrong[0])
        raise AssertionError(
            f"generate_greedy differs from HuggingFace generate() (greedy) at row {b}, position {t}: "
            f"expected token {int(f['greedy'][b, t])}, got {int(out[b, t])}. Each new token is the argmax "
            "of the logits at the last position, then appended and fed back")


def test_generate_greedy_edge_cases(tmp_path):
    folder, f = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    model = W.load_gpt2(folder)
    prompt = f["prompt"]  # each f["prompt"] is a new copy: lab code never gets the test's own
    same = W.generate_greedy(model, f["prompt"], 0)
    assert np.array_equal(assert_ndarray(same, "generate_greedy(model, prompt, 0)", dtype="iu"), prompt), (
        "generate_greedy(model, prompt, 0) must return the prompt unchanged")
    one = W.generate_greedy(model, prompt[:1, :1].copy(), 3)
    assert_ndarray(one, "generate_greedy(model, prompt[:1, :1], 3): one token of prompt plus 3 new ones",
                   dtype="iu", shape=(1, 4))
    limit = model.max_seq_len
    with raises_clearly(ValueError, when=f"generating past max_seq_len={limit}", mentions="max_seq_len"):
        W.generate_greedy(model, prompt, limit)
    with raises_clearly(ValueError, when="generate_greedy with max_new_tokens=-1"):
        W.generate_greedy(model, prompt, -1)
    with raises_clearly(ValueError, when="generate_greedy on a 1-D prompt", mentions="dimensions"):
        W.generate_greedy(model, prompt[0], 2)


# --- bad checkpoints get clear errors ---------------------------------------------------------------

def test_not_a_safetensors_file(tmp_path):
    folder, _ = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    W.read_checkpoint(folder)
    bad = tmp_path / "notes.safetensors"
    bad.write_bytes(b"this is a text file, not a checkpoint at all\n" * 3)
    with raises_clearly(ValueError, when="read_checkpoint on a text file", mentions="safetensors"):
        W.read_checkpoint(bad)
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02")
    with raises_clearly(ValueError, when="read_checkpoint on a 2-byte file", mentions="safetensors"):
        W.read_checkpoint(tiny)


def test_truncated_checkpoint(tmp_path):
    folder, _ = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    W.read_checkpoint(folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) * 2 // 3])
    with raises_clearly(ValueError, when="read_checkpoint on a file cut short", mentions="truncated"):
        W.read_checkpoint(folder)


def test_checkpoint_missing_a_parameter(tmp_path):
    folder, f = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    W.read_checkpoint(folder)
    params = {("transformer." + k): v for k, v in fixture_params(f).items() if k != "h.1.ln_2.bias"}
    (folder / "model.safetensors").write_bytes(safetensors_bytes(params, {"format": "pt"}))
    with raises_clearly(ValueError, when="read_checkpoint without h.1.ln_2.bias", mentions="h.1.ln_2.bias"):
        W.read_checkpoint(folder)


def test_not_a_gpt2_checkpoint(tmp_path):
    folder, _ = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    W.read_checkpoint(folder)
    (folder / "model.safetensors").write_bytes(safetensors_bytes(
        {"bert.embeddings.word_embeddings.weight": np.zeros((4, 2), np.float32)}, {"format": "pt"}))
    with raises_clearly(ValueError, when="read_checkpoint on a BERT checkpoint", mentions="GPT-2"):
        W.read_checkpoint(folder)


def _rewrite_config(folder, f, change):
    """Replace the checkpoint's config.json by the stored one updated with change(stored)."""
    config = json.loads(f["config_json"].tobytes())
    (folder / "config.json").write_text(json.dumps({**config, **change(config)}))


def test_config_that_disagrees_with_the_weights(tmp_path):
    folder, f = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    W.load_gpt2(folder)
    _rewrite_config(folder, f, lambda config: {"n_embd": 2 * config["n_embd"]})
    with raises_clearly(ValueError, when="load_gpt2 with config.json's n_embd doubled", mentions="config"):
        W.load_gpt2(folder)


def test_config_of_another_model(tmp_path):
    folder, f = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    W.read_config(folder)
    _rewrite_config(folder, f, lambda config: {"model_type": "llama"})
    with raises_clearly(ValueError, when="read_config of a llama config.json", mentions="GPT-2"):
        W.read_config(folder)
    (folder / "config.json").write_text("{not json")
    with raises_clearly(ValueError, when="read_config of a broken config.json", mentions="JSON"):
        W.read_config(folder)


def test_folder_without_a_checkpoint(tmp_path):
    folder, _ = checkpoint_on_disk(tmp_path, LAB, "hf_layout")
    W.read_checkpoint(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "pytorch_model.bin").write_bytes(b"\0")
    with raises_clearly(FileNotFoundError, when="read_checkpoint on a folder with only pytorch_model.bin",
                        mentions="model.safetensors"):
        W.read_checkpoint(empty)
