"""Lab 06 · sampling, beam search, a KV cache, cross-entropy and perplexity.

Expected values are stored fixtures made by HuggingFace (``generate()``, its logits, its
loss, its top-k / top-p processors) and torch, so no test here needs PyTorch. Samplers are
checked statistically: many seeded draws, each token's frequency within five standard
deviations of its probability, and never a token whose probability must be 0.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptkit.testing import (arguments_written_back, assert_close, assert_float32, diagnosis_label, explains_errors,
                            first_difference, fixture_params, lab, load_fixture, raises_clearly, same_object,
                            shares_memory, stored_diagnoses)
from gptkit.testing.parameters import set_parameters

S = lab("generation")
G = lab("gpt")
LAB = "06_generation"
V, D, LAYERS, HEADS, L = 48, 16, 2, 2, 24  # the fixtures' model (d_head = 8)
DRAWS = 4000  # draws per row in the statistical tests

TEMPERATURE_IGNORED = ("the distribution at temperature 1: the temperature was applied after the softmax "
                       "(renormalising the probabilities cancels it) or not at all")
TEMPERATURE_MULTIPLIED = "logits multiplied by the temperature instead of divided by it"
UNFILTERED = ("the softmax of the unfiltered logits: the filtered logits must be the ones that go through "
              "the softmax")
K_OFF_BY_ONE = "top-k off by one (k+1 tokens kept)"
K_OFF_BY_ONE_FEWER = "top-k off by one (k-1 tokens kept)"
P_ONE_TOO_FEW = ("top-p keeping one token too few: the token whose probability takes the running total to p "
                 "or past it belongs to the nucleus")
P_BEFORE_T = "top-p applied before the temperature (the order is temperature, top-k, top-p)"
FIRST_ROW = "the first row's probabilities: every row must be drawn from its own row of logits"

# The catalogued mistakes of the KV cache, generate, beam search and the loss are named by
# the fixtures: each stores what a bug of solutions/06_generation/bugs.toml outputs on it,
# labelled with the bug's concept (stored_diagnoses).
OVERFLOW_HINT = "exp() overflows float32 above about 88: subtract each row's max before exponentiating"


# --- helpers ---------------------------------------------------------------------------------

def _model():
    """The student's GPTModel holding the fixtures' random GPT-2 (every parameter random)."""
    f = load_fixture(LAB, "cache")
    model = G.GPTModel(V, D, LAYERS, HEADS, 4 * D, L, rng=np.random.default_rng(1))
    return set_parameters(model, fixture_params(f), f"GPTModel(vocab_size={V}, d_model={D}, num_layers={LAYERS})")


def _scalar(x):
    """A stored scalar (fixtures keep them as 1-element arrays) as a 0-d array."""
    return np.asarray(x).reshape(())


def _probs(logits):
    z = np.asarray(logits, np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _assert_draws(draws, probs, what, diagnoses=None, hint=None):
    """Token frequencies in ``draws`` (N,) within 5 standard deviations of ``probs`` (V,), and
    no token drawn whose probability is 0. A failure names the diagnosis the draws fit."""
    __tracebackhide__ = True
    draws, probs = np.asarray(draws), np.asarray(probs, np.float64)
    n, vocab = draws.size, probs.size
    if draws.min() < 0 or draws.max() >= vocab:
        raise AssertionError(f"{what}: drew token id {int(draws.min() if draws.min() < 0 else draws.max())}, "
                             f"outside the vocabulary 0 … {vocab - 1}")
    freq = np.bincount(draws, minlength=vocab) / n

    def fits(p):
        p = np.asarray(p, np.float64)
        return not ((p == 0) & (freq > 0)).any() and bool(
            (np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1.5 / n).all())

    if fits(probs):
        return
    impossible = np.flatnonzero((probs == 0) & (freq > 0))
    if impossible.size:
        j = int(impossible[0])
        msg = f"{what}: drew token {j} in {freq[j]:.1%} of {n} draws, but its probability must be 0"
    else:
        z = np.abs(freq - probs) / np.sqrt(probs * (1 - probs) / n + 1e-12)
        j = int(np.argmax(z))
        msg = (f"{what}: token {j} came up in {freq[j]:.1%} of {n} draws; its probability is {probs[j]:.1%} "
               f"(that far off happens by chance less than once in a million)")
    label = next((lbl for lbl, p in (diagnoses or {}).items() if fits(p)), None)
    if label:
        msg += f". Your draws match {label}"
    if hint:
        msg += f". {hint}"
    raise AssertionError(msg)


def _assert_tokens(out, expected, what, diagnoses=None, hint=None):
    """Integer token arrays equal, shape included; a failure names the first difference."""
    __tracebackhide__ = True
    if not isinstance(out, np.ndarray):
        raise AssertionError(f"{what}: expected a NumPy array of token ids, got {type(out).__name__}")
    label = next((lbl for lbl, d in (diagnoses or {}).items()
                  if out.shape == d.shape and np.array_equal(out, d) and not np.array_equal(d, expected)), None)
    if out.shape != expected.shape:
        msg = f"{what}: expected shape {expected.shape}, got {out.shape}"
    elif np.array_equal(out, expected):
        return
    else:
        b, t = (int(i) for i in np.argwhere(out != expected)[0])
        msg = (f"{what}: {int((out != expected).sum())} of {out.size} tokens differ; the first at row {b}, "
               f"position {t}: expected {int(expected[b, t])}, got {int(out[b, t])}")
    if label:
        msg += f". Your result matches {label}"
    if hint:
        msg += f". {hint}"
    raise AssertionError(msg)


def _sample_rows(logits, **settings):
    """``DRAWS`` draws from each row of ``logits`` in one call of sample_next: (rows, DRAWS)."""
    batch = np.repeat(logits, DRAWS, axis=0)
    draws = S.sample_next(batch, rng=np.random.default_rng(7), **settings)
    assert isinstance(draws, np.ndarray) and draws.shape == (len(batch),), (
        f"sample_next on logits of shape {batch.shape} must return one token per row, shape ({len(batch)},); "
        f"got {getattr(draws, 'shape', type(draws).__name__)}")
    return draws.reshape(len(logits), DRAWS)


# --- temperature --------------------------------------------------------------------------------

def test_apply_temperature_matches_huggingface():
    f = load_fixture(LAB, "sampling")
    out = S.apply_temperature(f["logits"], 0.7)
    assert_close(out, f["hf_temperature_07"], what="apply_temperature(logits, 0.7) vs HuggingFace's temperature",
                 diagnoses={TEMPERATURE_MULTIPLIED: f["logits"] * np.float32(0.7)},
                 hint="the logits are divided by the temperature, before any softmax")
    assert_float32(out, "apply_temperature")


@given(st.integers(0, 2**32 - 1), st.floats(0.05, 5.0), st.floats(0.05, 5.0))
def test_lower_temperature_lowers_entropy(seed, t1, t2):
    logits = np.random.default_rng(seed).normal(0, 2, (3, 7)).astype(np.float32)

    def entropy(temperature):
        p = _probs(S.apply_temperature(logits, temperature))
        return -(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1)

    low, high = sorted((t1, t2))
    assert (entropy(low) <= entropy(high) + 1e-6).all(), (
        f"the distribution at temperature {low:.3g} has more entropy than at {high:.3g}: a temperature below "
        f"1 must sharpen the distribution (divide the logits by it; {TEMPERATURE_MULTIPLIED} does the opposite)")
    assert_close(S.apply_temperature(logits, 1.0), logits, what="apply_temperature(logits, 1.0)", atol=0, rtol=0,
                 hint="temperature 1 leaves the logits as they are")


def test_apply_temperature_rejects_bad_values():
    f = load_fixture(LAB, "sampling")
    S.apply_temperature(f["logits"], 0.7)
    with raises_clearly(ValueError, when="apply_temperature(logits, -1.0)", mentions="temperature"):
        S.apply_temperature(f["logits"], -1.0)
    with raises_clearly(ValueError, when="apply_temperature(logits, 0): 0 means greedy", mentions="greedy"):
        S.apply_temperature(f["logits"], 0)
    with raises_clearly(TypeError, when="apply_temperature(logits, 'hot')", mentions="temperature"):
        S.apply_temperature(f["logits"], "hot")


# --- top-k ----------------------------------------------------------------------------------------

def _check_kept(out, expected, what, *, filter_name):
    """``out`` must keep exactly the tokens ``expected`` keeps (finite), unchanged, and set the
    others to -inf."""
    __tracebackhide__ = True
    assert isinstance(out, np.ndarray) and out.shape == expected.shape, (
        f"{what}: expected shape {expected.shape}, got {getattr(out, 'shape', type(out).__name__)}")
    kept, want = np.isfinite(out), np.isfinite(expected)
    removed = out[~kept]
    if removed.size and not (removed == -np.inf).all():
        raise AssertionError(f"{what}: the removed tokens must be set to -inf (probability 0), got {removed[0]}")
    for row in range(len(out)):
        if (kept[row] == want[row]).all():
            continue
        got, need = int(kept[row].sum()), int(want[row].sum())
        msg = (f"{what}: row {row} keeps {got} token{'s' * (got != 1)} (ids {np.flatnonzero(kept[row]).tolist()}), "
               f"expected {need} (ids {np.flatnonzero(want[row]).tolist()})")
        if filter_name == "top-k" and got == need + 1:
            msg += f". Your result matches {K_OFF_BY_ONE}"
        elif filter_name == "top-k" and got == need - 1:
            msg += f". Your result matches {K_OFF_BY_ONE_FEWER}"
        elif filter_name == "top-p" and got == need - 1 and not (kept[row] & ~want[row]).any():
            msg += f". Your result matches {P_ONE_TOO_FEW}"
        raise AssertionError(msg)
    assert_close(out[kept], expected[kept], what=f"{what}: the kept logits", atol=0, rtol=0,
                 hint=f"{filter_name} leaves the logits it keeps unchanged")
    assert_float32(out, what)


def test_top_k_filter_matches_huggingface():
    f = load_fixture(LAB, "sampling")
    logits = f["logits"].copy()
    with arguments_written_back():  # to see whether it changes the logits
        out = S.top_k_filter(logits, 3)
    _check_kept(out, f["hf_top_k_3"], "top_k_filter(logits, 3) vs HuggingFace's top_k=3", filter_name="top-k")
    assert np.array_equal(logits, f["logits"]), "top_k_filter must not modify the caller's logits"


@given(st.integers(1, 12), st.integers(1, 15), st.integers(0, 2**32 - 1))
def test_top_k_keeps_exactly_the_k_largest(vocab, k, seed):
    rng = np.random.default_rng(seed)
    logits = (rng.permutation(vocab * 2)[:vocab] + rng.random(vocab) * 0.5).astype(np.float32)[None].repeat(2, 0)
    out = S.top_k_filter(logits, k)
    assert isinstance(out, np.ndarray) and out.shape == logits.shape, (
        f"top_k_filter must keep the logits' shape {logits.shape}, got {getattr(out, 'shape', type(out).__name__)}")
    kept = np.isfinite(out[0])
    n = min(k, vocab)
    if kept.sum() != n:
        hint = (K_OFF_BY_ONE if kept.sum() == n + 1 else K_OFF_BY_ONE_FEWER if kept.sum() == n - 1
                else "k ≥ V keeps every token" if k >= vocab else "keep exactly the k largest")
        raise AssertionError(f"top_k_filter(logits, k={k}) over V={vocab} distinct logits kept {int(kept.sum())} "
                             f"tokens, expected {n}: {hint}")
    assert logits[0, kept].min() > logits[0, ~kept].max(initial=-np.inf), (
        f"top_k_filter(logits, k={k}) must keep the k largest logits, not others")
    assert_float32(out, "top_k_filter")


def test_top_k_ties_and_k_at_least_v():
    f = load_fixture(LAB, "sampling")
    out = S.top_k_filter(f["ties"], 3)
    _check_kept(out, f["hf_ties_top_k_3"], "top_k_filter([[2, 1, 1, 3, 1, 0, -1, 1]], 3): every logit tied with the "
                "3rd largest (1.0) is kept, as in HuggingFace", filter_name="top-k")
    same = S.top_k_filter(f["logits"], 10)
    assert_close(same, f["logits"], what="top_k_filter with k = V = 10", atol=0, rtol=0,
                 hint="k ≥ V keeps every token")
    assert_close(S.top_k_filter(f["logits"], 50), f["logits"], what="top_k_filter with k = 50 > V = 10", atol=0,
                 rtol=0, hint="k ≥ V keeps every token")


# --- top-p ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.8, 0.5])
def test_top_p_filter_matches_huggingface(p):
    f = load_fixture(LAB, "sampling")
    out = S.top_p_filter(f["logits"], p)
    _check_kept(out, f[f"hf_top_p_0{int(p * 10)}"], f"top_p_filter(logits, {p}) vs HuggingFace's top_p={p}",
                filter_name="top-p")


@given(st.integers(1, 12), st.floats(0.01, 1.0), st.integers(0, 2**32 - 1))
def test_top_p_keeps_the_smallest_set_reaching_p(vocab, p, seed):
    logits = np.random.default_rng(seed).normal(0, 2, (2, vocab)).astype(np.float32)
    out = S.top_p_filter(logits, p)
    assert isinstance(out, np.ndarray) and out.shape == logits.shape, (
        f"top_p_filter must keep the logits' shape {logits.shape}, got {getattr(out, 'shape', type(out).__name__)}")
    probs = _probs(logits)
    for row in range(2):
        kept = np.isfinite(out[row])
        assert kept.any(), f"top_p_filter(logits, {p:.3g}) removed every token of row {row}: the most likely stays"
        mass = probs[row, kept].sum()
        if mass < p - 1e-5:
            raise AssertionError(
                f"top_p_filter(logits, {p:.3g}), row {row}: the kept tokens' probabilities sum to {mass:.4f} < p, "
                f"so the nucleus is too small (a common cause: {P_ONE_TOO_FEW})")
        if kept.sum() > 1 and mass - probs[row, kept].min() >= p + 1e-5:
            raise AssertionError(
                f"top_p_filter(logits, {p:.3g}) kept {int(kept.sum())} tokens (mass {mass:.4f}); without its least "
                f"likely one the rest still reach p: the nucleus is the smallest such set")
        if (~kept).any():
            assert probs[row, kept].min() >= probs[row, ~kept].max() - 1e-7, (
                f"top_p_filter(logits, {p:.3g}) must keep the most likely tokens, but kept a token less likely than "
                "one it removed")
    assert_float32(out, "top_p_filter")


def test_top_p_edge_cases():
    tiny_tail = np.array([[0.0, -20.0, -25.0, -30.0, -40.0, 1.0]], np.float32)  # float32 sums reach 1 early
    kept = np.isfinite(S.top_p_filter(tiny_tail, 1.0))
    assert kept.all(), (
        f"top_p_filter(logits, 1.0) removed tokens {np.flatnonzero(~kept).tolist()}: p = 1 keeps every token, "
        "even those whose probabilities are too small to change a float32 running total")
    kept = np.isfinite(S.top_p_filter(tiny_tail, 1e-6))
    assert kept.tolist() == [[False] * 5 + [True]], (
        f"top_p_filter(logits, 1e-6) must keep only the most likely token (5), kept {np.flatnonzero(kept).tolist()}")
    flat = np.zeros((1, 4), np.float32)  # four ties of probability 0.25
    for p, n in ((0.5, 2), (0.51, 3), (0.25, 1), (0.2, 1)):
        got = int(np.isfinite(S.top_p_filter(flat, p)).sum())
        assert got == n, (f"top_p_filter of four equally likely tokens with p={p} must keep {n} "
                          f"(the smallest set whose probabilities sum to ≥ p), kept {got}")


def test_top_p_ties_keep_the_higher_ids():
    # The README's rule (HuggingFace's): among equally likely tokens the higher id comes first.
    cases = [(np.zeros((1, 8), np.float32), 0.5, [4, 5, 6, 7], "8 equal logits"),
             # ids 1, 3 and 7 tie as the most likely (0.256 each): two of them reach p = 0.5
             (np.array([[0, 2, 0, 2, 0, 1, 0, 2]], np.float32), 0.5, [3, 7], "logits [0, 2, 0, 2, 0, 1, 0, 2]")]
    for logits, p, want, what in cases:
        kept = np.flatnonzero(np.isfinite(S.top_p_filter(logits, p))).tolist()
        if kept != want:
            hint = (". Among equally likely tokens the higher id comes first, as in HuggingFace "
                    "(np.argsort on the negated probabilities puts the lower id first)"
                    if len(kept) == len(want) else "")
            raise AssertionError(f"top_p_filter({what}, {p}) kept ids {kept}, expected {want}{hint}")


def test_filters_reject_bad_arguments():
    f = load_fixture(LAB, "sampling")
    S.top_k_filter(f["logits"], 2)
    S.top_p_filter(f["logits"], 0.9)
    with raises_clearly(ValueError, when="top_k_filter(logits, 0)", mentions="at least 1"):
        S.top_k_filter(f["logits"], 0)
    with raises_clearly(TypeError, when="top_k_filter(logits, 2.5)", mentions="int"):
        S.top_k_filter(f["logits"], 2.5)
    for p in (0.0, 1.5, -0.2):
        with raises_clearly(ValueError, when=f"top_p_filter(logits, {p})", mentions="(0, 1]"):
            S.top_p_filter(f["logits"], p)


# --- sample_next ----------------------------------------------------------------------------------

SETTINGS = {
    "t1": {"temperature": 1.0},
    "t05": {"temperature": 0.5},
    "t2": {"temperature": 2.0},
    "k3": {"top_k": 3},
    "p08": {"top_p": 0.8},
    "combo": {"temperature": 0.7, "top_k": 5, "top_p": 0.9},
}
DIAGNOSES = {"ignored": TEMPERATURE_IGNORED, "multiplied": TEMPERATURE_MULTIPLIED, "unfiltered": UNFILTERED,
             "k4": K_OFF_BY_ONE, "k2": K_OFF_BY_ONE_FEWER, "one_too_few": P_ONE_TOO_FEW, "p_before_t": P_BEFORE_T}


@pytest.mark.parametrize("setting", SETTINGS)
def test_sample_next_draws_from_the_right_distribution(setting):
    f = load_fixture(LAB, "sampling")
    draws = _sample_rows(f["logits"], **SETTINGS[setting])
    expected = f[f"probs_{setting}"]
    mistakes = {k[len(f"probs_{setting}_"):]: v for k, v in f.items() if k.startswith(f"probs_{setting}_")}
    args = ", ".join(f"{k}={v}" for k, v in SETTINGS[setting].items())
    for row in range(len(expected)):
        diagnoses = {DIAGNOSES[m]: p[row] for m, p in mistakes.items()}
        if row:
            diagnoses[FIRST_ROW] = expected[0]
        _assert_draws(draws[row], expected[row], f"sample_next({args}), row {row} of the batch",
                      diagnoses=diagnoses,
                      hint="temperature, then top-k, then top-p, then softmax, then one draw per row")


def test_top_k_never_emits_a_token_outside_the_k_best():
    f = load_fixture(LAB, "sampling")
    draws = _sample_rows(f["logits"], temperature=3.0, top_k=2)  # flattened: outsiders would be common
    for row, logits in enumerate(f["logits"]):
        best = set(np.argsort(-logits)[:2].tolist())
        outside = sorted(set(draws[row].tolist()) - best)
        assert not outside, (
            f"sample_next(top_k=2, temperature=3) emitted token(s) {outside} from row {row}, whose two best are "
            f"{sorted(best)}: a token outside the k best must never be drawn ({UNFILTERED}, or {K_OFF_BY_ONE})")


def test_top_p_never_emits_a_token_outside_the_nucleus():
    f = load_fixture(LAB, "sampling")
    draws = _sample_rows(f["logits"], top_p=0.5)
    for row, keep in enumerate(np.isfinite(f["hf_top_p_05"])):
        outside = sorted(set(draws[row].tolist()) - set(np.flatnonzero(keep).tolist()))
        assert not outside, (
            f"sample_next(top_p=0.5) emitted token(s) {outside} from row {row}, outside its nucleus "
            f"{np.flatnonzero(keep).tolist()} ({UNFILTERED})")


def test_temperature_zero_is_greedy():
    f = load_fixture(LAB, "sampling")
    ties = np.array([[1.0, 3.0, 3.0, 2.0, 0.0, 3.0, -1.0, 1.0, 0.5, 0.0]], np.float32)
    logits = np.concatenate([f["logits"], ties])
    expected = np.array([int(np.argmax(row)) for row in logits])
    for kwargs in ({}, {"top_k": 2}, {"top_p": 0.3}, {"rng": np.random.default_rng(0)}):
        out = S.sample_next(logits, temperature=0, **kwargs)
        assert isinstance(out, np.ndarray) and out.shape == (len(logits),), (
            f"sample_next(temperature=0) must return one token per row, shape ({len(logits)},); "
            f"got {getattr(out, 'shape', type(out).__name__)}")
        assert out.dtype == np.int64, f"sample_next must return int64 token ids, got {out.dtype}"
        assert out.tolist() == expected.tolist(), (
            f"sample_next(temperature=0{''.join(f', {k}=…' for k in kwargs)}) must be the argmax of each row "
            f"(greedy; the lowest id among ties, as np.argmax), {expected.tolist()}; got {out.tolist()}")


def test_sampling_is_seeded():
    f = load_fixture(LAB, "sampling")
    batch = np.repeat(f["logits"], 100, axis=0)
    a = S.sample_next(batch, temperature=1.5, rng=np.random.default_rng(123))
    b = S.sample_next(batch, temperature=1.5, rng=np.random.default_rng(123))
    c = S.sample_next(batch, temperature=1.5, rng=np.random.default_rng(124))
    assert isinstance(a, np.ndarray) and a.dtype == np.int64 and a.shape == (300,), (
        f"sample_next must return int64 (B,) token ids; got {getattr(a, 'dtype', type(a).__name__)} "
        f"{getattr(a, 'shape', '')}")
    assert np.array_equal(a, b), (
        "two calls with generators made from the same seed drew different tokens: every random number must "
        "come from the rng argument (not np.random's global functions), so a seed reproduces a sample")
    assert not np.array_equal(a, c), "generators with different seeds drew the same 300 tokens: is rng used at all?"
    d = S.sample_next(batch, temperature=1.5)  # rng=None: a fresh generator
    assert d.shape == (300,) and 0 <= d.min() and d.max() < 10, "sample_next without rng must still sample"


def test_sample_next_rejects_bad_input():
    f = load_fixture(LAB, "sampling")
    S.sample_next(f["logits"], rng=np.random.default_rng(0))
    with raises_clearly(ValueError, when="sample_next on 1-D logits", mentions="dimensions"):
        S.sample_next(f["logits"][0])
    with raises_clearly(ValueError, when="sample_next(temperature=-0.5)", mentions="temperature"):
        S.sample_next(f["logits"], temperature=-0.5)
    with raises_clearly(ValueError, when="sample_next(top_k=0)", mentions="at least 1"):
        S.sample_next(f["logits"], top_k=0)
    with raises_clearly(ValueError, when="sample_next(top_p=0)", mentions="(0, 1]"):
        S.sample_next(f["logits"], top_p=0.0)
    with raises_clearly(TypeError, when="sample_next(rng=42)", mentions="Generator"):
        S.sample_next(f["logits"], rng=42)


# --- log-softmax, cross-entropy ------------------------------------------------------------------

def test_log_softmax_matches_torch():
    f = load_fixture(LAB, "cross_entropy")
    out = S.log_softmax(f["logits"])
    assert_close(out, f["log_softmax"], what="log_softmax of logits (4, 5, 11) vs torch.log_softmax",
                 hint="log_softmax(x) = x - max - log(sum(exp(x - max)))")
    assert_float32(out, "log_softmax")


def test_log_softmax_of_large_scores():
    f = load_fixture(LAB, "cross_entropy")
    out = S.log_softmax(f["big"])
    assert_close(out, f["log_softmax_big"], what="log_softmax of logits around 3000 vs torch.log_softmax",
                 atol=1e-3, rtol=1e-5, hint=OVERFLOW_HINT)


def test_cross_entropy_matches_torch():
    f = load_fixture(LAB, "cross_entropy")
    loss = S.cross_entropy(f["logits"], f["targets"])
    assert_close(np.asarray(loss), _scalar(f["ce"]), what="cross_entropy(logits (4, 5, 11), targets (4, 5)) vs "
                 "torch.nn.functional.cross_entropy", hint="the mean over every token of -log softmax(logits)[target]")
    assert_float32(loss, "cross_entropy")
    with explains_errors("cross_entropy(..., ignore_index=-100)",
                         "targets equal to ignore_index are not token ids: leave them out before indexing"):
        loss = S.cross_entropy(f["logits"], f["targets_ignoring"], ignore_index=-100)
    z = np.float64(f["logits"])
    z = z - z.max(-1, keepdims=True)
    t = np.asarray(f["targets_ignoring"])
    valid = t != -100
    nll = -np.take_along_axis(z - np.log(np.exp(z).sum(-1, keepdims=True)), np.where(valid, t, 0)[..., None], -1)[..., 0]
    rows = valid.any(-1)
    averaged = {"each row's mean over its counted tokens, then the mean of the rows: the mean is over the counted "
                "tokens of all rows together (a row with more tokens counts more)":
                np.float64((np.where(valid, nll, 0).sum(-1)[rows] / valid.sum(-1)[rows]).mean()),
                "the ignored targets left out of the sum but counted in the mean's denominator: the mean is over "
                "the other tokens": np.float64(np.where(valid, nll, 0).sum() / t.size)}
    assert_close(np.asarray(loss), _scalar(f["ce_ignoring"]), what="cross_entropy(..., ignore_index=-100) vs torch",
                 diagnoses=averaged,
                 hint="targets equal to ignore_index count for nothing: the mean is over the other tokens")


def test_cross_entropy_of_large_logits():
    f = load_fixture(LAB, "cross_entropy")
    loss = S.cross_entropy(f["big"], f["targets"])
    assert_close(np.asarray(loss), _scalar(f["ce_big"]), what="cross_entropy of logits around 3000 vs torch",
                 atol=1e-2, rtol=1e-5, hint=OVERFLOW_HINT)


def test_every_token_weighs_the_same():
    f = load_fixture(LAB, "cross_entropy")
    logits, targets = f["logits"], f["targets_ignoring"]
    total = S.cross_entropy(logits, targets, ignore_index=-100)
    per_token = np.full(targets.shape, np.nan)
    for i, j in zip(*np.nonzero(targets != -100)):
        per_token[i, j] = S.cross_entropy(logits[i, j][None], targets[i, j][None])
    singles = per_token[targets != -100]
    row_means = np.nanmean(np.nanmean(per_token, axis=1))
    assert_close(np.asarray(total), np.float32(np.mean(singles)),
                 what="cross_entropy of a batch vs the mean of each token's own cross_entropy",
                 diagnoses={diagnosis_label(load_fixture(LAB, "loss"), "loss-mean-per-row"): np.float32(row_means)},
                 hint="average over the target tokens that are not ignored, all rows together")


def test_cross_entropy_of_uniform_logits_is_log_v():
    targets = np.array([[0, 5, 9], [3, 3, 1]])
    for value in (0.0, 100.0):
        loss = S.cross_entropy(np.full((2, 3, 10), value, np.float32), targets)
        assert abs(float(loss) - math.log(10)) < 1e-5, (
            f"cross_entropy of equal logits (all {value}) over V=10 must be log(10) = {math.log(10):.5f}, got "
            f"{float(loss):.5f}" + (f". {OVERFLOW_HINT}" if value else ""))


def test_cross_entropy_rejects_bad_input():
    f = load_fixture(LAB, "cross_entropy")
    S.cross_entropy(f["logits"], f["targets"])
    with raises_clearly(ValueError, when="cross_entropy with target 11 over V=11", mentions="vocabulary"):
        S.cross_entropy(f["logits"], np.full((4, 5), 11))
    with raises_clearly(ValueError, when="cross_entropy with targets (4, 4) for logits (4, 5, 11)", mentions="shape"):
        S.cross_entropy(f["logits"], f["targets"][:, :4])
    with raises_clearly(TypeError, when="cross_entropy with float targets", mentions="integer"):
        S.cross_entropy(f["logits"], f["targets"].astype(np.float32))
    with raises_clearly(ValueError, when="cross_entropy with every target ignored", mentions="ignored"):
        S.cross_entropy(f["logits"], np.full((4, 5), -100), ignore_index=-100)


# --- the language-model loss and perplexity -------------------------------------------------------

def test_next_token_loss_matches_huggingface():
    model = _model()
    f = load_fixture(LAB, "loss")
    loss = S.next_token_loss(model, f["full"])
    ids, logits = f["full"], np.float64(model(f["full"]))

    def ce(z, t):  # the mean cross-entropy of logits z against targets t
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return np.float64(-np.take_along_axis(logp, t[..., None], -1).mean())

    shifts = {"no shift: position t's logits scored against token t, where they predict token t + 1":
              ce(logits, ids),
              "the shift the wrong way round (logits[:, 1:] against token_ids[:, :-1])": ce(logits[:, 1:], ids[:, :-1]),
              "a shift by two (logits[:, :-2] against token_ids[:, 2:]): the logits at t score token t + 1":
              ce(logits[:, :-2], ids[:, 2:])}
    assert_close(np.asarray(loss), _scalar(f["loss_full"]), what="next_token_loss vs HuggingFace model(ids, labels=ids).loss",
                 diagnoses={**{label: _scalar(v) for label, v in stored_diagnoses(f, "loss_full").items()}, **shifts},
                 hint="cross_entropy(logits[:, :-1], token_ids[:, 1:])")
    assert_float32(loss, "next_token_loss")


def test_next_token_loss_ignores_padding():
    model = _model()
    f = load_fixture(LAB, "loss")
    loss = S.next_token_loss(model, f["padded"], pad_id=f["pad"].item())
    assert_close(np.asarray(loss), _scalar(f["loss_padded"]),
                 what="next_token_loss of rows of 10, 7 and 4 tokens right-padded with pad_id=47 vs HuggingFace "
                      "(labels -100 on the padding)",
                 diagnoses={label: _scalar(v) for label, v in stored_diagnoses(f, "loss_padded").items()},
                 hint="targets equal to pad_id are ignored, and the mean is over the remaining tokens")


def test_perplexity_is_the_exponential_of_the_loss():
    model = _model()
    f = load_fixture(LAB, "loss")
    ppl = S.perplexity(model, f["full"])
    assert_close(np.asarray(ppl), np.exp(_scalar(f["loss_full"])), what="perplexity vs exp(HuggingFace's loss)",
                 diagnoses={label: np.exp(_scalar(v)) for label, v in stored_diagnoses(f, "loss_full").items()},
                 hint="perplexity = exp(loss)")
    assert_float32(ppl, "perplexity")

    def know_nothing(ids):  # equal logits for every token
        return np.zeros((*np.shape(ids), 13), np.float32)

    ppl = S.perplexity(know_nothing, np.array([[1, 2, 3, 4], [0, 12, 5, 5]]))
    assert abs(float(ppl) - 13) < 1e-3, (
        f"a model with equal logits over V=13 tokens has perplexity 13, got {float(ppl):.4f}")


def test_loss_rejects_bad_input():
    model = _model()
    f = load_fixture(LAB, "loss")
    S.next_token_loss(model, f["full"])
    with raises_clearly(ValueError, when="next_token_loss on one token per row", mentions="at least 2"):
        S.next_token_loss(model, f["full"][:, :1])
    with raises_clearly(ValueError, when="next_token_loss on 1-D token ids", mentions="dimensions"):
        S.next_token_loss(model, f["full"][0])


# --- the KV cache ----------------------------------------------------------------------------------

def _cached_logits(model, f, cache):
    """Feed the fixture's 24 tokens in its chunks; returns (logits (3, 24, V), lengths after each call)."""
    outs, lengths, start = [], [], 0
    for n in f["chunks"].tolist():
        with explains_errors(f"forward_with_cache on tokens {start}…{start + n - 1} (cache.length={cache.length})",
                             "the new tokens' keys and values are stored at positions cache.length … and their "
                             "queries attend to every cached key"):
            outs.append(S.forward_with_cache(model, f["ids"][:, start : start + n], cache))
        lengths.append(cache.length)
        start += n
    return outs, lengths


