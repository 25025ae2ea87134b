"""Lab 12 · inference engineering: profiling, tiled attention, a fast forward pass, batched
and speculative decoding, weight-only int8.

Expected values are stored fixtures made from the reference solutions of labs 01–06 (lab
01's attention, lab 04's logits, lab 06's greedy ``generate`` run alone on each prompt), so
no test here needs PyTorch. Nothing is timed against a clock: the profile's tables are
checked for their structure, the tiles that tiled attention skips are counted, and its
memory is the peak that Python's ``tracemalloc`` sees. The accept/reject rule of
speculative sampling is checked statistically (many seeded draws, each token's frequency
within five standard deviations of the target's probability).
"""

import contextlib
import math
import time
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptkit.testing import (arguments_written_back, assert_close, assert_ndarray, explains_errors, fixture_params, lab,
                            load_fixture, raises_clearly, stored_diagnoses)
from gptkit.testing.parameters import set_parameters
from gptkit.testing.resident import peak_growth

I = lab("inference")
G = lab("gpt")
LAB = "12_inference"
V, D, LAYERS, HEADS, L = 40, 16, 2, 2, 48  # the fixtures' target model (d_head = 8)
DRAFT = dict(vocab_size=V, d_model=8, num_layers=1, num_heads=2, d_ff=32, max_seq_len=L)  # the small draft
ATTENTION = ["a", "b", "c", "d"]  # the fixture's attention shapes (make_fixtures.ATTENTION)
SPEC = ["self", "near", "small", "lookup", "eos"]  # the fixture's speculative settings
SPEC_NEW = 23
NO_KEY_SEEN = ("a query row whose running sum l stayed 0 saw no key at all: every query sees the keys up to its "
               "own position, so the tile on the diagonal must be visited, and l and acc start at 0 with m at −inf")
SPEC_HINT = ("each round emits the accepted drafts and then the target's own next token (the correction, or the bonus "
             "token when every draft is accepted), and cuts the target's and the draft's caches back to the tokens "
             "kept; a cache that is not cut back overflows or feeds a token twice")


# --- helpers ---------------------------------------------------------------------------------

def _unseen(out) -> str:
    """NO_KEY_SEEN where the result holds a NaN (a row whose l stayed 0 divides 0 by 0), else no hint."""
    return NO_KEY_SEEN if isinstance(out, np.ndarray) and out.dtype.kind == "f" and np.isnan(out).any() else ""


def _model(prefix="param.", case="model", **shape):
    """The student's GPTModel holding one of the fixtures' random GPT-2s (every parameter random)."""
    f = load_fixture(LAB, case)
    kwargs = shape or dict(vocab_size=V, d_model=D, num_layers=LAYERS, num_heads=HEADS, d_ff=4 * D, max_seq_len=L)
    model = G.GPTModel(**kwargs, rng=np.random.default_rng(1))
    return set_parameters(model, fixture_params(f, prefix), f"GPTModel({', '.join(f'{k}={v}' for k, v in kwargs.items())})")


def _attention64(q, k, v):
    """Causal attention in float64, query i at position S − T + i."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    T, S = q.shape[-2], k.shape[-2]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    s = np.where(np.arange(S)[None, :] <= (S - T + np.arange(T))[:, None], s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def _names(num_layers):
    blocks = [f"h.{i}.{part}" for i in range(num_layers) for part in ("ln_1", "attn", "ln_2", "mlp")]
    return ["embeddings", *blocks, "ln_f", "head", "total"]


def _check_table(table, what, num_layers):
    __tracebackhide__ = True
    if not isinstance(table, list) or not all(isinstance(r, tuple) and len(r) == 2 for r in table):
        raise AssertionError(f"{what} must return a list of (name, seconds) tuples, got {type(table).__name__}")
    names = [r[0] for r in table]
    want = _names(num_layers)
    missing = [n for n in want if n not in names]
    if names != want:
        raise AssertionError(f"{what}: the rows must be, in order, {want}; got {names}"
                             + (f" (missing: {missing})" if missing else ""))
    seconds = [r[1] for r in table]
    if not all(isinstance(s, float) and math.isfinite(s) and s >= 0 for s in seconds):
        raise AssertionError(f"{what}: every time must be a Python float ≥ 0 (seconds), got {seconds}")
    if not math.isclose(seconds[-1], sum(seconds[:-1]), rel_tol=1e-9, abs_tol=1e-12):
        raise AssertionError(f"{what}: the total row ({seconds[-1]:.3g} s) must be the sum of the rows above it "
                             f"({sum(seconds[:-1]):.3g} s)")
    if seconds[-1] <= 0:
        raise AssertionError(f"{what}: the total is 0 s: were the parts timed at all?")


# --- measure first ---------------------------------------------------------------------------------

SLOW = 0.05  # seconds the stand-in for the last block's c_fc sleeps per call: that part's row shows it
SLOW_ROW = f"h.{LAYERS - 1}.mlp"
REPEATS = 3


def _slow_c_fc(model, calls):
    """The last block's c_fc replaced by the same product that also sleeps SLOW seconds (and notes each call)."""
    product = _counting_linear(load_fixture(LAB, "model"), "param.", f"h.{LAYERS - 1}.mlp.c_fc", calls)

    def slow_linear(x):
        time.sleep(SLOW)
        return product(x)

    model.h[LAYERS - 1].mlp.c_fc = slow_linear


def _check_timed(table, what, calls):
    """The table measures the parts themselves: the part that sleeps shows its sleep, and only it."""
    __tracebackhide__ = True
    assert len(calls) == REPEATS, (
        f"{what} with repeats={REPEATS}: the last block's c_fc (a stand-in the test put there) ran {len(calls)} "
        f"times; each of the {REPEATS} repeats runs every part once, through the model's own sub-layers")
    rows = dict(table[:-1])
    slow = rows[SLOW_ROW]
    assert slow >= 0.9 * SLOW, (  # (a little below the sleep: clocks of other systems round it)
        f"{what}: the test's stand-in for {SLOW_ROW}'s c_fc sleeps {SLOW} s on each call, yet the row {SLOW_ROW} "
        f"says {slow:.3g} s: the rows were not measured part by part. Each row is the time of its own part, between "
        f"perf_counter() read just before it and just after")
    others = {name: t for name, t in rows.items() if name != SLOW_ROW}
    late = {name: t for name, t in others.items() if t >= slow / 2}
    if late:
        after = [name for name in rows if list(rows).index(name) > list(rows).index(SLOW_ROW)]
        cumulative = all(others[n] >= SLOW for n in after) and all(a <= b for a, b in zip(rows.values(),
                                                                                           list(rows.values())[1:]))
        why = ("Your table matches cumulative times: each row holds the time since the pass began, not its own part's "
               "(read the clock again after each part and start the next row there). " if cumulative else "")
        raise AssertionError(f"{what}: only {SLOW_ROW} sleeps ({SLOW} s a call), yet {sorted(late)} show "
                             f"{[round(t, 4) for t in late.values()]} s. {why}Each row times its own part only")


def test_profile_forward_names_every_layer_and_adds_up():
    model = _model()
    ids = load_fixture(LAB, "model")["ids"]
    calls = []
    _slow_c_fc(model, calls)
    table = I.profile_forward(model, ids, repeats=REPEATS)
    _check_table(table, "profile_forward(model, ids)", LAYERS)
    _check_timed(table, "profile_forward(model, ids)", calls)


def test_profile_decode_step_names_every_layer_and_leaves_the_cache():
    model = _model()
    ids = load_fixture(LAB, "model")["ids"]
    cache = I.SlotCache(model, 2)
    I.forward_slots(model, ids[:, :6], cache, np.arange(2))
    calls = []
    _slow_c_fc(model, calls)
    table = I.profile_decode_step(model, ids[:, 6:7], cache, repeats=REPEATS)
    _check_table(table, "profile_decode_step(model, ids (2, 1), cache)", LAYERS)
    _check_timed(table, "profile_decode_step(model, ids (2, 1), cache)", calls)
    lengths = assert_ndarray(cache.lengths, "SlotCache.lengths", dtype="iu", shape=(2,))
    assert lengths.tolist() == [6, 6], (f"profile_decode_step must leave the cache's lengths as they were ([6, 6]), "
                                        f"got {lengths.tolist()}: the step is only measured")


def test_profile_decode_step_leaves_what_the_cache_holds():
    """The profiled step writes each row's keys and values at its next position, past what the
    cache holds: a forward_slots step afterwards gives what it gives when no profile ran."""
    ids = load_fixture(LAB, "model")["ids"]
    model = _model()
    steps = []
    for profiled in (False, True):  # the same step, without a profile before it and with one
        cache = I.SlotCache(model, 2)
        I.forward_slots(model, ids[:, :6], cache, np.arange(2))
        if profiled:
            I.profile_decode_step(model, ids[:, 6:7], cache, repeats=2)
        steps.append(I.forward_slots(model, ids[:, 6:7], cache, np.arange(2)))
    assert_close(steps[1], steps[0], atol=1e-6,
                 what="forward_slots of token 7 after profile_decode_step of it (the same step without the profile)",
                 hint="profile_decode_step runs the step at each row's next position, cache.lengths[i]: the keys "
                      "and values it writes lie past what the cache holds, and the lengths are put back, so the "
                      "positions the cache held keep their keys and values")


