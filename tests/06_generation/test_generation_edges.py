"""Lab 06 · edge cases: token 0 as the end-of-sequence token, a loss that leaves the
ids it is given as they were, and log_softmax along an axis other than the last."""

import numpy as np

from gptkit.testing import assert_close, fixture_params, lab, load_fixture
from gptkit.testing.parameters import set_parameters

S = lab("generation")
G = lab("gpt")
LAB = "06_generation"
V, D, LAYERS, HEADS, L = 48, 16, 2, 2, 24  # the fixtures' model (d_head = 8)


def _model(state=None):
    f = load_fixture(LAB, "cache")
    model = G.GPTModel(V, D, LAYERS, HEADS, 4 * D, L, rng=np.random.default_rng(1))
    return set_parameters(model, state or fixture_params(f), f"GPTModel(vocab_size={V}, d_model={D})")


def _model_that_says_0():
    """The fixtures' model with its final LayerNorm's gain zeroed: every position's hidden state is the
    bias b, and token 0's embedding is 4·b, so token 0 has by far the highest logit everywhere."""
    state = {k: np.array(v) for k, v in fixture_params(load_fixture(LAB, "cache")).items()}
    b = np.random.default_rng(60).normal(size=D).astype(np.float32)
    state["ln_f.weight"], state["ln_f.bias"] = np.zeros(D, np.float32), b
    state["wte.weight"][0] = 4 * b
    return _model(state)


def test_generate_eos_token_id_0_is_an_eos():
    model = _model_that_says_0()
    prompt = np.array([[5, 6, 7], [8, 9, 10]])
    for use_cache in (True, False):
        out = np.asarray(S.generate(model, prompt, 6, temperature=0, eos_token_id=0, use_cache=use_cache))
        assert out.tolist() == [[5, 6, 7, 0], [8, 9, 10, 0]], (
            f"generate(temperature=0, eos_token_id=0, use_cache={use_cache}) with a model whose best token is "
            f"always 0: expected [[5, 6, 7, 0], [8, 9, 10, 0]] (both rows emit EOS at once, generation stops), got "
            f"{out.tolist()}: eos_token_id=0 is token 0, an EOS like any other: test `eos_token_id is not None`, "
            "not its truth value")


def test_next_token_loss_leaves_the_ids_unchanged():
    model = _model()
    ids = np.array([[3, 7, 1, 0, 0], [4, 4, 9, 2, 5]])
    before = ids.copy()
    S.next_token_loss(model, ids, pad_id=0)
    assert np.array_equal(ids, before), (
        f"next_token_loss changed the token ids it was given: {before.tolist()} became {ids.tolist()}. Shift by "
        "slicing (logits[:, :-1] against token_ids[:, 1:]), never in place: the caller still needs its ids")
    logits, targets = np.random.default_rng(61).normal(size=(2, 4, V)).astype(np.float32), ids[:, 1:]
    logits_before, targets_before = logits.copy(), targets.copy()
    S.cross_entropy(logits, targets, ignore_index=0)
    assert np.array_equal(logits, logits_before) and np.array_equal(targets, targets_before), (
        "cross_entropy changed the logits or targets it was given: compute into new arrays, never in place")


def test_log_softmax_along_the_first_axis():
    x = np.random.default_rng(62).normal(0, 4, (3, 4, 5)).astype(np.float32)
    x[1, 2, 3] = 3000.0  # large enough to overflow exp without the max subtracted
    x64 = x.astype(np.float64)
    for axis in (0, 1):
        got = np.asarray(S.log_softmax(x, axis=axis))
        peak = x64.max(axis=axis, keepdims=True)
        want = x64 - peak - np.log(np.exp(x64 - peak).sum(axis=axis, keepdims=True))
        if got.shape == x.shape and np.isfinite(got).all():
            totals = np.exp(got.astype(np.float64)).sum(axis=axis)
            assert np.allclose(totals, 1.0, atol=1e-4), (
                f"log_softmax(x, axis={axis}) of x {x.shape}: exp of the result must sum to 1 along axis {axis}, "
                f"it sums to values from {totals.min():.3g} to {totals.max():.3g}"
                + (" (it sums to 1 along the last axis instead)"
                   if np.allclose(np.exp(got.astype(np.float64)).sum(axis=-1), 1.0, atol=1e-4) else "")
                + f": the sum of exponentials runs along `axis`, not always the last one")
        with np.errstate(all="ignore"):
            last_peak = x64.max(axis=-1, keepdims=True)  # the max taken along the last axis whatever `axis` says
            wrong_peak = x64 - last_peak - np.log(np.exp(x64 - last_peak).sum(axis=axis, keepdims=True))
        assert_close(got, want.astype(np.float32), what=f"log_softmax(x, axis={axis}) of x {x.shape}", atol=1e-5,
                     rtol=1e-5, diagnoses={"the max taken along the last axis whatever `axis` says": wrong_peak},
                     hint=f"take the max and the sum of exponentials along axis={axis}, with keepdims=True")
        assert got.dtype == np.float32, f"log_softmax(x, axis={axis}) of float32 x returned {got.dtype}: keep float32"