def _locate(model, f):
    """Where cached logits first depart: in the model itself (the student's lab 04, whose
    first differing sub-layer is named) or, when its full forward pass matches, in the cache."""
    def where():
        full = model(f["ids"])
        if isinstance(full, np.ndarray) and full.shape == f["logits"].shape \
                and np.allclose(full, f["logits"], atol=1e-4, rtol=1e-4):
            return "the model's own forward pass matches, so the cache path differs"
        return first_difference(model, f) or "the model's own forward pass differs too (lab 04's GPTModel)"
    return where


def test_cached_logits_equal_the_full_forward_pass():
    model = _model()
    f = load_fixture(LAB, "cache")
    outs, lengths = _cached_logits(model, f, S.KVCache(model, 3))
    _check_lengths(lengths, f)  # a wrong length misplaces every later call: say so before the logits
    for out, n in zip(outs, f["chunks"].tolist()):
        assert isinstance(out, np.ndarray) and out.shape == (3, n, V), (
            f"forward_with_cache on (3, {n}) new tokens must return logits (3, {n}, {V}), got "
            f"{getattr(out, 'shape', type(out).__name__)}")
    logits = np.concatenate(outs, axis=1)
    chunks = ", ".join(map(str, f["chunks"].tolist()))
    assert_close(logits, f["logits"], what=f"logits of 24 tokens fed through the cache in pieces of {chunks} vs the "
                 "full forward pass (HuggingFace)", atol=1e-4,
                 diagnoses=stored_diagnoses(f, "logits"), locate=_locate(model, f),
                 hint="the largest difference's index is (row, position, token): the position tells which "
                      "call went wrong first when the earlier positions match")
    assert_float32(logits, "forward_with_cache logits")