# --- tiled attention --------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ATTENTION)
def test_tiled_attention_matches_causal_attention(case):
    f = load_fixture(LAB, "attention")
    bq, bk = (int(b) for b in f[f"blocks_{case}"])
    out = I.tiled_causal_attention(f[f"q_{case}"], f[f"k_{case}"], f[f"v_{case}"], block_q=bq, block_k=bk)
    expected = f[f"out_{case}"]
    assert_ndarray(out, f"tiled_causal_attention (block_q={bq}, block_k={bk})", dtype=np.float32, shape=expected.shape)
    T, S = f[f"q_{case}"].shape[-2], f[f"k_{case}"].shape[-2]
    assert_close(out, expected, what=f"tiled attention, T={T} queries over S={S} keys, tiles {bq}×{bk}",
                 diagnoses=stored_diagnoses(f, f"out_{case}"), hint=_unseen(out))


@pytest.mark.parametrize("case", ATTENTION)
def test_tiles_above_the_diagonal_are_skipped(case):
    f = load_fixture(LAB, "attention")
    bq, bk = (int(b) for b in f[f"blocks_{case}"])
    q, k, v = f[f"q_{case}"], f[f"k_{case}"], f[f"v_{case}"]
    out, stats = I.tiled_causal_attention(q, k, v, block_q=bq, block_k=bk, return_stats=True)
    assert_close(out, f[f"out_{case}"], what="tiled attention with return_stats=True")
    T, S = q.shape[-2], k.shape[-2]
    total, visited = int(f[f"total_{case}"]), int(f[f"visited_{case}"])
    assert isinstance(stats, dict) and {"tiles_total", "tiles_visited"} <= set(stats), \
        f"return_stats=True must return (out, stats) with stats {{'tiles_total': …, 'tiles_visited': …}}, got {stats!r}"
    heads = math.prod(q.shape[:-2])
    if heads > 1 and (stats["tiles_visited"], stats["tiles_total"]) in {(visited * heads, total), (visited * heads,
                                                                                                   total * heads)}:
        raise AssertionError(
            f"T={T}, S={S}, tiles {bq}×{bk}, leading dimensions {q.shape[:-2]}: stats says {stats['tiles_visited']} "
            f"tiles visited, {heads} × the {visited} expected. Your result matches a tile counted once per head (per "
            f"index of the leading dimensions): a (query block, key block) tile counts once, whatever the leading "
            f"dimensions")
    assert stats["tiles_total"] == total, (f"T={T}, S={S} in tiles of {bq}×{bk}: there are ceil(T/block_q)·ceil(S/"
                                           f"block_k) = {total} tiles, stats says {stats['tiles_total']}")
    assert stats["tiles_visited"] <= visited, (
        f"T={T}, S={S}, tiles {bq}×{bk}: {stats['tiles_visited']} tiles visited, but only {visited} hold a key "
        f"that some query of their block may see: the tiles wholly above the diagonal must be skipped")
    assert stats["tiles_visited"] == visited, (
        f"T={T}, S={S}, tiles {bq}×{bk}: {stats['tiles_visited']} tiles visited, expected {visited}: every tile "
        f"up to and including the diagonal holds keys some query may see")


def test_tiled_attention_memory_grows_like_T_not_T_squared():
    """In float64 (8 bytes a number), so that the bound counts the arrays of the computation itself."""
    T, d, block = 4096, 16, 128
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((T, d)) for _ in range(3))
    out, peak = I.peak_memory(I.tiled_causal_attention, q, k, v, block_q=block, block_k=block)
    out = assert_ndarray(out, "tiled_causal_attention (T=4096, float64)", dtype=np.float64, shape=(T, d))
    rows = [0, 1, 2047, T - 1]
    assert_close(out[rows], _rows64(q, k, v, rows),
                 what="tiled attention at T=4096 (rows 0, 1, 2047, 4095)")
    bound = 8 * (6 * T * d + 4 * block * block)
    assert peak <= bound, (
        f"tiled attention at T={T}, d={d}, tiles {block}×{block} held {peak / 1e6:.2f} MB at its peak; O(T·d) memory "
        f"allows {bound / 1e6:.2f} MB (a few (T, d) arrays and (block_q, block_k) tiles), while a (T, T) array of "
        f"scores alone is {T * T * 8 / 1e6:.0f} MB: never build the whole score matrix, nor a row block of it "
        f"over every key")


RSS_T, RSS_D, RSS_BLOCK = 8192, 16, 128
RSS_BOUND = 64 * 2**20  # bytes; a (T, T) float64 array of scores is 512 MiB, a float32 one 256 MiB


def test_tiled_attention_peak_memory_as_the_kernel_counts_it():
    """Measured out of the lab code's reach: the peak resident memory of a process that runs the call (graded: the
    lab process, read by the grader from outside it), beyond its peak after a small call."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((RSS_T, RSS_D)) for _ in range(3))
    small = (tuple(a[:256] for a in (q, k, v)), {"block_q": RSS_BLOCK, "block_k": RSS_BLOCK})  # the same products
    big = ((q, k, v), {"block_q": RSS_BLOCK, "block_k": RSS_BLOCK})
    (_, out), (_, grew) = peak_growth("inference", "tiled_causal_attention", [small, big])
    out = assert_ndarray(out, f"tiled_causal_attention (T={RSS_T}, float64)", dtype=np.float64, shape=(RSS_T, RSS_D))
    rows = [0, 1, RSS_T // 2, RSS_T - 1]
    assert_close(out[rows], _rows64(q, k, v, rows), what=f"tiled attention at T={RSS_T} (rows {rows})")
    assert grew <= RSS_BOUND, (
        f"tiled attention at T={RSS_T}, d={RSS_D}, tiles {RSS_BLOCK}×{RSS_BLOCK} (float64) made its process's peak "
        f"resident memory grow by {grew / 2**20:.0f} MiB, as the operating system counts it (whatever the lab code "
        f"does: tracemalloc, mmap and all); O(T·d) memory needs a few MiB, and at most {RSS_BOUND // 2**20} MiB is "
        f"allowed, while a (T, T) array of scores alone is {RSS_T * RSS_T * 8 // 2**20} MiB: never build the whole "
        f"score matrix")


def _rows64(q, k, v, rows):
    """Causal attention (T = S) of the given query rows only, in float64."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    out = []
    for i in rows:
        s = k[: i + 1] @ q[i] / math.sqrt(q.shape[-1])
        w = np.exp(s - s.max())
        out.append((w / w.sum()) @ v[: i + 1])
    return np.stack(out)


@given(T=st.integers(1, 19), extra=st.integers(0, 9), bq=st.integers(1, 8), bk=st.integers(1, 8),
       seed=st.integers(0, 2**16))
def test_tiled_attention_any_tiles(T, extra, bq, bk, seed):
    rng = np.random.default_rng(seed)
    S = T + extra
    q = (2 * rng.standard_normal((2, T, 4))).astype(np.float32)
    k, v = rng.standard_normal((2, S, 4)).astype(np.float32), rng.standard_normal((2, S, 3)).astype(np.float32)
    out = I.tiled_causal_attention(q, k, v, block_q=bq, block_k=bk)
    assert_close(out, _attention64(q, k, v), what="tiled attention on random shapes and tiles",
                 hint=f"T={T}, S={S}, tiles {bq}×{bk}" + (f"; {_unseen(out)}" if _unseen(out) else ""))


def test_tiled_attention_when_every_score_is_far_below_zero():
    """exp(score) underflows to 0 for scores near −1000: only the running max (starting at −inf, then the tile's own
    maximum) keeps l above 0."""
    rng = np.random.default_rng(9)
    T, d = 13, 4
    # every score q·k/√d is about −1000, and exact in float32 (whole q, k in 512ths), so only the softmax rounds
    k = (1 + rng.integers(0, 3, (T, d)) / 512).astype(np.float32)
    q = rng.integers(-502, -498, (T, d)).astype(np.float32)
    v = rng.standard_normal((T, 3)).astype(np.float32)
    expected = _attention64(q, k, v)
    out = I.tiled_causal_attention(q, k, v, block_q=4, block_k=5)
    out = assert_ndarray(out, "tiled_causal_attention", dtype=np.float32, shape=(T, 3))
    if not np.isfinite(out).all():
        raise AssertionError(
            f"tiled attention with every score near −1000 gave {int((~np.isfinite(out)).sum())} NaN or infinite "
            f"values of {out.size}. Your result matches a running max that starts at 0 (or is never raised above "
            f"it): exp(score − 0) underflows to 0, l stays 0 and acc / l is 0 / 0. m starts at −inf and each tile "
            f"raises it to max(m, max s)")
    assert_close(out, expected, what="tiled attention with every score near −1000 (T=13, tiles 4×5)")


