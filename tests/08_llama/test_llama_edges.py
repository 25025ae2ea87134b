"""Lab 08 · edge cases: rotary frequencies and angles in float64, as the README states
(float32 angles drift visibly at long positions), token 0 as the end-of-sequence token, and RMSNorm of float16 input."""

import json

import numpy as np

from gptkit.state import state_diff
from gptkit.testing import assert_close, fixture_params, lab, load_fixture

L = lab("llama")
LAB = "08_llama"


def test_rope_frequencies_are_float64():
    got = np.asarray(L.rope_frequencies(64, 500000.0))
    assert got.dtype == np.float64, (
        f"rope_frequencies(64, base=500000.0) returned {got.dtype}: θ_i = base^(−2i/d) is float64, computed in float64 "
        "(arange in float64, the base a Python float)")
    expected = 500000.0 ** (-np.arange(0, 64, 2, dtype=np.float64) / 64)
    assert_close(got, expected, what="rope_frequencies(64, base=500000.0) against base^(−2i/d) in float64", atol=0,
                 rtol=1e-12, hint="θ_i = base^(−2i/d) computed in float64 throughout")


def test_rope_angles_are_computed_in_float64_at_long_positions():
    positions = np.array([0, 1, 4095, 65_535, 500_000])
    d = 64
    theta = 10000.0 ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = positions.astype(np.float64)[:, None] * theta[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = L.rope_angles(positions, d)
    for name, got, want in (("cos", cos, np.cos(angles)), ("sin", sin, np.sin(angles))):
        got = np.asarray(got)
        if got.shape == want.shape:
            off = np.abs(got.astype(np.float64) - want).max(axis=1)  # per position
            if off[:2].max() <= 2e-6 < off[2:].max() < 0.5:
                raise AssertionError(
                    f"rope_angles at positions {positions.tolist()}: {name} is right at positions 0 and 1 but off by "
                    f"up to {off[2:].max():.2g} at {positions[2:].tolist()}: the error grows with the position, the "
                    "mark of angles computed in float32. Compute the angles m·θ_i in float64 and only their cos and "
                    "sin as float32: a float32 angle near 500,000 is off by up to 0.03 radians")
        assert_close(got, want.astype(np.float32), what=f"rope_angles at positions {positions.tolist()}: {name}",
                     atol=2e-6, rtol=0,
                     hint="compute the angles m·θ_i in float64 and only their cos and sin as float32: a float32 "
                          "angle near 500,000 is off by up to 0.03 radians (its spacing there)")


def test_generate_eos_token_id_0_is_an_eos():
    f = load_fixture(LAB, "gqa_untied")
    config = json.loads(f["expected_config_json"].tobytes())
    model = L.LlamaModel(**config, rng=np.random.default_rng(0))
    params = fixture_params(f)
    assert not state_diff(params, model.state_dict()), "LlamaModel's parameter names (see test_llama.py)"
    params = {k: np.array(v) for k, v in params.items()}
    params["norm.weight"] = np.zeros_like(params["norm.weight"])  # every logit 0: greedy takes the first, token 0
    model.load_state_dict(params)
    model.eval()
    prompt = np.array([[5, 6, 7], [8, 9, 10]])
    for use_cache in (True, False):
        out = np.asarray(L.generate(model, prompt, 5, eos_token_id=0, use_cache=use_cache))
        assert out.tolist() == [[5, 6, 7, 0], [8, 9, 10, 0]], (
            f"greedy generate(eos_token_id=0, use_cache={use_cache}) with a model whose logits are all 0 (the argmax "
            f"is token 0): expected [[5, 6, 7, 0], [8, 9, 10, 0]], both rows ending at once, got {out.tolist()}: "
            "eos_token_id=0 is token 0, an EOS like any other: test `eos_token_id is not None`, not its truth value")


def test_rmsnorm_of_float16_input_squares_in_float32():
    rng = np.random.default_rng(808)
    scale = np.array([0.01, 1.0, 30.0, 300.0, 1000.0, 5.0, 2000.0, 60.0])  # rows whose x² overflows float16 (> 65504)
    x = (rng.normal(0, 1, (2, 3, 8)) * scale).astype(np.float16)
    norm = L.RMSNorm(8, eps=1e-6)
    norm.weight = rng.normal(1.0, 0.3, 8).astype(np.float32)
    got = np.asarray(norm(x))
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-6) * norm.weight
    if got.shape == want.shape and not (np.isfinite(got).all() and np.abs(got).max(axis=-1).min() > 0.1):
        raise AssertionError(
            "RMSNorm of float16 input (values up to ~5000): some rows came out as 0, NaN or infinite. In float16, x² "
            "is infinite above 256 (float16's largest value is 65504), so the mean of squares overflowed: convert x "
            "to float32 before squaring (the statistics are computed in float32)")
    assert got.dtype == np.result_type(x, norm.weight), (
        f"RMSNorm of float16 input with a float32 gain returned {got.dtype}: the output has the dtype NumPy gives "
        "x · weight, float32 here (as HuggingFace's LlamaRMSNorm)")
    assert_close(got, want.astype(np.float32), what="RMSNorm of float16 input (statistics in float32)", atol=1e-5,
                 rtol=2e-3, hint="x / sqrt(mean(x²) + eps) · weight, with x converted to float32 before squaring")
