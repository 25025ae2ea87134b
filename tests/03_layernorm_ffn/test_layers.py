"""Lab 03 · Linear, LayerNorm, GELU, Dropout, FeedForward."""

import math

import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gptkit.testing import assert_close, assert_float32, assert_ndarray, lab, load_fixture, raises_clearly

L = lab("layers")
LAB = "03_layernorm_ffn"


# --- Linear ------------------------------------------------------------------------------

def _linear(bias=True):
    f = load_fixture(LAB, "linear")
    lin = L.Linear(6, 4, bias=bias, rng=np.random.default_rng(0))
    lin.weight = f["weight"].copy()  # lab code gets copies: the test's own arrays stay as stored
    if bias:
        lin.bias = f["bias"].copy()
    return lin, f


def test_linear_matches_reference():
    lin, f = _linear()
    y = lin(f["x"])
    assert_close(y, f["y"], what="Linear(x) for x (2, 3, 6), weight (6, 4)",
                 diagnoses={"x @ weight without the bias": f["y_nobias"]},
                 hint="y = x @ weight + bias, with weight stored (d_in, d_out) as in GPT-2's checkpoint")
    assert_float32(y, "Linear output")


def test_linear_without_bias():
    lin, f = _linear(bias=False)
    assert lin.bias is None, "Linear(..., bias=False) must set bias to None"
    assert_close(lin(f["x"]), f["y_nobias"], what="Linear(x) with bias=False")


def test_linear_rejects_wrong_width():
    lin, f = _linear()
    lin(f["x"])
    with raises_clearly(ValueError, when="Linear(6, 4) on x of width 4", mentions="last dimension 6"):
        lin(np.zeros((2, 4), np.float32))


# --- LayerNorm ------------------------------------------------------------------------------

def _layernorm(eps=1e-5):
    f = load_fixture(LAB, "layernorm")
    ln = L.LayerNorm(8, eps=eps)
    ln.weight, ln.bias = f["weight"].copy(), f["bias"].copy()
    return ln, f