def test_tiled_attention_is_float32_and_rejects_bad_shapes():
    f = load_fixture(LAB, "attention")
    q, k, v = f["q_b"], f["k_b"], f["v_b"]
    out = I.tiled_causal_attention(q, k, v, block_q=4, block_k=7)
    assert_close(out, f["out_b"], what="tiled attention")
    assert_ndarray(out, "tiled_causal_attention on float32", dtype=np.float32)
    with raises_clearly(ValueError, when="tiled attention with fewer keys than queries (S < T)", mentions="S"):
        I.tiled_causal_attention(k, q, q[..., :6])
    with raises_clearly(ValueError, when="tiled attention with v of another length than k"):
        I.tiled_causal_attention(q, k, v[..., :-1, :])


# --- the fast forward pass ---------------------------------------------------------------------------

def test_fast_gelu_is_gpt2s_tanh_gelu_in_place():
    f = load_fixture(LAB, "gelu")
    x = f["x"]
    with arguments_written_back():
        y = I.fast_gelu(x)
    assert_close(y, f["gelu"], what="fast_gelu(x) for x in [−6, 6]", diagnoses=stored_diagnoses(f, "gelu"),
                 hint="0.5·(1 + tanh u) = 1 / (1 + exp(−2u)) with u = √(2/π)·(x + 0.044715·x³)")
    assert_ndarray(y, "fast_gelu on float32", dtype=np.float32)
    assert np.allclose(x, f["gelu"], atol=1e-5, rtol=1e-4), (
        "fast_gelu must write gelu(x) into x itself (in place) and return it; x still holds other values")


def test_fast_gelu_caps_its_exponent_at_88():
    """Far left of 0, −2u is past float32's exp range (88.7): capped at 88, x / (1 + e^88) is a tiny negative number."""
    x = np.array([-100.0, -50.0, -30.0, -12.0], dtype=np.float32)
    expected = x / (1 + np.exp(np.float32(88.0)))  # about −6e−37 … −7e−38
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = I.fast_gelu(x.copy())
    y = assert_ndarray(y, "fast_gelu", dtype=np.float32, shape=(4,))
    overflow = [w for w in seen if issubclass(w.category, RuntimeWarning) and "overflow" in str(w.message)]
    if not (y < 0).all() or overflow:
        raise AssertionError(
            f"fast_gelu({x.tolist()}) gave {y.tolist()}{' with an overflow warning' if overflow else ''}; with the "
            f"exponent −2u capped at 88 it is x / (1 + e^88) = {expected.tolist()}. Your result matches an exponent "
            f"without its cap: exp(−2u) overflows to inf (NumPy warns) and the result collapses to −0.0. Cap it "
            f"with np.minimum(z, 88, out=z) before np.exp")
    assert_close(y, expected, atol=0, rtol=1e-3, what="fast_gelu far left of 0 (x / (1 + e^88))")


def test_fast_gelu_holds_one_scratch_array():
    """In place with one scratch array: beside x it holds about one more array of x's size at its peak, where
    writing the formula as expressions makes a new array per operation."""
    x = np.random.default_rng(6).uniform(-6, 6, 1 << 20).astype(np.float32)  # 4 MB
    expected = 0.5 * x.astype(np.float64) * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)))
    y, peak = I.peak_memory(I.fast_gelu, x)
    y = assert_ndarray(y, "fast_gelu of 2²⁰ numbers", dtype=np.float32, shape=x.shape)
    assert_close(y, expected.astype(np.float32), atol=1e-5, rtol=1e-4, what="fast_gelu of 2²⁰ numbers in [−6, 6]")
    bound = int(1.25 * x.nbytes) + (1 << 16)
    assert peak <= bound, (
        f"fast_gelu on {x.nbytes / 1e6:.1f} MB of float32 held {peak / 1e6:.1f} MB beyond x at its peak; one scratch "
        f"array is {x.nbytes / 1e6:.1f} MB (at most {bound / 1e6:.1f} MB allowed). Compute u into one array made once "
        f"(np.multiply(x, x, out=…), then *=, +=, np.minimum and np.exp with out=) instead of expressions such as "
        f"x + 0.044715 * x * x * x, each of which makes a new array")


def test_fast_forward_matches_the_model():
    f = load_fixture(LAB, "model")
    model = _model()
    with explains_errors("fast_forward(model, ids (2, 33), block_q=8, block_k=8)",
                         "it runs the same layers as lab 04's forward, on (B·T, D) arrays"):
        logits = I.fast_forward(model, f["ids"], block_q=8, block_k=8)
    assert_close(logits, f["logits"], what="fast_forward's logits (lab 04's model(ids) is the reference)",
                 diagnoses=stored_diagnoses(f, "logits"), atol=1e-4)


def test_fast_forward_is_float32_and_checks_its_input():
    f = load_fixture(LAB, "model")
    model = _model()
    logits = I.fast_forward(model, f["ids"][:1, :10])
    assert_close(logits, f["logits"][:1, :10], what="fast_forward on the first 10 tokens of row 0", atol=1e-4)
    assert_ndarray(logits, "fast_forward", dtype=np.float32, shape=(1, 10, V))
    with raises_clearly(ValueError, when=f"fast_forward on {L + 1} tokens (max_seq_len={L})", mentions="max_seq_len"):
        I.fast_forward(model, np.zeros((1, L + 1), dtype=np.int64))


def test_fast_forward_writes_its_logits_into_out():
    f = load_fixture(LAB, "model")
    model = _model()
    B, T = f["ids"].shape
    out = np.full((B, T, V), np.nan, dtype=np.float32)
    with arguments_written_back(), explains_errors(
            f"fast_forward(model, ids ({B}, {T}), block_q=8, block_k=8, out=a ({B}, {T}, {V}) array)",
            "the logits go into out, which is returned"):
        got = I.fast_forward(model, f["ids"], block_q=8, block_k=8, out=out)
    assert_close(out, f["logits"], what="the logits fast_forward wrote into out (lab 04's model(ids) is the reference)",
                 atol=1e-4, hint="with out given, write the logits into it (np.matmul(..., out=...)) and return it")
    assert_close(got, out, what="what fast_forward(..., out=out) returns: out itself, holding the logits", atol=0)
    with raises_clearly(ValueError, when="fast_forward with an out of the wrong shape", mentions="out"):
        I.fast_forward(model, f["ids"], out=np.zeros((B, T, V - 1), dtype=np.float32))


# --- batched decoding -----------------------------------------------------------------------------------

def test_forward_slots_runs_rows_at_their_own_positions():
    f = load_fixture(LAB, "slots")
    model = _model()
    cache = I.SlotCache(model, 3)
    for i in range(4):
        ids, slots = f[f"ids_{i}"], f[f"slots_{i}"]
        starts = cache.lengths[slots].tolist()
        logits = I.forward_slots(model, ids, cache, slots)
        assert_close(logits, f[f"logits_{i}"], diagnoses=stored_diagnoses(f, f"logits_{i}"), atol=1e-4,
                     what=f"forward_slots call {i + 1}: rows in slots {slots.tolist()} at positions {starts} …, "
                          f"{ids.shape[1]} new token(s) each (lab 04's logits of each row's sequence so far)")
    lengths = assert_ndarray(cache.lengths, "SlotCache.lengths", dtype="iu", shape=(3,))
    assert lengths.tolist() == f["lengths"].tolist(), (
        f"after the four calls the slots hold {f['lengths'].tolist()} tokens; the cache's lengths say "
        f"{lengths.tolist()}: forward_slots advances the lengths of the slots it ran by T")


def test_slot_cache_reset_empties_one_slot():
    f = load_fixture(LAB, "slots")
    model = _model()
    cache = I.SlotCache(model, 3)
    I.forward_slots(model, f["ids_0"], cache, f["slots_0"])
    I.forward_slots(model, f["ids_1"], cache, f["slots_1"])
    cache.reset(2)
    assert cache.lengths.tolist() == [9, 0, 0], f"reset(2) must set slot 2's length to 0 and keep slot 0's 9, got {cache.lengths.tolist()}"
    logits = I.forward_slots(model, f["ids_0"], cache, f["slots_0"])  # slot 2 holds row a from its start again
    assert_close(logits, f["logits_0"], what="forward_slots on a slot after reset (a new sequence from position 0)",
                 atol=1e-4)