def test_one_token_at_a_time_from_the_first():
    model = _model()
    f = load_fixture(LAB, "cache")
    cache = S.KVCache(model, 1)
    logits = np.concatenate([S.forward_with_cache(model, f["ids"][:1, t : t + 1], cache) for t in range(L)], axis=1)
    assert_close(logits, f["logits"][:1], what="logits of one row fed one token at a time, all 24 positions",
                 atol=1e-4, locate=_locate(model, f), hint="with T = 1 the new token's query sits at position cache.length and sees every key")


def test_cache_length_advances():
    model = _model()
    f = load_fixture(LAB, "cache")
    cache = S.KVCache(model, 3)
    assert cache.length == 0, "a new KVCache starts with length 0"
    _, lengths = _cached_logits(model, f, cache)
    _check_lengths(lengths, f)


def _check_lengths(lengths, f):
    """cache.length after each call of ``_cached_logits``: the number of tokens fed so far."""
    __tracebackhide__ = True
    expected = np.cumsum(f["chunks"]).tolist()
    assert lengths == expected, (
        f"after calls with {f['chunks'].tolist()} new tokens, cache.length must be {expected}; got {lengths}: "
        f"forward_with_cache must advance cache.length by T (once, after every block has stored its keys)")


def test_cache_stores_keys_and_values_in_its_buffers():
    model = _model()
    f = load_fixture(LAB, "cache")
    cache = S.KVCache(model, 3)
    buffers = [*cache.keys, *cache.values]
    n = int(f["chunks"][0])
    S.forward_with_cache(model, f["ids"][:, :n], cache)
    assert all(same_object(a, b) for a, b in zip(buffers, [*cache.keys, *cache.values])), (
        "forward_with_cache replaced the cache's buffers: they are allocated once (B, H, max_seq_len, d_head) "
        "and written in place")
    assert_close(cache.keys[0][:, :, :n], f["keys0"], what=f"cache.keys[0][:, :, :{n}] after a prompt of {n} tokens",
                 hint="the cache never stores the keys: KVCache.update must write block 0's keys of "
                      "positions 0 … T-1 into its buffer")
    assert_close(cache.values[1][:, :, :n], f["values1"], what=f"cache.values[1][:, :, :{n}]",
                 hint="the cache never stores the values: KVCache.update must write each block's values")


