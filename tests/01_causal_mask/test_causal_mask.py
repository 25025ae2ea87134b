"""Lab 01 · the causal mask, softmax, scaled dot-product attention, self-attention."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptkit.testing import (arguments_written_back, assert_causal, assert_close, assert_float32, assert_ndarray, assert_rejects_bad_x, lab,
                            load_fixture, raises_clearly)

cm = lab("causal_mask")
LAB = "01_causal_mask"


# --- the causal mask ---------------------------------------------------------------

@pytest.mark.parametrize("T,S", [(1, 1), (4, 4), (5, 5), (3, 7), (1, 6)])
def test_causal_mask_matches_reference(T, S):
    expected = load_fixture(LAB, f"mask_T{T}_S{S}")["mask"]
    mask = assert_ndarray(cm.causal_mask(T, S), f"causal_mask({T}, {S})", dtype=bool, shape=(T, S))
    wrong = np.argwhere(mask != expected)
    if len(wrong):
        i, j = (int(v) for v in wrong[0])
        pos = S - T + i
        why = ("which is in the future" if j > pos else "which is in its past or its own position")
        raise AssertionError(
            f"causal_mask({T}, {S}): {len(wrong)} of {mask.size} entries wrong; e.g. row {i} "
            f"(query at position {pos}) {'may' if mask[i, j] else 'may not'} attend to key {j}, {why}"
        )


def _mask_rows(T, extra):
    """causal_mask(T, T + extra) row by row: (where, pos, row), pos being query i's absolute
    position S - T + i and `where` how a failure names the row."""
    S = T + extra
    mask = assert_ndarray(cm.causal_mask(T, S), f"causal_mask({T}, {S})", dtype=bool, shape=(T, S))
    for i in range(T):
        pos = S - T + i
        yield f"causal_mask({T}, {S}): row {i} (position {pos})", pos, mask[i]


@given(T=st.integers(1, 12), extra=st.integers(0, 6))
def test_no_query_sees_the_future(T, extra):
    for where, pos, row in _mask_rows(T, extra):
        future = np.flatnonzero(row[pos + 1:])
        assert not len(future), f"{where} may attend to position {pos + 1 + int(future[0])}, which is in the future"


@given(T=st.integers(1, 12), extra=st.integers(0, 6))
def test_every_query_sees_its_past_and_itself(T, extra):
    for where, pos, row in _mask_rows(T, extra):
        blocked = np.flatnonzero(~row[: pos + 1])
        assert not len(blocked), (f"{where} may not attend to position {int(blocked[0])}; a query must see "
                                  "every earlier position and itself (the diagonal)")


def test_causal_mask_rejects_bad_lengths():
    assert_ndarray(cm.causal_mask(2), "causal_mask(2)", dtype=bool, shape=(2, 2))
    with raises_clearly(ValueError, when="causal_mask(5, kv_len=3): fewer keys than queries", mentions="kv_len"):
        cm.causal_mask(5, 3)
    with raises_clearly(ValueError, when="causal_mask(0)"):
        cm.causal_mask(0)
    with raises_clearly(TypeError, when="causal_mask(2.5)"):
        cm.causal_mask(2.5)


def test_additive_mask_is_zero_or_minus_infinity():
    mask = np.array([[True, False, False], [True, True, False]])
    add = assert_ndarray(cm.additive_mask(mask.copy()), "additive_mask(mask)", dtype=np.float32, shape=mask.shape)
    assert np.all(add[mask] == 0), "additive_mask must be 0 where attention is allowed (True)"
    assert np.all(np.isneginf(add[~mask])), (
        "additive_mask must be -inf where attention is blocked (False), so softmax gives it weight exactly 0"
    )
    assert_ndarray(cm.additive_mask(mask.copy(), dtype=np.float64), "additive_mask(mask, dtype=np.float64)",
                   dtype=np.float64)
    with raises_clearly(TypeError, when="additive_mask of a float array", mentions="bool"):
        cm.additive_mask(np.ones((2, 2)))


# --- softmax -------------------------------------------------------------------------

def _axis_probes(x: np.ndarray, asked: int) -> dict[str, np.ndarray]:
    """What a softmax over each other axis of ``x`` gives: a result that matches one names
    the axis the code normalised over, however it was written."""
    out = {}
    for axis in range(x.ndim):
        if axis != asked % x.ndim:
            e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
            out[f"a softmax over axis {axis} (of {x.ndim}) instead of axis {asked % x.ndim}: the sums along "
                f"axis {axis} are 1"] = e / e.sum(axis=axis, keepdims=True)
    return out


def _check_normalised_along(y, asked: int, what: str) -> None:
    """Name the axis a softmax normalised along when it is not the one asked for, however
    the values themselves came out (the max and the sum may have been taken along different axes)."""
    y = np.asarray(y, dtype=np.float64)
    if not np.isfinite(y).all():
        return
    asked %= y.ndim
    if np.allclose(y.sum(axis=asked), 1.0, atol=1e-4):
        return
    others = [a for a in range(y.ndim) if a != asked and np.allclose(y.sum(axis=a), 1.0, atol=1e-4)]
    raise AssertionError(
        f"{what}: the result does not sum to 1 along axis {asked}, the axis asked for"
        + (f"; it sums to 1 along axis {others[0]} instead" if others else "")
        + ": take the max and the sum of exponentials along `axis` (keepdims=True), not along a fixed axis")


def test_softmax_matches_reference():
    f = load_fixture(LAB, "softmax")
    x = f["x"].copy()
    y = cm.softmax(f["x"].copy())
    if np.shape(y) == x.shape:
        _check_normalised_along(y, -1, "softmax(x) over the last axis")
    assert_close(y, f["y_last"], what="softmax(x) over the last axis", diagnoses=_axis_probes(x, -1))
    y = cm.softmax(f["x"], axis=1)
    if np.shape(y) == x.shape:
        _check_normalised_along(y, 1, "softmax(x, axis=1)")
    assert_close(y, f["y_axis1"], what="softmax(x, axis=1)",
                 hint="softmax must normalise along the axis it is given", diagnoses=_axis_probes(x, 1))


@given(st.lists(st.floats(-50, 50), min_size=1, max_size=16), st.floats(-1e3, 1e3))
def test_softmax_rows_sum_to_one_and_ignore_shifts(row, shift):
    x = np.array([row, row], dtype=np.float32)
    y = assert_ndarray(cm.softmax(x.copy()), "softmax(x)", dtype=np.float32, shape=x.shape)
    assert_close(y.sum(axis=-1), np.ones(2, np.float32), what="softmax row sums", atol=1e-5,
                 hint="each row of softmax must sum to 1")
    with np.errstate(over="ignore", invalid="ignore"):
        shifted = cm.softmax(x + np.float32(shift))
    if np.isfinite(y).all() and not np.isfinite(np.asarray(shifted, dtype=np.float64)).all():
        raise AssertionError(
            f"softmax(x + {shift:.6g}) of scores up to {float(np.max(x + np.float32(shift))):.6g} gave NaN or inf "
            "where softmax(x) was finite: exp overflowed. Subtract each row's max before exponentiating (then every "
            "exponent is ≤ 0): softmax(x + c) must equal softmax(x)")
    assert_close(shifted, y, what="softmax(x + c)", atol=2e-5, rtol=2e-3,
                 hint="softmax(x + c) must equal softmax(x)")


def test_softmax_survives_huge_scores():
    x = np.array([[1000.0, 999.0, -1000.0], [1e4, 1e4, 0.0]], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = cm.softmax(x)
    expected = np.array([[0.7310586, 0.26894143, 0.0], [0.5, 0.5, 0.0]], dtype=np.float32)
    assert_close(y, expected, what="softmax of large scores",
                 hint="exp(1000) overflows to inf: subtract each row's max before exponentiating")


def test_softmax_gives_minus_infinity_zero_weight():
    x = np.array([[0.5, -np.inf, 1.5, -np.inf]], dtype=np.float32)
    y = cm.softmax(x)
    assert_close(y, np.array([[0.26894143, 0.0, 0.7310586, 0.0]], np.float32),
                 what="softmax with -inf entries", hint="-inf entries must get weight exactly 0")


def test_softmax_keeps_float32():
    x = np.random.default_rng(0).normal(size=(2, 5)).astype(np.float32)
    assert_float32(cm.softmax(x), "softmax(x)")


# --- scaled dot-product attention ------------------------------------------------------

def _naive(q, k, v, mask, scale, fill=-np.inf):
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        s = np.where(mask, s, fill)  # fill: what blocked scores become
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w


def test_attention_matches_reference():
    f = load_fixture(LAB, "sdpa")
    q, k, v, mask = f["q"], f["k"], f["v"], f["mask"]
    d = q.shape[-1]
    given = {"q": q.copy(), "k": k.copy(), "v": v.copy(), "mask": mask.copy()}
    with arguments_written_back():  # graded too, what the call does to its arguments shows here
        out, w = cm.scaled_dot_product_attention(given["q"], given["k"], given["v"], given["mask"])
    changed = [name for name, a in given.items() if not np.array_equal(a, f[name])]
    assert not changed, (
        f"scaled_dot_product_attention(q, k, v, mask) changed the arrays it was given ({', '.join(changed)}): "
        "compute the scores and weights into new arrays (`s = s / √d`, not `s /= √d` on an argument); the caller "
        "still needs its q, k, v and mask")
    assert_close(w, f["weights"], what="attention weights (causal, T=5 queries over S=7 keys)",
                 diagnoses={
                     "softmax(q·kᵀ) with no 1/√d scaling": _naive(q, k, v, mask, 1.0)[1],
                     "scores scaled by 1/d instead of 1/√d": _naive(q, k, v, mask, 1 / d)[1],
                     "scores multiplied by √d instead of divided by it (1/√d)": _naive(q, k, v, mask, math.sqrt(d))[1],
                     "blocked scores set to 0 instead of -inf: every future key still gets weight e⁰/Σ":
                         _naive(q, k, v, mask, 1 / math.sqrt(d), fill=0.0)[1],
                     "attention with the mask ignored": _naive(q, k, v, None, 1 / math.sqrt(d))[1],
                     "the mask applied after the softmax: blocked weights zeroed, so rows no longer sum to 1, "
                     "where the mask belongs before the softmax":
                         np.where(mask, _naive(q, k, v, None, 1 / math.sqrt(d))[1], 0.0),
                 },
                 hint="weights = softmax(q·kᵀ/√d with blocked scores set to -inf) along the keys")
    assert_close(out, f["out"], what="attention output", hint="out = weights @ v")


def test_attention_without_mask():
    f = load_fixture(LAB, "sdpa")
    out, w = cm.scaled_dot_product_attention(f["q"], f["k"], f["v"])
    assert_close(w, f["weights_nomask"], what="attention weights with mask=None",
                 hint="with no mask every query attends to every key")
    assert_close(out, f["out_nomask"], what="attention output with mask=None")


def test_masked_weights_are_zero_and_rows_sum_to_one():
    f = load_fixture(LAB, "sdpa")
    mask = f["mask"]
    _, w = cm.scaled_dot_product_attention(f["q"], f["k"], f["v"], mask.copy())
    w = assert_ndarray(w, "scaled_dot_product_attention (its weights)", dtype=np.float32, shape=f["weights"].shape)
    leaked = np.broadcast_to(~mask, w.shape) & (np.abs(w) > 1e-7)
    assert not leaked.any(), (
        f"{int(leaked.sum())} attention weights on blocked (future) keys are non-zero: "
        "apply the mask to the scores (as -inf) before the softmax"
    )
    assert_close(w.sum(-1), np.ones(w.shape[:-1], np.float32), what="attention weight row sums",
                 hint="each query's weights must sum to 1; masking after the softmax breaks this")


def test_attention_scale_uses_sqrt_of_head_width():
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(1, 4, 64)).astype(np.float32) for _ in range(3))
    expected = _naive(q, k, v, None, 1 / 8.0)[1].astype(np.float32)
    diagnoses = {"no scaling": _naive(q, k, v, None, 1.0)[1], "scaling by 1/d": _naive(q, k, v, None, 1 / 64)[1],
                 "scores multiplied by √d instead of divided by it (1/√d)": _naive(q, k, v, None, 8.0)[1]}
    _, w = cm.scaled_dot_product_attention(q.copy(), k.copy(), v.copy())
    assert_close(w, expected, what="attention weights for d=64", rtol=1e-3, diagnoses=diagnoses,
                 hint="divide the scores by √d = 8, where d is the width of q and k")


def test_attention_keeps_float32():
    f = load_fixture(LAB, "sdpa")
    out, w = cm.scaled_dot_product_attention(f["q"], f["k"], f["v"], f["mask"])
    assert_float32(out, "attention output")
    assert_float32(w, "attention weights")


def test_attention_rejects_mismatched_shapes():
    q = np.zeros((2, 3, 4), np.float32)
    out, _ = cm.scaled_dot_product_attention(q.copy(), q.copy(), q.copy())
    assert_ndarray(out, "scaled_dot_product_attention (its output, (..., T, d_v))", dtype=np.float32, shape=(2, 3, 4))
    with raises_clearly(ValueError, when="attention with q width 4 and k width 5", mentions="k"):
        cm.scaled_dot_product_attention(q, np.zeros((2, 3, 5), np.float32), q)
    with raises_clearly(ValueError, when="attention with a (4, 4) mask for (3, 3) scores", mentions="mask"):
        cm.scaled_dot_product_attention(q, q, q, np.ones((4, 4), bool))
    with raises_clearly(TypeError, when="attention with a float mask", mentions="bool"):
        cm.scaled_dot_product_attention(q, q, q, np.ones((3, 3)))


# --- single-head causal self-attention ----------------------------------------------------

def _self_attention():
    f = load_fixture(LAB, "self_attention")
    layer = cm.CausalSelfAttention(f["x"].shape[-1], rng=np.random.default_rng(0))
    for name in ("W_q", "W_k", "W_v", "W_o"):
        setattr(layer, name, f[name])
    return layer, f


def test_self_attention_matches_reference():
    layer, f = _self_attention()
    out, w = layer(f["x"])
    w_arr = assert_ndarray(w, "CausalSelfAttention (its weights)", dtype=np.float32)
    if w_arr.shape == f["weights"].shape and np.any(np.triu(w_arr != 0, 1)):  # says more than a count would
        b, i, j = (int(n) for n in np.argwhere(np.triu(w_arr != 0, 1))[0])
        raise AssertionError(f"CausalSelfAttention weights (B, T, T): in batch row {b}, position {i} attends to "
                             f"position {j} (weight {float(w_arr[b, i, j]):.3g}), which is in the future: apply "
                             "the causal mask to the scores before the softmax")
    x, T = f["x"].astype(np.float64), f["x"].shape[1]
    causal = np.tril(np.ones((T, T), bool))

    def attend(W_q, W_k, W_v):
        return _naive(x @ W_q, x @ W_k, x @ W_v, causal, 1 / math.sqrt(x.shape[-1]))

    Wq, Wk, Wv, Wo = (f[n].astype(np.float64) for n in ("W_q", "W_k", "W_v", "W_o"))
    assert_close(w, f["weights"], what="CausalSelfAttention weights (B, T, T)",
                 diagnoses={"keys made with W_q instead of W_k (k = x @ W_q)": attend(Wq, Wq, Wv)[1],
                            "queries made with W_k instead of W_q (q = x @ W_k)": attend(Wk, Wk, Wv)[1],
                            "queries and keys swapped (x @ W_k as q, x @ W_q as k)": attend(Wk, Wq, Wv)[1]},
                 hint="q = x @ W_q, k = x @ W_k, v = x @ W_v, then causal scaled dot-product attention")
    assert_close(out, f["out"], what="CausalSelfAttention output",
                 diagnoses={"the attention output without the output projection W_o": attend(Wq, Wk, Wv)[0],
                            "values made with W_k instead of W_v (v = x @ W_k)": attend(Wq, Wk, Wk)[0] @ Wo},
                 hint="the attention output goes through the output projection: out @ W_o")
    assert_float32(out, "CausalSelfAttention output")


@given(st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_self_attention_is_causal(t, seed):
    layer, f = _self_attention()
    assert_causal(lambda x: layer(x)[0], f["x"], t, lambda shape: np.random.default_rng(seed).normal(size=shape),
                  what="outputs")


def test_self_attention_rejects_wrong_width():
    layer, f = _self_attention()
    layer(f["x"])
    assert_rejects_bad_x(layer, "CausalSelfAttention(12)", 12, 5)