def test_forward_slots_is_finite_when_the_scores_are_large():
    """Queries and keys 60 times larger make scores in the thousands: a softmax that subtracts each row's max
    (lab 01's) stays finite and equals the model's own logits, where exp of the raw scores overflows."""
    f = load_fixture(LAB, "model")
    model = _model()
    for i in range(LAYERS):  # every block's c_attn weight × 60
        c_attn = model.h[i].attn.c_attn
        c_attn.weight = np.asarray(c_attn.weight) * np.float32(60.0)
    ids = f["ids"][:, :9]
    cache = I.SlotCache(model, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        logits = I.forward_slots(model, ids, cache, np.arange(2))
    logits = assert_ndarray(logits, "forward_slots with large scores", dtype=np.float32, shape=(2, 9, V))
    expected = model(ids)
    assert np.isfinite(expected).all(), "the model's own logits are not finite: lab 04's attention needs lab 01's stable softmax"
    if not np.isfinite(logits).all():
        raise AssertionError("forward_slots gave non-finite logits when the attention scores are in the thousands: "
                             "attend_rows's softmax must subtract each row's largest score before exp (as lab 01's "
                             "softmax does); exp of a score above 88 overflows in float32")
    assert_close(logits, expected, atol=1e-3, rtol=1e-3, what="forward_slots with c_attn's weights × 60 (the "
                 "model's own logits)")


def test_forward_slots_rejects_bad_slots():
    f = load_fixture(LAB, "slots")
    model = _model()
    cache = I.SlotCache(model, 2)
    assert_close(I.forward_slots(model, f["ids_0"], cache, np.array([1])), f["logits_0"],
                 what="forward_slots on slot 1 of a 2-slot cache", atol=1e-4)
    with raises_clearly(ValueError, when="forward_slots with the same slot twice", mentions="slot"):
        I.forward_slots(model, np.zeros((2, 1), np.int64), cache, np.array([1, 1]))
    with raises_clearly(ValueError, when="forward_slots with slot 2 of a 2-slot cache", mentions="slot"):
        I.forward_slots(model, np.zeros((1, 1), np.int64), cache, np.array([2]))
    with raises_clearly(ValueError, when="forward_slots with 2 rows of ids and 1 slot", mentions="slot"):
        I.forward_slots(model, np.zeros((2, 1), np.int64), cache, np.array([0]))


def _requests(f, n=5):
    return [(f[f"prompt_{i}"], int(f["max_new"][i]), int(f["eos"]) if i == 4 else None) for i in range(n)]


def test_one_step_advances_prompts_of_different_lengths_together():
    f = load_fixture(LAB, "batched")
    model = _model()
    dec = I.BatchedDecoder(model, 3)
    reqs = _requests(f, 3)  # prompts of 3, 7 and 1 tokens
    rids = [dec.submit(p, n, eos=e) for p, n, e in reqs]
    assert rids == [0, 1, 2], f"submit returns request ids 0, 1, 2, … in order; got {rids}"
    emitted = dec.step()
    lengths = [int(n) for n in dec.cache.lengths[:3]]
    held = [len(p) for p, _, _ in reqs]  # each slot holds its whole prompt after the first step
    if lengths != held:
        if lengths == [n + 1 for n in held]:
            why = ("each prompt's last token was cached twice, at two positions: the prefill runs a prompt's tokens "
                   "but its last, and the step feeds that last token")
        elif lengths[:2] == [max(held)] * 2:  # the padded prefill's width (longest − 1), then the step's token
            why = ("the prompts prefilled together are padded to the longest, and each slot's length stayed at the "
                   "padded width: set each slot's length back to its own prompt's length − 1 after the prefill "
                   "(the padding's keys then lie past it)")
        else:
            why = "the prefill holds a prompt's tokens but its last; the step adds one position to each active slot"
        raise AssertionError(f"after the first step the slots of the prompts of 3, 7 and 1 tokens must hold {held} "
                             f"positions (cache.lengths), got {lengths}: {why}")
    want = {i: int(f["tokens"][i, len(reqs[i][0])]) for i in range(3)}
    assert emitted == want, (f"one step over prompts of 3, 7 and 1 tokens must give each request its first greedy "
                             f"token {want}; got {emitted}. The prefill runs a prompt's tokens but its last, and the "
                             f"step feeds that last token at position T − 1: fed twice, it sits at two positions")
    assert dec.forward_calls == 2, (
        f"the first step runs ONE prefill (the prompts of 3 and 7 tokens together, all but their last token, padded "
        f"to the longest; a 1-token prompt needs none) and ONE forward pass for all three requests: 2 forward passes, "
        f"the decoder counted {dec.forward_calls}")


def _run(dec, f):
    for p, n, e in _requests(f):
        dec.submit(p, n, eos=e)
    trace = []
    while dec.step():
        trace.append([-1 if s is None else s for s in dec.slots])
        if len(trace) > 100:
            raise AssertionError("the decoder still runs after 100 steps: finished requests must leave their slots")
    return trace, dec.run()


def test_batched_requests_get_exactly_their_greedy_tokens():
    f = load_fixture(LAB, "batched")
    dec = I.BatchedDecoder(_model(), 2)
    _, done = _run(dec, f)
    expected = f["tokens"]
    assert sorted(done) == list(range(5)), f"run() must return every request's tokens by id 0 … 4, got ids {sorted(done)}"
    got = np.full(expected.shape, -1, dtype=np.int64)
    for rid, tokens in done.items():
        tokens = assert_ndarray(tokens, f"run()[{rid}]", dtype="iu")
        got[rid, : min(len(tokens), got.shape[1])] = tokens[: got.shape[1]]
        if len(tokens) > got.shape[1]:
            got[rid, -1] = -2
    assert_close(got, expected, atol=0, rtol=0, diagnoses=stored_diagnoses(f, "tokens"),
                 what="five requests through 2 slots, each row prompt + new tokens padded with −1 (lab 06's greedy "
                      "generate of each request alone; request 4 stops at its eos)")


def test_a_finished_request_frees_its_slot_at_once():
    f = load_fixture(LAB, "batched")
    dec = I.BatchedDecoder(_model(), 2)
    trace, _ = _run(dec, f)
    expected = f["trace"]
    got = np.array(trace, dtype=np.int64).reshape(-1, 2)
    assert_close(got if got.shape == expected.shape else np.full(expected.shape, -9), expected, atol=0, rtol=0,
                 diagnoses=stored_diagnoses(f, "trace"),
                 what="the request in each slot after each step (−1: free)",
                 hint=f"{len(trace)} steps, expected {len(expected)}: continuous batching gives a finished "
                      f"request's slot to the next waiting request at the very next step")


def test_each_step_is_one_forward_pass_for_the_whole_batch():
    f = load_fixture(LAB, "batched")
    dec = I.BatchedDecoder(_model(), 2)
    trace, done = _run(dec, f)
    assert_close(np.array([len(t) for t in done.values()]), np.array([(r >= 0).sum() for r in f["tokens"]]),
                 atol=0, rtol=0, what="the number of tokens of each request")
    want = int(f["forward_calls"])
    assert dec.forward_calls == want, (
        f"{len(trace)} steps, each one forward pass for the whole batch, and one prefill per step that admits prompts "
        f"longer than one token (all of that step's together) make {want} forward passes; the decoder made "
        f"{dec.forward_calls}")


def test_batched_decoder_samples_with_sample_next_and_its_rng():
    """At temperature 0.8 with top_k = 10 each step's tokens are lab 06's sample_next of the step's logits (one row
    per active request, in slot order) with the decoder's rng: the same draws as the test makes from the model's
    own logits with a generator seeded alike."""
    f = load_fixture(LAB, "batched")
    model = _model()
    S = lab("generation")
    prompts, n = [f["prompt_0"], f["prompt_1"]], 6
    dec = I.BatchedDecoder(model, 2, temperature=0.8, top_k=10, rng=np.random.default_rng(21))
    for p in prompts:
        dec.submit(p, n)
    got = dec.run()
    rng, seqs = np.random.default_rng(21), [list(map(int, p)) for p in prompts]
    for _ in range(n):
        logits = np.stack([model(np.array([s]))[0, -1] for s in seqs])  # (2, V): each request's next-token logits
        for s, t in zip(seqs, np.asarray(S.sample_next(logits, temperature=0.8, top_k=10, rng=rng)).tolist()):
            s.append(int(t))
    greedy = [list(map(int, f["tokens"][i][f["tokens"][i] >= 0][: len(prompts[i]) + n])) for i in range(2)]
    for rid, want in enumerate(seqs):
        tokens = assert_ndarray(got.get(rid), f"run()[{rid}]", dtype="iu").tolist()
        if tokens != want:
            why = (" Your result matches the greedy tokens: pick each step's tokens with sample_next(logits, "
                   "**self.sampling), which samples at the decoder's temperature" if tokens == greedy[rid] else "")
            raise AssertionError(
                f"BatchedDecoder(model, 2, temperature=0.8, top_k=10, rng=default_rng(21)), request {rid}: expected "
                f"{want}, got {tokens}.{why} Each step calls lab 06's sample_next once, on the (B, V) logits of the "
                f"active requests in slot order, with the decoder's own rng")


def test_submit_rejects_what_cannot_fit():
    f = load_fixture(LAB, "batched")
    dec = I.BatchedDecoder(_model(), 2)
    prompt, n, _ = _requests(f, 1)[0]
    assert dec.submit(prompt, n) == 0
    done = dec.run()
    expected = f["tokens"][0][f["tokens"][0] >= 0]
    assert_close(done[0] if done[0].shape == expected.shape else np.zeros(expected.shape), expected, atol=0, rtol=0,
                 what="one request alone through the decoder")
    with raises_clearly(ValueError, when=f"submit 10 tokens + 40 new (max_seq_len={L})", mentions="max_seq_len"):
        dec.submit(np.zeros(10, np.int64), 40)
    with raises_clearly(ValueError, when=f"submit a prompt holding id {V} (vocabulary 0 … {V - 1})", mentions="vocabulary"):
        dec.submit(np.array([1, V]), 3)
    with raises_clearly(ValueError, when="submit an empty prompt", mentions="token"):
        dec.submit(np.zeros(0, np.int64), 3)


# --- speculative decoding -------------------------------------------------------------------------------

@pytest.mark.parametrize("i", [0, 1, 3, 4])
def test_prompt_lookup_draft(i):
    f = load_fixture(LAB, "lookup")
    context, k, ngram = f[f"context_{i}"], int(f[f"k_{i}"]), int(f[f"ngram_{i}"])
    got = I.prompt_lookup_draft(context, k, ngram=ngram)
    expected = f[f"draft_{i}"]
    got = assert_ndarray(got, "prompt_lookup_draft", dtype="iu")
    what = f"prompt_lookup_draft({context.tolist()}, k={k}, ngram={ngram}), expected {expected.tolist()}"
    if got.shape != expected.shape:
        for label, wrong in stored_diagnoses(f, f"draft_{i}").items():
            if wrong.shape == got.shape and np.array_equal(wrong, got):
                raise AssertionError(f"{what}. Your result matches {label}")
        raise AssertionError(f"{what}; got {got.tolist()}")
    assert_close(got, expected, atol=0, rtol=0, diagnoses=stored_diagnoses(f, f"draft_{i}"), what=what)


def test_prompt_lookup_draft_proposes_nothing_without_a_match():
    f = load_fixture(LAB, "lookup")
    got = I.prompt_lookup_draft(f["context_2"], int(f["k_2"]), ngram=int(f["ngram_2"]))
    got = assert_ndarray(got, "prompt_lookup_draft", dtype="iu")
    assert got.shape == (0,), (f"prompt_lookup_draft({f['context_2'].tolist()}, k=2): no token occurs twice, so no "
                               f"n-gram matches and nothing is proposed (an empty array); got {got.tolist()}")


# forward_slots' messages for an empty feed: np.array([[]]) is float64 and has no token
EMPTY_FEED = ("at least one row and one token", "integer token ids, got dtype float64")


@contextlib.contextmanager
def _speculating(what):
    """explains_errors for the speculative decoders, and a named message for a draft cache never cut back."""
    try:
        with explains_errors(what, SPEC_HINT):
            yield
    except (ValueError, AssertionError) as exc:
        if not any(m in str(exc) for m in EMPTY_FEED):
            raise
        raise AssertionError(
            f"{what}: the draft model was fed no token ({str(exc).splitlines()[0][:120]}): its cache already held "
            f"the whole context, so it was not cut back to the tokens kept. After each round call "
            f"Drafter.keep(len(tokens) − 1) (every token but the new last one, as the target's cache holds), and "
            f"let keep set cache.lengths[0] = min(what it holds, length)") from None


def _draft(name):
    if name in ("self",):
        return _model()
    if name in ("near", "eos"):
        return _model("near.", "speculative")
    if name == "small":
        return _model("small.", "speculative", **DRAFT)
    return None


def _speculate(f, name):
    prompt = f["prompt_1"] if name == "lookup" else f["prompt_0"]
    k, ngram = int(f[f"k_{name}"]), int(f[f"ngram_{name}"])
    eos = int(f["eos"]) if name == "eos" else None
    draft = _draft(name)
    with _speculating(f"speculative_greedy(target, {'None' if draft is None else 'draft'}, prompt, {SPEC_NEW}, "
                      f"k={k})"):
        return I.speculative_greedy(_model(), draft, prompt, SPEC_NEW, k=k, ngram=ngram, eos=eos)


def test_drafter_proposes_the_drafts_greedy_tokens_and_keep_cuts_its_cache_back():
    f = load_fixture(LAB, "speculative")
    drafter = I.Drafter(_draft("near"), 3)
    context = f["drafter_context"]
    with explains_errors(f"Drafter(draft, 3).propose(a context of {len(context)} tokens, 3)",
                         "the draft decodes greedily through its own one-slot cache, fed what it does not hold yet"):
        tokens, _ = drafter.propose(context.tolist(), 3)
    assert_close(assert_ndarray(tokens, "Drafter.propose's tokens", dtype="iu", shape=(3,)), f["drafter_tokens"],
                 atol=0, rtol=0, what="the draft's 3 proposals after the context (its own greedy tokens)")
    held = int(drafter.cache.lengths[0])
    drafter.keep(8)
    cut = int(drafter.cache.lengths[0])
    assert cut == 8, (f"Drafter.keep(8) after a round: the draft's cache held {held} positions and must keep only the "
                      f"first 8 (the rest were rejected), got {cut}: the draft's cache was not cut back "
                      f"(keep sets cache.lengths[0] = min(what it holds, length))")
    changed = f["drafter_changed"]
    with explains_errors(f"Drafter.propose on the context cut back to 8 tokens plus a new one, after keep(8)",
                         "the draft's cache holds the first 8 tokens: propose feeds it the rest of the context"):
        tokens, _ = drafter.propose(changed.tolist(), 3)
    assert_close(assert_ndarray(tokens, "Drafter.propose's tokens", dtype="iu", shape=(3,)),
                 f["drafter_changed_tokens"], atol=0, rtol=0,
                 what="the draft's 3 proposals after keep(8) and a context whose 9th token changed (its greedy tokens)",
                 hint="after keep(length) the draft's cache holds the context's first `length` tokens; propose feeds "
                      "the draft everything from there on")


@pytest.mark.parametrize("name", SPEC)
def test_speculative_greedy_gives_the_greedy_tokens(name):
    f = load_fixture(LAB, "speculative")
    tokens, _ = _speculate(f, name)
    expected = f[f"tokens_{name}"]
    tokens = assert_ndarray(tokens, "speculative_greedy", dtype="iu")
    what = {"self": "the target as its own draft", "near": "a draft near the target", "small": "a small random draft",
            "lookup": "prompt lookup drafts", "eos": "a draft near the target, stopping at eos"}[name]
    got = tokens if tokens.shape == expected.shape else np.full(expected.shape, -1)
    assert_close(got, expected, atol=0, rtol=0, diagnoses=stored_diagnoses(f, f"tokens_{name}"),
                 what=f"speculative greedy decoding with {what}: lab 06's greedy tokens",
                 hint=f"{len(tokens)} tokens, expected {len(expected)}: {SPEC_HINT}")


@pytest.mark.parametrize("name", SPEC)
def test_speculative_counts_proposals_and_acceptances(name):
    f = load_fixture(LAB, "speculative")
    tokens, stats = _speculate(f, name)
    assert_close(tokens if tokens.shape == f[f"tokens_{name}"].shape else np.zeros(f[f"tokens_{name}"].shape),
                 f[f"tokens_{name}"], atol=0, rtol=0, what="speculative greedy tokens")
    assert isinstance(stats, dict) and {"proposed", "accepted", "rounds"} <= set(stats), \
        f"speculative_greedy returns (tokens, stats) with stats {{'proposed', 'accepted', 'rounds'}}, got {stats!r}"
    got = np.array([stats["proposed"], stats["accepted"], stats["rounds"]])
    expected = f[f"counts_{name}"]
    hint = (f"with the target as its own draft every draft is accepted and each round emits k + 1 = "
            f"{int(f['k_self']) + 1} tokens: the accepted drafts and the bonus token" if name == "self" else
            "each round proposes min(k, tokens still to emit − 1) drafts, accepts the longest prefix that matches "
            "the target's own choices, and is one forward pass of the target; the draft's cache is cut back to the "
            "tokens kept")
    assert_close(got, expected, atol=0, rtol=0, diagnoses=stored_diagnoses(f, f"counts_{name}"), hint=hint,
                 what=f"(proposed, accepted, rounds) of speculative greedy decoding ({name})")


def _counting_linear(f, prefix, layer, calls):
    """A stand-in for one Linear of a model (the same product) that notes how many rows each call had."""
    weight, bias = f[f"{prefix}{layer}.weight"], f[f"{prefix}{layer}.bias"]

    def linear(x):
        x = np.asarray(x, dtype=np.float32)
        calls.append(int(np.prod(x.shape[:-1])))
        return x @ weight + bias

    return linear


def test_speculative_greedy_runs_the_target_once_per_round_over_the_drafts():
    """The work itself, not only its tokens: each round one pass of the target over [last, d1 … dm]."""
    f = load_fixture(LAB, "speculative")
    model, draft = _model(), _draft("near")
    target_rows, draft_rows = [], []
    model.h[0].mlp.c_fc = _counting_linear(load_fixture(LAB, "model"), "param.", "h.0.mlp.c_fc", target_rows)
    draft.h[0].mlp.c_fc = _counting_linear(f, "near.", "h.0.mlp.c_fc", draft_rows)
    prompt, k = f["prompt_0"], int(f["k_near"])
    with _speculating(f"speculative_greedy(target, draft, prompt, {SPEC_NEW}, k={k})"):
        tokens, stats = I.speculative_greedy(model, draft, prompt, SPEC_NEW, k=k)
    assert_close(tokens if np.shape(tokens) == f["tokens_near"].shape else np.zeros(f["tokens_near"].shape),
                 f["tokens_near"], atol=0, rtol=0, what="speculative greedy tokens (lab 06's greedy tokens)")
    assert isinstance(stats, dict) and {"proposed", "accepted", "rounds"} <= set(stats), \
        f"speculative_greedy returns (tokens, stats) with stats {{'proposed', 'accepted', 'rounds'}}, got {stats!r}"
    proposed, rounds = int(stats["proposed"]), int(stats["rounds"])
    passes = len(target_rows)
    assert passes == rounds + 1, (
        f"the target ran {passes} forward passes (its block 0's MLP was called {passes} times); speculative greedy "
        f"decoding of {SPEC_NEW} tokens in {rounds} rounds (your stats) is one prefill of the prompt but its last token "
        f"and {rounds} rounds, each ONE pass of the target over [last, d1 … dm]: {rounds + 1} passes")
    assert target_rows[0] == len(prompt) - 1, (
        f"the target's first pass (the prefill) fed {target_rows[0]} tokens: it holds the prompt's {len(prompt)} "
        f"tokens but the last, {len(prompt) - 1}")
    assert sum(target_rows[1:]) == rounds + proposed, (
        f"the target's {rounds} rounds fed {sum(target_rows[1:])} tokens ({target_rows[1:]}): each feeds the last "
        f"token and that round's drafts, {rounds} + {proposed} proposed = {rounds + proposed} in all")
    assert len(draft_rows) >= proposed, (
        f"{proposed} tokens were proposed, but the draft model ran only {len(draft_rows)} forward passes: each "
        f"drafted token is the draft's own greedy choice, one draft pass per token")


P = np.array([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])  # the target's distribution in the sampling tests
Q = np.array([0.25, 0.10, 0.30, 0.05, 0.20, 0.10])  # the draft's
DRAWS = 60000


def test_speculative_greedy_stops_at_an_eos_among_the_accepted_drafts():
    """With the target as its own draft every draft is accepted, and eos may be one of them, not a round's last
    token: the tokens stop at it, as lab 06's greedy generate with eos does."""
    f = load_fixture(LAB, "speculative")
    prompt, k = f["prompt_0"], int(f["k_self"])
    new = f["tokens_self"][len(prompt):].tolist()
    # a token first emitted inside a round: every round emits k accepted drafts, then the bonus token
    at = next(i for i in range(1, len(new)) if new[i] not in new[:i] and (i + 1) % (k + 1) != 0)
    eos = new[at]
    expected = f["tokens_self"][: len(prompt) + at + 1]
    with _speculating(f"speculative_greedy(target, target, prompt, {SPEC_NEW}, k={k}, eos={eos})"):
        tokens, _ = I.speculative_greedy(_model(), _model(), prompt, SPEC_NEW, k=k, eos=eos)
    _same_tokens(tokens, expected, {}, what=f"speculative greedy decoding, the target as its own draft, eos = {eos} "
                 f"(new token {at + 1}, an accepted draft of round {at // (k + 1) + 1})",
                 hint="with eos, stop once it is emitted, whether it is an accepted draft or the round's own token: "
                      "look for eos among every token the round emits")


def test_drafter_samples_its_drafts_at_the_temperature_and_returns_their_q():
    """At temperature 2, propose draws the draft's token from q = softmax(the draft's logits / 2) with rng and
    returns that q: its value against the draft model's own logits, its draws against q."""
    f = load_fixture(LAB, "speculative")
    draft = _draft("near")
    context = f["drafter_context"].tolist()
    drafter, rng = I.Drafter(draft, 3), np.random.default_rng(8)
    runs, counts, first_q = 300, np.zeros(V), None
    for i in range(runs):
        tokens, probs = drafter.propose(context, 1, temperature=2.0, rng=rng)
        if i == 0:
            first_q = assert_ndarray(probs, "Drafter.propose's q at temperature 2", shape=(1, V))[0]
        counts[int(assert_ndarray(tokens, "Drafter.propose's tokens", dtype="iu", shape=(1,))[0])] += 1
        drafter.keep(len(context) - 1)
    logits = np.asarray(draft(np.array([context]))[0, -1], np.float64) / 2.0
    q = np.exp(logits - logits.max())
    q /= q.sum()
    assert_close(first_q, q, atol=1e-5, rtol=1e-4,
                 what="the q that Drafter.propose returns at temperature 2 (softmax of the draft's logits / 2)",
                 hint="q is the distribution the draft drew from: softmax(logits / temperature) at the "
                      "temperature given, not at 1")
    top = int(np.argmax(q))
    freq = counts[top] / runs
    assert abs(freq - q[top]) <= 5 * math.sqrt(q[top] * (1 - q[top]) / runs) + 1.5 / runs, (
        f"Drafter.propose at temperature 2, {runs} draws: the draft's likeliest token {top} has q = {q[top]:.3f} but "
        f"came {freq:.3f} of the time: each draft is a draw from q with rng"
        + (" (your drafts are the argmax at every temperature)" if freq == 1.0 else ""))


def _residual(p, q):
    r = np.maximum(p - q, 0)
    return r / r.sum()


SAMPLING_MISTAKES = {  # what a biased rule's tokens follow
    "the draft's distribution q: every drafted token was accepted": Q,
    "the distribution of accepting with probability p(token) instead of min(1, p/q)":
        Q * P + (1 - (Q * P).sum()) * _residual(P, Q),
    "the distribution of resampling from p itself on a rejection (the residual norm(max(0, p − q)) belongs there)":
        np.minimum(P, Q) + (1 - np.minimum(P, Q).sum()) * P,
}


def test_accept_or_resample_keeps_the_target_distribution():
    rng = np.random.default_rng(2024)
    drafted = rng.choice(len(Q), size=DRAWS, p=Q)
    tokens, accepted = I.accept_or_resample(np.tile(P, (DRAWS, 1)), np.tile(Q, (DRAWS, 1)), drafted,
                                            np.random.default_rng(7))
    tokens = assert_ndarray(tokens, "accept_or_resample's tokens", dtype="iu", shape=(DRAWS,))
    accepted = assert_ndarray(accepted, "accept_or_resample's accepted", dtype=bool, shape=(DRAWS,))
    freq = np.bincount(np.clip(tokens, 0, len(P) - 1), minlength=len(P)) / DRAWS

    def fits(p):
        return bool((np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / DRAWS) + 1.5 / DRAWS).all())

    if not fits(P):
        named = next((f" Your result matches {label}." for label, p in SAMPLING_MISTAKES.items() if fits(p)), "")
        raise AssertionError(f"speculative sampling must keep the target's distribution p = {P.tolist()}: {DRAWS} "
                             f"tokens drafted from q = {Q.tolist()} came out with frequencies {freq.round(4).tolist()}."
                             f"{named} Accept with probability min(1, p/q), else draw from norm(max(0, p − q))")
    rate = np.minimum(P, Q).sum()
    assert abs(accepted.mean() - rate) <= 5 * math.sqrt(rate * (1 - rate) / DRAWS), (
        f"a draft is accepted with probability min(1, p/q): on average Σ min(p, q) = {rate:.2f} of them, got "
        f"{accepted.mean():.4f}")
    kept = tokens[accepted]
    assert np.array_equal(kept, drafted[accepted]), "an accepted draft must come out as the drafted token itself"