def _ln_variants(x, w, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    return {
        "the unbiased variance (divided by D-1)": (x - mu) / np.sqrt(x.var(-1, ddof=1, keepdims=True) + eps) * w + b,
        "eps added outside the square root": (x - mu) / (np.sqrt(x.var(-1, keepdims=True)) + eps) * w + b,
        "normalisation without gain and shift": (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps),
        "the gain without the shift (+ bias missing)": (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * w,
        "the shift without the gain (· weight missing)": (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) + b,
        "a LayerNorm without eps, (x − mean) / √var: eps goes inside the square root":
            (x - mu) / np.sqrt(x.var(-1, keepdims=True)) * w + b,
        "the unbiased variance (divided by D-1) with eps outside the square root":
            (x - mu) / (np.sqrt(x.var(-1, ddof=1, keepdims=True)) + eps) * w + b,
    }


def test_layernorm_matches_reference():
    ln, f = _layernorm()
    y = ln(f["x"].copy())
    assert_close(y, f["y"], what="LayerNorm(x) with random gain and shift",
                 diagnoses=_ln_variants(f["x"], f["weight"], f["bias"], 1e-5),
                 hint="y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis, "
                      "with the biased variance (divide by D)")
    assert_float32(y, "LayerNorm output")


def test_layernorm_eps_inside_the_square_root():
    ln, f = _layernorm(eps=1e-3)
    assert_close(ln(f["tiny"].copy()), f["y_tiny_eps1e-3"], what="LayerNorm of tiny-variance rows, eps=1e-3",
                 diagnoses=_ln_variants(f["tiny"], f["weight"], f["bias"], 1e-3),
                 hint="eps goes inside the square root: sqrt(var + eps)")


@given(arrays(np.float32, (3, 16), elements=st.floats(-100, 100, width=32)))
def test_layernorm_standardises_before_the_affine_part(x):
    x = x + np.linspace(0, 1, 16, dtype=np.float32)  # never a constant row
    ln = L.LayerNorm(16, eps=1e-12)
    y = assert_ndarray(ln(x), "LayerNorm(16)(x)", dtype=np.float32, shape=x.shape).astype(np.float64)
    assert_close(y.mean(-1), np.zeros(3), what="per-row mean of LayerNorm output (gain 1, shift 0)",
                 atol=1e-4, hint="subtract each row's mean over the last axis")
    assert_close(y.var(-1), np.ones(3), what="per-row variance of LayerNorm output (gain 1, shift 0)",
                 atol=2e-3, rtol=2e-3,
                 hint="LayerNorm's variance must be the biased one (divide by D, not D-1)")


def test_layernorm_rejects_wrong_width():
    ln, f = _layernorm()
    ln(f["x"])
    with raises_clearly(ValueError, when="LayerNorm(8) on x of width 7", mentions="last dimension 8"):
        ln(np.zeros((2, 7), np.float32))


# --- GELU --------------------------------------------------------------------------------------

def test_gelu_is_the_tanh_form():
    f = load_fixture(LAB, "gelu")
    x = f["x"]
    y = L.gelu(x.copy())
    assert_close(y, f["tanh"], what="gelu(x) for x in [-4, 4]", atol=2e-6, rtol=1e-5,
                 diagnoses={"the exact erf form: GPT-2 uses the tanh approximation here": f["exact"],
                            "ReLU": np.maximum(x, 0),
                            "the sigmoid approximation x·σ(1.702·x): GPT-2 uses the tanh approximation here":
                                np.float64(x) / (1 + np.exp(-1.702 * np.float64(x)))},
                 hint="gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))")
    assert_float32(y, "gelu output")


def test_gelu_exact_is_the_erf_form():
    f = load_fixture(LAB, "gelu")
    x = f["x"]
    y = L.gelu_exact(x.copy())
    assert_close(y, f["exact"], what="gelu_exact(x) for x in [-4, 4]", atol=2e-6, rtol=1e-5,
                 diagnoses={"the tanh approximation": f["tanh"], "ReLU": np.maximum(x, 0)},
                 hint="gelu_exact(x) = 0.5·x·(1 + erf(x/√2))")
    assert_float32(y, "gelu_exact output")


@given(st.floats(-6, 6))
def test_gelu_pointwise(v):
    x = np.array([v], dtype=np.float64)
    expected = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert_close(L.gelu(x.copy()), expected, what=f"gelu({v:.4g})", atol=1e-9, rtol=1e-7)
    assert_close(L.gelu_exact(x.copy()), 0.5 * x * (1 + scipy.special.erf(x / math.sqrt(2))),
                 what=f"gelu_exact({v:.4g})", atol=1e-9, rtol=1e-7)


# --- Dropout -------------------------------------------------------------------------------------

def _check_nothing_dropped(y, x, what: str) -> None:
    """Say that dropout acted in eval mode when it zeroed elements, whatever it did to the rest."""
    y = np.asarray(y)
    if y.shape == x.shape and np.issubdtype(y.dtype, np.number):
        zeroed = int(np.sum((y == 0) & (x != 0)))
        assert not zeroed, (f"{what} zeroed {zeroed} of {x.size} elements: dropout is active in eval mode; with "
                            "training=False it returns x unchanged (check self.training)")


def test_dropout_is_identity_in_eval_mode():
    x = np.random.default_rng(1).normal(size=(4, 50)).astype(np.float32)
    d = L.Dropout(0.5, rng=np.random.default_rng(0))
    assert d.training is False, "layers start in eval mode (training=False)"
    y = d(x.copy())
    _check_nothing_dropped(y, x, "Dropout(0.5) in eval mode")
    assert_close(y, x, what="Dropout(0.5) in eval mode", atol=0, rtol=0,
                 hint="dropout must do nothing in eval mode (training=False)")
    d.train()
    d(x.copy())
    d.eval()
    y = d(x.copy())
    _check_nothing_dropped(y, x, "Dropout(0.5) after .train() then .eval()")
    assert_close(y, x, what="Dropout(0.5) after .train() then .eval()", atol=0, rtol=0,
                 hint="dropout must do nothing in eval mode (training=False)")


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_in_training_zeroes_p_and_rescales(p):
    x = np.full((200, 500), 3.0, np.float32)
    d = L.Dropout(p, rng=np.random.default_rng(42)).train()
    y = assert_ndarray(d(x.copy()), f"Dropout({p}) in training", dtype=np.float32, shape=x.shape)
    assert_float32(y, "Dropout output in training")
    dropped = float(np.mean(y == 0))
    assert abs(dropped - p) < 0.01, (
        f"Dropout({p}) in training zeroed {dropped:.3f} of the elements; expected about {p} "
        "(each element is dropped with probability p)"
    )
    kept = y[y != 0]
    wrong = {"survivors left as they were, not scaled by 1/(1-p)": np.full_like(kept, 3.0)}
    if p != 0.5:  # at p = 0.5, 1/p is 1/(1-p) and p is 1 - p
        wrong["survivors scaled by 1/p instead of 1/(1-p)"] = np.full_like(kept, 3.0 / p)
        wrong["survivors scaled by p instead of 1/(1-p)"] = np.full_like(kept, 3.0 * p)
    wrong["survivors multiplied by (1-p) instead of divided by it: 1/(1-p)"] = np.full_like(kept, 3.0 * (1 - p))
    assert_close(kept, np.full_like(kept, 3.0 / (1 - p)), what=f"surviving elements of Dropout({p})", diagnoses=wrong,
                 hint="inverted dropout scales the survivors by 1/(1-p) so the expected value is unchanged")


def test_dropout_is_reproducible_with_a_seeded_generator():
    x = np.ones((8, 8), np.float32)
    a = assert_ndarray(L.Dropout(0.5, rng=np.random.default_rng(9)).train()(x.copy()), "Dropout(0.5) in training",
                       dtype=np.float32, shape=x.shape)
    b = assert_ndarray(L.Dropout(0.5, rng=np.random.default_rng(9)).train()(x.copy()), "Dropout(0.5) in training",
                       dtype=np.float32, shape=x.shape)
    assert np.array_equal(a, b), "two Dropout layers with identically seeded generators must drop the same elements"
    assert not np.array_equal(a, x), "Dropout(0.5) in training must drop something"


def test_dropout_probability_zero_and_bad_p():
    x = np.ones((3, 3), np.float32)
    assert_close(L.Dropout(0.0, rng=np.random.default_rng(0)).train()(x.copy()), x,
                 what="Dropout(0.0) in training", atol=0, rtol=0)
    with raises_clearly(ValueError, when="Dropout(1.5)", mentions="p"):
        L.Dropout(1.5)


# --- FeedForward ----------------------------------------------------------------------------------

def _feedforward(dropout=0.0):
    f = load_fixture(LAB, "feedforward")
    ff = L.FeedForward(6, 24, dropout=dropout, rng=np.random.default_rng(0))
    ff.c_fc.weight, ff.c_fc.bias = f["c_fc.weight"].copy(), f["c_fc.bias"].copy()
    ff.c_proj.weight, ff.c_proj.bias = f["c_proj.weight"].copy(), f["c_proj.bias"].copy()
    return ff, f


def test_feedforward_matches_reference():
    ff, f = _feedforward()
    x = f["x"]
    h = x.astype(np.float64) @ f["c_fc.weight"] + f["c_fc.bias"]
    proj = lambda a: a @ f["c_proj.weight"] + f["c_proj.bias"]  # noqa: E731
    y = ff(x.copy())
    assert_close(y, f["y"], what="FeedForward(x)",
                 diagnoses={"ReLU instead of GELU": proj(np.maximum(h, 0)),
                            "the exact (erf) GELU instead of GPT-2's tanh form":
                                proj(0.5 * h * (1 + scipy.special.erf(h / math.sqrt(2)))),
                            "no activation between the two Linear layers": proj(h)},
                 hint="FeedForward = c_proj(gelu(c_fc(x))), then dropout")
    assert_float32(y, "FeedForward output")


def test_feedforward_dropout_follows_train_and_eval():
    ff, f = _feedforward(dropout=0.5)
    x = f["x"]
    assert_close(ff(x.copy()), f["y"], what="FeedForward(dropout=0.5) in eval mode",
                 hint="in eval mode dropout is off: the output must be deterministic")
    ff.train()
    assert ff.dropout.training, "FeedForward.train() must put its dropout in training mode"
    y = assert_ndarray(ff(x.copy()), "FeedForward(dropout=0.5) in training", dtype=np.float32, shape=x.shape)
    zeros = float(np.mean(y == 0))
    assert zeros > 0.2, (
        f"FeedForward(dropout=0.5) in training mode zeroed only {zeros:.0%} of its outputs: "
        "apply dropout to the output of c_proj"
    )
    ff.eval()
    assert_close(ff(x.copy()), f["y"], what="FeedForward after .eval()")
