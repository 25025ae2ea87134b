"""Lab 08 · edge cases: rotary frequencies and angles in float64, as the README states
(float32 angles drift visibly at long positions), and token 0 as the end-of-sequence token."""

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