def test_accept_or_resample_single_row_cases():
    p, q = np.array([0.6, 0.4, 0.0]), np.array([0.2, 0.4, 0.4])
    token, ok = I.accept_or_resample(p, q, 1, np.random.default_rng(0))
    assert bool(ok) and int(token) == 1, (f"p(1) = 0.4 ≥ q(1) = 0.4: the drafted token 1 is always accepted "
                                          f"(min(1, p/q) = 1), got token {token}, accepted {ok}")
    for seed in range(5):
        token, ok = I.accept_or_resample(p, q, 2, np.random.default_rng(seed))
        assert not bool(ok) and int(token) == 0, (
            f"p(2) = 0: the drafted token 2 is always rejected, and the replacement comes from the residual "
            f"norm(max(0, p − q)) = [1, 0, 0], so it is token 0; got token {token}, accepted {ok}")


def test_accept_or_resample_draws_one_number_per_row_then_one_more_per_row():
    """The README's order of random numbers: rng.random(shape) for the acceptance tests, then rng.random(shape) again
    for the residual's draws, every row included (the accepted ones ignore theirs)."""
    drafted = np.array([1, 3, 0, 2, 5, 4, 1, 0])
    n = len(drafted)
    u = np.random.default_rng(21).random(n)  # the acceptance numbers the generator gives first
    rng = np.random.default_rng(21)
    _, accepted = I.accept_or_resample(np.tile(P, (n, 1)), np.tile(Q, (n, 1)), drafted, rng)
    accepted = assert_ndarray(accepted, "accept_or_resample's accepted", dtype=bool, shape=(n,))
    expected = u < np.minimum(1, P[drafted] / Q[drafted])
    assert accepted.tolist() == expected.tolist(), (
        f"with rng.random({n}) first, the drafts {drafted.tolist()} are accepted where u < min(1, p/q): "
        f"{expected.tolist()}; got {accepted.tolist()}: draw the acceptance numbers first, one per row, in one call")
    after = np.random.default_rng(21)
    after.random(2 * n)
    nxt = rng.random()
    assert nxt == after.random(), (
        f"accept_or_resample on {n} rows must take exactly 2·{n} numbers from rng: rng.random(shape) for the "
        f"acceptance tests, then rng.random(shape) for the residual's draws, one for every row, accepted or not "
        f"(the generator's next number after the call is not the {2 * n + 1}th)")


