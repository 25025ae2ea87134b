"""Hidden checks for lab 01: other shapes and seeds than the public tests."""

import math

import numpy as np
import pytest

from gptkit.testing import assert_close, assert_ndarray, lab

cm = lab("causal_mask")


@pytest.mark.parametrize("T,S", [(2, 9), (8, 8), (16, 20)])
def test_mask_is_lower_triangle_shifted_by_s_minus_t(T, S):
    expected = np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)
    mask = assert_ndarray(cm.causal_mask(T, S), f"causal_mask({T}, {S})", dtype=bool, shape=(T, S))
    assert np.array_equal(mask, expected), f"causal_mask({T}, {S}) is wrong"


def test_attention_on_four_dimensional_batches():
    rng = np.random.default_rng(2024)
    q, k, v = (rng.normal(0, 2, (3, 2, 6, 32)).astype(np.float32) for _ in range(3))
    mask = assert_ndarray(cm.causal_mask(6), "causal_mask(6)", dtype=bool, shape=(6, 6))
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / math.sqrt(32)
    s = np.where(mask, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    expected = w @ v
    out, weights = cm.scaled_dot_product_attention(q.copy(), k.copy(), v.copy(), mask.copy())
    assert_close(weights, w, what="attention weights", atol=1e-5, rtol=1e-4)
    assert_close(out, expected, what="attention output", atol=1e-4, rtol=1e-4)


def test_softmax_of_extreme_rows():
    x = np.array([[3e4, -3e4, 0.0], [-1e30, -1e30, -1e30]], dtype=np.float32)
    assert_close(cm.softmax(x.copy()), np.array([[1, 0, 0], [1 / 3, 1 / 3, 1 / 3]], np.float32),
                 what="softmax of extreme rows", atol=1e-6)