def test_update_writes_at_length_and_returns_views():
    model = _model()
    cache = S.KVCache(model, 2)
    rng = np.random.default_rng(3)
    k1, v1 = (rng.normal(size=(2, HEADS, 3, D // HEADS)).astype(np.float32) for _ in range(2))
    k2, v2 = (rng.normal(size=(2, HEADS, 2, D // HEADS)).astype(np.float32) for _ in range(2))
    keys, values = cache.update(1, k1, v1)
    assert cache.length == 0, "KVCache.update must not change length (forward_with_cache advances it once)"
    assert_close(keys, k1, what="the keys KVCache.update returns after storing 3 positions", atol=0, rtol=0,
                 hint="it returns everything stored for that block, positions 0 … length+T-1")
    cache.length = 3
    keys, values = cache.update(1, k2, v2)
    assert_close(keys, np.concatenate([k1, k2], axis=2), what="keys returned after storing 2 more at length=3",
                 atol=0, rtol=0, hint="the new keys go at positions length … length+T-1, after the cached ones")
    assert_close(values, np.concatenate([v1, v2], axis=2), what="values returned after storing 2 more", atol=0, rtol=0)
    assert shares_memory(keys, cache.keys[1]) and shares_memory(values, cache.values[1]), (
        "KVCache.update must return views of its buffers (slices), not copies")
    assert not cache.keys[0].any(), "KVCache.update(1, …) must only write block 1's buffers"


def test_reorder_moves_whole_rows():
    model = _model()
    cache = S.KVCache(model, 3)
    shape = (3, HEADS, 4, D // HEADS)
    k = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    for layer in range(LAYERS):
        cache.update(layer, k + layer, -k - layer)
    cache.length = 4
    cache.reorder(np.array([2, 0, 0]))
    for layer in range(LAYERS):
        assert_close(cache.keys[layer][:, :, :4], (k + layer)[[2, 0, 0]], what=f"cache.keys[{layer}] after "
                     "reorder([2, 0, 0])", atol=0, rtol=0, hint="row i must now hold what row rows[i] held")
        assert_close(cache.values[layer][:, :, :4], (-k - layer)[[2, 0, 0]],
                     what=f"cache.values[{layer}] after reorder([2, 0, 0])", atol=0, rtol=0)


def test_cache_refuses_to_go_past_max_seq_len():
    model = _model()
    f = load_fixture(LAB, "cache")
    cache = S.KVCache(model, 3)
    _cached_logits(model, f, cache)  # all 24 = max_seq_len positions
    with raises_clearly(ValueError, when="forward_with_cache on a 25th token with max_seq_len=24",
                        mentions="max_seq_len"):
        S.forward_with_cache(model, f["ids"][:, :1], cache)
    fresh = S.KVCache(model, 3)
    with raises_clearly(ValueError, when="forward_with_cache with 2 rows on a cache built for 3",
                        mentions="batch_size"):
        S.forward_with_cache(model, f["ids"][:2, :2], fresh)
    with raises_clearly(ValueError, when="forward_with_cache with token id 48 for V=48", mentions="vocabulary"):
        S.forward_with_cache(model, np.full((3, 1), V), fresh)


# --- generate -------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no cache"])
def test_greedy_generate_matches_huggingface(use_cache):
    model = _model()
    f = load_fixture(LAB, "greedy")
    prompt = f["prompt"].copy()
    n = f["greedy"].shape[1] - prompt.shape[1]
    with arguments_written_back():  # to see whether it changes the prompt
        out = S.generate(model, prompt, n, temperature=0, use_cache=use_cache)
    _assert_tokens(out, f["greedy"], f"generate(temperature=0, use_cache={use_cache}) vs HuggingFace generate() "
                   "(greedy)", hint="each new token is the argmax of the last position's logits")
    assert out.dtype == np.int64, f"generate must return int64 token ids, got {out.dtype}"
    assert np.array_equal(prompt, f["prompt"]), "generate must not modify the caller's prompt"


def test_greedy_generate_stops_at_eos():
    model = _model()
    f = load_fixture(LAB, "greedy")
    n = f["greedy"].shape[1] - f["prompt"].shape[1]
    eos = f["eos"].item()
    out = S.generate(model, f["prompt"], n, temperature=0, eos_token_id=eos)
    _assert_tokens(out, f["greedy_eos"],
                   f"generate(temperature=0, eos_token_id={eos}) vs HuggingFace generate(pad_token_id={eos})",
                   diagnoses=stored_diagnoses(f, "greedy_eos"),
                   hint="after a row emits EOS it only emits EOS, and generation stops once every row has")


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.5, "top_k": 5}], ids=["t1", "t05-k5"])
def test_generate_samples_the_next_token_from_the_last_position(settings):
    model = _model()
    f = load_fixture(LAB, "greedy")
    prompts = np.repeat(f["prompt"][:1], DRAWS, axis=0)
    out = S.generate(model, prompts, 1, rng=np.random.default_rng(11), **settings)
    assert isinstance(out, np.ndarray) and out.shape == (DRAWS, prompts.shape[1] + 1), (
        f"generate of one token after ({DRAWS}, 4) prompts must return ({DRAWS}, 5), "
        f"got {getattr(out, 'shape', type(out).__name__)}")
    expected = f["next_probs" if not settings else "next_probs_t05_k5"]
    args = ", ".join(f"{k}={v}" for k, v in settings.items()) or "temperature=1"
    _assert_draws(out[:, -1], expected, f"the first new token of generate({args}) over {DRAWS} equal prompts",
                  diagnoses={"the distribution at temperature 1 without top-k: generate must pass temperature, "
                             "top_k and top_p to sample_next": f["next_probs"]} if settings else None,
                  hint="the next token is drawn from softmax of the logits at the prompt's last position")


def test_generate_is_seeded_with_or_without_cache():
    model = _model()
    f = load_fixture(LAB, "greedy")
    a = S.generate(model, f["prompt"], 10, temperature=1.5, rng=np.random.default_rng(5))
    b = S.generate(model, f["prompt"], 10, temperature=1.5, rng=np.random.default_rng(5))
    c = S.generate(model, f["prompt"], 10, temperature=1.5, rng=np.random.default_rng(5), use_cache=False)
    assert np.array_equal(a, b), "generate with two generators of the same seed gave different tokens: use rng"
    _assert_tokens(c, a, "generate(use_cache=False) vs generate(use_cache=True), same seed",
                   hint="the cache must not change the logits, so the same draws give the same tokens")


def test_generate_edge_cases():
    model = _model()
    f = load_fixture(LAB, "greedy")
    prompt = f["prompt"]
    same = S.generate(model, prompt, 0)
    assert np.array_equal(same, prompt) and same is not prompt, (
        "generate(model, prompt, 0) must return a copy of the prompt")
    one = S.generate(model, prompt[:1, :1], 3, temperature=0)
    assert one.shape == (1, 4), f"one prompt token plus 3 new ones is (1, 4), got {one.shape}"
    with raises_clearly(ValueError, when=f"generate past max_seq_len={L}", mentions="max_seq_len"):
        S.generate(model, prompt, L)
    with raises_clearly(ValueError, when="generate(max_new_tokens=-1)", mentions="max_new_tokens"):
        S.generate(model, prompt, -1)
    with raises_clearly(ValueError, when="generate on a 1-D prompt", mentions="dimensions"):
        S.generate(model, prompt[0], 2)
    with raises_clearly(ValueError, when="generate with token id 48 for V=48", mentions="vocabulary"):
        S.generate(model, np.array([[1, V]]), 2)
    with raises_clearly(ValueError, when="generate with eos_token_id=48 for V=48", mentions="eos_token_id"):
        S.generate(model, prompt, 2, eos_token_id=V)


# --- beam search ----------------------------------------------------------------------------------

@pytest.mark.parametrize("setting", ["a", "b", "c", "d"])
def test_beam_search_matches_huggingface(setting):
    model = _model()
    f = load_fixture(LAB, "beam")
    nb, n = f[f"{setting}_num_beams"].item(), f[f"{setting}_max_new_tokens"].item()
    lp, eos = f[f"{setting}_length_penalty"].item(), f[f"{setting}_eos"].item()
    eos = None if eos < 0 else eos
    out = S.beam_search(model, f["prompt"], nb, n, eos_token_id=eos, length_penalty=lp)
    _assert_tokens(out, f[f"{setting}_out"],
                   f"beam_search(num_beams={nb}, max_new_tokens={n}, eos_token_id={eos}, length_penalty={lp}) vs "
                   f"HuggingFace generate(num_beams={nb}, do_sample=False)",
                   diagnoses=stored_diagnoses(f, f"{setting}_out"),
                   hint="see beam_search's docstring for when a hypothesis ends, how it is scored and when the "
                        "search stops")
    assert out.dtype == np.int64, f"beam_search must return int64 token ids, got {out.dtype}"


def test_beam_search_with_one_beam_is_greedy():
    model = _model()
    f = load_fixture(LAB, "greedy")
    n = f["greedy"].shape[1] - f["prompt"].shape[1]
    _assert_tokens(S.beam_search(model, f["prompt"], 1, n), f["greedy"],
                   "beam_search(num_beams=1) vs HuggingFace's greedy generate()",
                   hint="with one beam, the best candidate is always the argmax")
    _assert_tokens(S.beam_search(model, f["prompt"], 1, n, eos_token_id=f["eos"].item()), f["greedy_eos"],
                   "beam_search(num_beams=1, eos_token_id=…) vs HuggingFace's greedy generate() with EOS",
                   hint="a row ends at its first EOS and is filled with EOS after it")


def test_beam_search_edge_cases():
    model = _model()
    f = load_fixture(LAB, "beam")
    prompt = f["prompt"]
    same = S.beam_search(model, prompt, 3, 0)
    assert np.array_equal(same, prompt), "beam_search with max_new_tokens=0 must return the prompt"
    with raises_clearly(ValueError, when="beam_search(num_beams=0)", mentions="num_beams"):
        S.beam_search(model, prompt, 0, 3)
    with raises_clearly(ValueError, when=f"beam_search past max_seq_len={L}", mentions="max_seq_len"):
        S.beam_search(model, prompt, 2, L)
    with raises_clearly(ValueError, when="beam_search with eos_token_id=48 for V=48", mentions="eos_token_id"):
        S.beam_search(model, prompt, 2, 3, eos_token_id=V)