def test_speculative_sample_accepts_every_draft_of_the_target_itself():
    f = load_fixture(LAB, "speculative")
    model = _model()
    tokens, stats = I.speculative_sample(model, _model(), f["prompt_0"], 12, k=3, rng=np.random.default_rng(3))
    tokens = assert_ndarray(tokens, "speculative_sample", dtype="iu", shape=(5 + 12,))
    assert np.array_equal(tokens[:5], f["prompt_0"]), "speculative_sample's tokens must start with the prompt"
    assert 0 <= tokens.min() and tokens.max() < V, "speculative_sample drew ids outside the vocabulary"
    assert stats["proposed"] > 0 and stats["accepted"] == stats["proposed"], (
        f"with the target as its own draft p = q, so min(1, p/q) = 1: every draft is accepted, got {stats}")
    assert stats["rounds"] == 3, f"12 tokens at k = 3: 3 rounds of 3 drafts + 1 bonus token, got {stats['rounds']} rounds"


def _same_tokens(got, expected, diagnoses, what, hint):
    """Token ids against the expected ones; a result of another length is also compared with the diagnoses."""
    __tracebackhide__ = True
    got = assert_ndarray(got, what, dtype="iu")
    if got.shape != expected.shape:
        for label, wrong in diagnoses.items():
            if wrong.shape == got.shape and np.array_equal(wrong, got):
                raise AssertionError(f"{what}: {len(got)} tokens, expected {len(expected)}. Your result matches {label}")
        raise AssertionError(f"{what}: {len(got)} tokens, expected {len(expected)} ({expected.tolist()}), got "
                             f"{got.tolist()}; {hint}")
    assert_close(got, expected, atol=0, rtol=0, diagnoses=diagnoses, what=what, hint=hint)


