"""Hidden checks for lab 03: numerically hard inputs."""

import numpy as np

from gptkit.testing import assert_close, lab

L = lab("layers")


def test_layernorm_with_a_large_common_offset():
    # mean(x²) - mean(x)² cancels catastrophically here; (x - mean)² does not.
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(4, 64)) + 3000.0).astype(np.float32)
    ln = L.LayerNorm(64)
    xd = x.astype(np.float64)
    expected = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5)
    assert_close(ln(x), expected, what="LayerNorm of values near 3000", atol=2e-3, rtol=2e-3)


def test_linear_on_many_leading_dimensions():
    rng = np.random.default_rng(6)
    lin = L.Linear(5, 3, rng=rng)
    weight, bias = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    lin.weight, lin.bias = weight.copy(), bias.copy()
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    expected = x @ weight + bias  # from the test's own arrays, before the call
    assert_close(lin(x.copy()), expected, what="Linear on (2, 3, 4, 5) input")