COLD = 1e-6  # make_fixtures.COLD: so cold that p and q are one-hot, and sampling is greedy


def test_cold_speculative_sampling_rejects_and_resamples_like_greedy():
    """At temperature 1e-6 every p and q is one-hot: a draft is accepted exactly when it is the target's greedy
    token, a rejection's residual draw is the target's greedy token, and the tokens and counts are speculative
    greedy decoding's, whatever the random numbers."""
    f = load_fixture(LAB, "speculative")
    k = int(f["k_near"])
    with _speculating(f"speculative_sample(target, draft, prompt, {SPEC_NEW}, k={k}, temperature=1e-6)"):
        tokens, stats = I.speculative_sample(_model(), _draft("near"), f["prompt_0"], SPEC_NEW, k=k, temperature=COLD,
                                             rng=np.random.default_rng(5))
    hint = ("p and q are softmax(logits / temperature) at the temperature given; on the first rejection the "
            "residual's draw is emitted and the round ends; the target's cache is cut back to the tokens kept")
    _same_tokens(tokens, f["cold_tokens"], stored_diagnoses(f, "cold_tokens"), hint=hint,
                 what="speculative_sample at temperature 1e-6 with a draft near the target (p and q one-hot: the "
                      "target's greedy tokens)")
    assert isinstance(stats, dict) and {"proposed", "accepted", "rounds"} <= set(stats), \
        f"speculative_sample returns (tokens, stats) with stats {{'proposed', 'accepted', 'rounds'}}, got {stats!r}"
    assert_close(np.array([stats["proposed"], stats["accepted"], stats["rounds"]]), f["cold_counts"], atol=0, rtol=0,
                 diagnoses=stored_diagnoses(f, "cold_counts"), hint=hint,
                 what="(proposed, accepted, rounds) of speculative_sample at temperature 1e-6 (those of speculative "
                      "greedy decoding with the same draft)")


LOOKUP_RUNS = 400


def test_speculative_sampling_with_prompt_lookup_follows_the_target():
    """Prompt lookup proposes one token d (its q one-hot); at temperature 0.5 the first new token must still follow
    the target's p: d with probability p(d), accepted with probability p(d)."""
    f = load_fixture(LAB, "speculative")
    model = _model()
    prompt, d, p, p1 = f["sample_prompt"], int(f["sample_draft"][0]), f["sample_p"], f["sample_p1"]
    rng = np.random.default_rng(11)
    firsts, accepted, proposed = [], 0, 0
    for _ in range(LOOKUP_RUNS):
        tokens, stats = I.speculative_sample(model, None, prompt.copy(), 2, k=1, ngram=2, temperature=0.5, rng=rng)
        tokens = assert_ndarray(tokens, "speculative_sample's tokens", dtype="iu", shape=(len(prompt) + 2,))
        firsts.append(int(tokens[len(prompt)]))
        accepted += int(stats["accepted"])
        proposed += int(stats["proposed"])
    assert proposed == LOOKUP_RUNS, (
        f"after the prompt {prompt.tolist()} prompt lookup (ngram=2) proposes one token, {d}, in each run's first "
        f"round (2 new tokens: one draft at most); {LOOKUP_RUNS} runs proposed {proposed}")
    freq = float(np.mean(np.array(firsts) == d))
    V = len(p)

    def fits(x):
        return abs(freq - x) <= 5 * math.sqrt(x * (1 - x) / LOOKUP_RUNS) + 1.5 / LOOKUP_RUNS

    if not fits(p[d]):
        mistakes = {f"a uniform q = 1/V for prompt lookup's draft (a deterministic draft's q is one-hot): it is "
                    f"accepted with probability min(1, V·p(d)) = {min(1.0, V * p[d]):.2f}": min(1.0, V * p[d]),
                    f"p taken at temperature 1 ({p1[d]:.2f}) instead of the temperature given (0.5)": p1[d]}
        named = next((f" Your result matches {label}." for label, x in mistakes.items() if fits(x)), "")
        raise AssertionError(
            f"speculative_sample(target, None, prompt, 2, k=1, ngram=2, temperature=0.5), {LOOKUP_RUNS} runs: prompt "
            f"lookup proposes {d}, which the target gives p = {p[d]:.3f} at temperature 0.5; the first new token was "
            f"{d} in {freq:.3f} of the runs.{named} The draft's q is one-hot, so {d} is accepted with probability "
            f"min(1, p/q) = p({d}), and a rejection draws from the residual max(0, p − q)")
    rate = accepted / LOOKUP_RUNS
    assert fits(p[d]) and abs(rate - p[d]) <= 5 * math.sqrt(p[d] * (1 - p[d]) / LOOKUP_RUNS) + 1.5 / LOOKUP_RUNS, (
        f"prompt lookup's draft {d} (q one-hot) is accepted with probability min(1, p/q) = p({d}) = {p[d]:.3f}; "
        f"it was accepted in {rate:.3f} of {LOOKUP_RUNS} runs")


# --- weight-only int8 -------------------------------------------------------------------------------------

def test_quantize_int8_scales_per_block_and_rounds_to_nearest():
    f = load_fixture(LAB, "int8")
    W = f["W"]
    q, scales = I.quantize_int8(W, 16)
    q = assert_ndarray(q, "quantize_int8's q", dtype=np.int8, shape=W.shape)
    scales = assert_ndarray(scales, "quantize_int8's scales", dtype=np.float32, shape=(5, 24))
    assert_close(scales, f["scales"], diagnoses=stored_diagnoses(f, "scales"), atol=0, rtol=1e-5,
                 what="the scales of a (70, 24) weight in blocks of 16 rows (max |W| of each block of each column / 127)")
    s = np.repeat(scales, 16, axis=0)[:70]
    err = np.abs(W - q.astype(np.float32) * s)
    bad = err > s / 2 * (1 + 1e-5) + 1e-12
    assert not bad.any(), (f"|W − q·scale| must be at most scale / 2 (q = W / scale rounded to the nearest integer); "
                           f"{int(bad.sum())} of {W.size} elements are further, up to {float((err / np.maximum(s, 1e-30)).max()):.2f} "
                           f"scales")


def test_a_block_of_zeros_quantises_to_zeros_without_dividing_by_zero():
    W = np.zeros((20, 3), dtype=np.float32)
    W[:, 0] = np.linspace(-1, 1, 20)
    W[8:16, 2] = 0.5  # column 1 all zeros, column 2 zeros but in the second block
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        q, scales = I.quantize_int8(W, 8)
    q = assert_ndarray(q, "quantize_int8's q", dtype=np.int8, shape=(20, 3))
    scales = assert_ndarray(scales, "quantize_int8's scales", dtype=np.float32, shape=(3, 3))
    assert (scales[:, 1] == 0).all() and scales[0, 2] == 0 and scales[2, 2] == 0, (
        f"a block of zeros gets scale 0; the scales of a (20, 3) weight in blocks of 8 rows, column 1 all zeros and "
        f"column 2 zeros but in rows 8 … 15, are {scales.tolist()}")
    assert (q[:, 1] == 0).all() and (q[:8, 2] == 0).all() and (q[16:, 2] == 0).all(), (
        f"a block of zeros quantises to q = 0; got column 1 {q[:, 1].tolist()}, column 2 {q[:, 2].tolist()}")
    divided = [w for w in seen if issubclass(w.category, RuntimeWarning)]
    assert not divided, (
        f"quantize_int8 on a weight with blocks of zeros warned {str(divided[0].message)!r}: 0 / 0 is NaN before "
        f"it is cast. Your result matches a block of zeros divided by its scale 0: divide by 1 where the scale is "
        f"0 (np.where(scales > 0, scales, 1)), so that q is 0 there")


def test_dequantize_int8_multiplies_each_block_by_its_scale():
    f = load_fixture(LAB, "int8")
    out = I.dequantize_int8(f["q"], f["scales"], 16)
    assert_ndarray(out, "dequantize_int8", dtype=np.float32, shape=(70, 24))
    assert_close(out, f["dequantised"], diagnoses=stored_diagnoses(f, "dequantised"),
                 what="dequantize_int8 of a (70, 24) weight in blocks of 16 rows (row r uses block r // block)")


def test_int8_linear_matches_the_dequantised_product():
    f = load_fixture(LAB, "int8")
    L3 = lab("layers")
    linear = L3.Linear(70, 24, rng=np.random.default_rng(0))
    linear.weight, linear.bias = f["W"], f["bias"]
    layer = I.Int8Linear(linear, 16)
    out = layer(f["x"])
    assert_ndarray(out, "Int8Linear(x (3, 5, 70))", dtype=np.float32, shape=(3, 5, 24))
    assert_close(out, f["linear_out"], diagnoses=stored_diagnoses(f, "linear_out"), atol=1e-4,
                 what="Int8Linear(x) = x @ dequantised W + bias (every block of rows times its own scale)")
    exact = f["x"] @ f["W"] + f["bias"]
    rel = float(np.abs(out - exact).max() / np.abs(exact).max())
    assert rel < 0.02, f"Int8Linear differs from the float32 Linear by {rel:.3f} of its largest output"


def test_int8_linear_dequantises_whole_blocks_tile_by_tile():
    """A weight of many tiles: each tile is whole blocks of rows, each block times its own scales, and the whole
    float32 weight never exists (its peak memory stays under half of that weight's bytes)."""
    L3 = lab("layers")
    rng = np.random.default_rng(9)
    d_in, d_out, block = 6000, 160, 16  # 3.8 MB as float32, about 15 tiles of TILE_ELEMENTS numbers
    linear = L3.Linear(d_in, d_out, rng=rng)
    W = (rng.standard_normal((d_in, d_out)) * np.repeat(rng.uniform(0.1, 10, (d_in // block, 1)), block, axis=0))
    linear.weight, linear.bias = W.astype(np.float32), rng.standard_normal(d_out).astype(np.float32)
    layer = I.Int8Linear(linear, block)
    qw = assert_ndarray(layer.qweight, "Int8Linear.qweight", dtype=np.int8, shape=(d_in, d_out))
    sc = assert_ndarray(layer.scales, "Int8Linear.scales", dtype=np.float32, shape=(d_in // block, d_out))
    x = rng.standard_normal((4, d_in)).astype(np.float32)
    expected = x.astype(np.float64) @ (qw * np.repeat(sc, block, axis=0).astype(np.float64)) + linear.bias
    out, peak = I.peak_memory(layer, x)
    out = assert_ndarray(out, f"Int8Linear({d_in}, {d_out}) of x (4, {d_in})", dtype=np.float32, shape=(4, d_out))
    assert_close(out, expected.astype(np.float32), atol=1e-2, rtol=1e-3,  # sums of 6000 float32 terms, about 400
                 what=f"Int8Linear(x) on a ({d_in}, {d_out}) weight in blocks of {block} rows, many tiles",
                 hint="each tile holds whole blocks of rows (a multiple of block), so that every block is multiplied "
                      "by its own scales: a tile that starts inside a block shifts the scales of every block after it")
    whole = d_in * d_out * 4  # the float32 weight's bytes
    assert peak <= whole // 2, (
        f"Int8Linear on a ({d_in}, {d_out}) weight held {peak / 1e6:.2f} MB at its peak (at most half the float32 "
        f"weight's {whole / 1e6:.2f} MB allowed): the whole float32 weight must never exist; dequantise a tile of "
        f"whole blocks (about TILE_ELEMENTS numbers) at a time and accumulate x[:, rows] @ tile")


def test_quantize_model_without_the_head_keeps_the_token_table():
    f = load_fixture(LAB, "int8")
    model = _model()
    table = np.asarray(model.wte.weight).copy()
    I.quantize_model(model, 8, head=False)
    assert_close(np.asarray(model.wte.weight), table, atol=0, rtol=0,
                 what="wte's table after quantize_model(model, 8, head=False) (the float32 table, untouched)",
                 hint="head=False swaps only the blocks' Linears; wte becomes an Int8Embedding only with head=True")
    qw = getattr(model.h[0].attn.c_attn, "qweight", None)
    assert isinstance(qw, np.ndarray) and qw.dtype == np.int8, "head=False still swaps every block's Linears"
    logits = I.fast_forward(model, f["ids"])
    err = float(np.abs(logits - f["float_logits"]).max() / np.abs(f["float_logits"]).max())
    assert err < 0.05, f"int8 blocks with a float32 head moved the logits by {err:.3f} of their largest value"


def test_quantize_model_swaps_every_linear_and_keeps_the_logits_close():
    f = load_fixture(LAB, "int8")
    model = I.quantize_model(_model(), 8)
    for i in range(LAYERS):
        block = model.h[i]
        for name, layer in (("attn.c_attn", block.attn.c_attn), ("attn.c_proj", block.attn.c_proj),
                            ("mlp.c_fc", block.mlp.c_fc), ("mlp.c_proj", block.mlp.c_proj)):
            qw = getattr(layer, "qweight", None)
            assert isinstance(qw, np.ndarray) and qw.dtype == np.int8, (
                f"after quantize_model, h.{i}.{name} must be an Int8Linear (every Linear of every block), "
                f"its weights int8 in qweight")
    logits = I.fast_forward(model, f["ids"])
    assert_close(logits, f["logits"], diagnoses=stored_diagnoses(f, "logits"), atol=1e-4,
                 what="the int8 model's logits (blocks of 8; fast_forward)")
    err = float(np.abs(logits - f["float_logits"]).max() / np.abs(f["float_logits"]).max())
    assert err < 0.05, f"int8 weights moved the logits by {err:.3f} of their largest value: more than rounding"
