"""Lab 12 · every core: row blocks, a thread pool whose threads take the blocks one at a
time while BLAS is held to one thread, and the fast forward with its work between the
products on that pool.

Nothing is timed: the blocks are checked against how they are stated (in order, covering
every row once, sizes within one row, as many as asked or as ``min_rows`` allows), the pool
for running each block exactly once with BLAS at one thread (and BLAS's count restored
after), and for letting its free threads, the calling one too, take the blocks of a thread
that is stuck (the given ``BlockLog(hold=…)`` holds one pool thread's block until the others
are done: a pool that handed blocks out in advance leaves it waiting, and the log gives up
with an error after a few seconds, a guard against a hang rather than a timing); the
threaded forward for giving fast_forward's logits (within float32 rounding: a product cut
into blocks may round differently) and for handing all its work, the products too,
out in the maps its docstring names. The tests pass whatever the machine's cores:
a pool of three threads on one core runs the same blocks, only not at the same time.
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gptkit.testing import (arguments_written_back, assert_close, explains_errors, fixture_params, lab, load_fixture,
                            raises_clearly)
from gptkit.testing.parameters import set_parameters

I = lab("inference")
G = lab("gpt")
LAB = "12_inference"
V, D, LAYERS, HEADS, L = 40, 16, 2, 2, 48  # the fixtures' model (test_inference.py's)


def _model():
    f = load_fixture(LAB, "model")
    kwargs = dict(vocab_size=V, d_model=D, num_layers=LAYERS, num_heads=HEADS, d_ff=4 * D, max_seq_len=L)
    model = G.GPTModel(**kwargs, rng=np.random.default_rng(1))
    return set_parameters(model, fixture_params(f, "param."), "GPTModel(the fixtures' shape)"), f


def _expected_blocks(n, parts, min_rows):
    if n == 0:
        return []
    count = max(1, min(parts, n // min_rows))
    sizes = [n // count + (1 if i < n % count else 0) for i in range(count)]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


# --- row blocks -----------------------------------------------------------------------------------------

def test_row_blocks_examples():
    assert I.row_blocks(10, 3) == [(0, 4), (4, 7), (7, 10)], \
        "row_blocks(10, 3): blocks that cover every row, 0 … 9, sizes 4, 3, 3, the larger first"
    assert I.row_blocks(10, 4, min_rows=4) == [(0, 5), (5, 10)], \
        "row_blocks(10, 4, min_rows=4): four blocks would hold fewer than 4 rows each, so two of 5"
    assert I.row_blocks(3, 8) == [(0, 1), (1, 2), (2, 3)], "row_blocks(3, 8): no block may be empty"
    assert I.row_blocks(5, 2, min_rows=16) == [(0, 5)], "row_blocks(5, 2, min_rows=16): at least one block"
    assert I.row_blocks(0, 4) == [], "row_blocks(0, 4): no rows, no blocks"
    with raises_clearly(ValueError, when="row_blocks(10, 0)", mentions="parts"):
        I.row_blocks(10, 0)


@given(st.integers(0, 5000), st.integers(1, 64), st.integers(1, 300))
def test_row_blocks_cover_every_row_once_in_even_blocks(n, parts, min_rows):
    got = I.row_blocks(n, parts, min_rows)
    got = [(int(a), int(b)) for a, b in got]
    assert got == _expected_blocks(n, parts, min_rows), (
        f"row_blocks({n}, {parts}, min_rows={min_rows}) gave {got[:6]}{' …' if len(got) > 6 else ''}: the blocks are "
        "consecutive, cover 0 … n−1, number min(parts, n // min_rows) (at least 1), and their sizes differ by at most "
        "one row, the larger first")


# --- the pool -------------------------------------------------------------------------------------------
# Each pool is closed in a finally, and what runs in its blocks is the lab's own BlockLog
# (given): under the grader the lab code runs in a process of its own, and a block must
# not call back into the tests from a pool thread.

def test_pool_runs_each_block_once_with_blas_at_one_thread():
    before = I.blas_threads(2)  # a count the map has to change and then restore
    held = I.blas_threads()  # 2, or 1 where this BLAS runs on one thread only (or cannot be set)
    pool = I.RowPool(3, min_rows=4, blocks_per_thread=2)
    try:
        for n, min_rows in ((100, None), (9, None), (9, 1), (2, 1)):
            log = I.BlockLog()
            with explains_errors(f"RowPool(3, min_rows=4, blocks_per_thread=2).map(fn, {n}, min_rows={min_rows})",
                                 "map calls fn(start, stop) once per block of row_blocks"):
                pool.map(log, n, min_rows=min_rows)
            seen = [tuple(c) for c in log.calls]
            want = _expected_blocks(n, 3 * 2, 4 if min_rows is None else min_rows)
            ran = sorted((a, b) for a, b, _, _ in seen)
            twice = sorted({b for b in ran if ran.count(b) > 1})
            skipped = [b for b in want if b not in ran]
            assert ran == want, (
                (f"run more than once: {twice} (two workers took the same block: each number of the shared counter "
                 "must go to one worker only). " if twice else "")
                + (f"never run: {skipped} (the workers must take every block, from the first, until none is left). "
                   if skipped else "")
                + f"RowPool(3, min_rows=4, blocks_per_thread=2).map(fn, {n}, min_rows={min_rows}) called fn on {ran}; "
                f"want each block of row_blocks({n}, 3 × 2, {4 if min_rows is None else min_rows}) exactly once: "
                f"{want}")
            assert [tuple(b) for b in pool.last_blocks] == want, \
                "RowPool.map records the blocks it handed out in last_blocks, in order of their rows"
            assert all(b == 1 for *_, b in seen), (
                f"BLAS ran at {[b for *_, b in seen]} threads inside the blocks: hold it at one thread "
                "(blas_threads(1)) while the blocks run, or each worker's products start their own threads")
            assert I.blas_threads() == held, \
                f"after map, BLAS is back at its count before ({held}), not {I.blas_threads()}"
    finally:
        pool.close()
        I.blas_threads(before)


def test_pool_hands_out_more_blocks_than_threads_by_default():
    pool = I.RowPool(2)
    try:
        log = I.BlockLog()
        pool.map(log, 1000)
        per_thread = pool.blocks_per_thread
    finally:
        pool.close()
    want = _expected_blocks(1000, 2 * per_thread, 16)
    assert per_thread > 1, (
        f"RowPool(2).blocks_per_thread is {per_thread}: by default a map cuts its rows into several blocks per thread, "
        "so that a free thread can take over blocks a slow one has not reached")
    assert sorted((a, b) for a, b, _, _ in log.calls) == want and [tuple(b) for b in pool.last_blocks] == want, (
        f"RowPool(2).map(fn, 1000) ran {sorted((a, b) for a, b, _, _ in log.calls)[:8]} …; want each block of "
        f"row_blocks(1000, 2 × blocks_per_thread = {2 * per_thread}, min_rows=16) once: {want[:8]} …")
    many = I.RowPool(16)
    try:
        wide = many.blocks_per_thread
    finally:
        many.close()
    assert (per_thread, wide) == (4, 1), (
        f"RowPool(2) and RowPool(16) cut {per_thread} and {wide} blocks per thread by default; the README gives "
        "8 // threads, at least 1 (4 on 2 threads, 1 from 8 threads on)")


def test_a_free_thread_takes_the_blocks_of_a_stuck_one():
    for threads in (2, 3):
        pool = I.RowPool(threads, min_rows=1, blocks_per_thread=4)
        try:
            n = 4 * threads
            log = I.BlockLog(hold=n - 1)  # the first block a pool thread takes waits for all the others
            with explains_errors(f"RowPool({threads}, min_rows=1, blocks_per_thread=4).map(fn, {n}) with one pool "
                                 "thread stuck on its first block",
                                 "every thread, the calling one too, takes the next block nobody has taken, until "
                                 "none is left"):
                pool.map(log, n)
        finally:
            pool.close()
        ran = sorted((a, b) for a, b, _, _ in log.calls)
        assert ran == _expected_blocks(n, n, 1), (
            f"with one pool thread stuck, RowPool({threads}).map(fn, {n}) ran {ran}: want each of the {n} one-row "
            "blocks once")
        # With one pool thread, held on its block, only the calling thread can run the others.
        # (With two, the second may take them all before the calling thread starts: no check.)
        assert threads > 2 or any(here for _, _, here, _ in log.calls), (
            "no block ran in the calling thread: it takes blocks too (the pool has threads − 1 threads, and "
            "the calling thread would only wait)")


def test_pool_raises_a_blocks_error_and_restores_blas():
    before = I.blas_threads(2)
    held = I.blas_threads()
    pool = I.RowPool(2, min_rows=1)
    try:
        with raises_clearly(ZeroDivisionError, when="map of a fn that raises in the pool's block"):
            pool.map(I.BlockLog(fail_at=0), 4)
        assert I.blas_threads() == held, "after a block raised, BLAS is back at its count before (try/finally)"
    finally:
        pool.close()
        I.blas_threads(before)


def test_one_thread_runs_in_the_calling_thread():
    pool = I.RowPool(1)
    try:
        log = I.BlockLog()
        pool.map(log, 50)
    finally:
        pool.close()
    seen = [tuple(c) for c in log.calls]
    assert [(a, b) for a, b, _, _ in seen] == [(0, 50)], \
        "a pool of one thread runs one block, all rows (there is no other thread to hand blocks to)"
    assert seen[0][2], "a pool of one thread runs its block in the calling thread"


# --- the threaded forward -------------------------------------------------------------------------------

def test_threaded_forward_equals_the_single_threaded_one():
    model, f = _model()
    ids = f["ids"]
    B, T = ids.shape
    single = I.fast_forward(model, ids, block_q=8, block_k=8)
    for threads, per_thread in ((1, 4), (2, 1), (2, 4), (3, 3), (5, 2)):
        pool = I.RowPool(threads, min_rows=4, blocks_per_thread=per_thread)
        try:
            with explains_errors(f"threaded_forward(model, ids ({B}, {T}), RowPool({threads}), block_q=8, block_k=8)",
                                 "the same layers as fast_forward, the work between products in pool.map"):
                got = I.threaded_forward(model, ids, pool, block_q=8, block_k=8)
        finally:
            pool.close()
        assert_close(got, single, what=f"threaded_forward with {threads} thread(s) against fast_forward", atol=1e-5)
        assert_close(got, f["logits"], what=f"threaded_forward with {threads} thread(s) (lab 04's model(ids) is the "
                     "reference)", atol=1e-4)
    out = np.full((B, T, V), np.nan, np.float32)
    pool = I.RowPool(2)
    try:
        with arguments_written_back():
            got = I.threaded_forward(model, ids, pool, out=out)
    finally:
        pool.close()
    assert_close(out, f["logits"], what="the logits threaded_forward wrote into out", atol=1e-4,
                 hint="with out given, write the logits into it (np.matmul(..., out=...)) and return it")
    assert_close(got, out, what="what threaded_forward(..., out=out) returns: out itself, holding the logits", atol=0)


def test_threaded_forward_hands_its_work_to_the_pool():
    model, f = _model()
    order = ("c_attn (3·D wide)", "the heads (B·H)", "the attention tasks", "attn.c_proj (D wide)",
             "bias + residual + ln_2 (B·T rows)", "c_fc (4·D wide)", "bias + GELU (B·T rows)",
             "mlp.c_proj (D wide)", "bias + residual + the next LayerNorm (B·T rows)")
    stated = ("ln_1 of block 0 over the B·T rows; per block: " + ", ".join(order) + "; the head (V wide); a "
              "product's map is over its B·T rows when there are at least as many rows as the weight has columns, "
              "else over those columns")
    for ids in (f["ids"], f["ids"][:1, :10]):  # more rows than most weights have columns; fewer than any
        B, T = ids.shape
        N = B * T
        pool = I.RowPool(3, min_rows=4, blocks_per_thread=2)
        try:
            I.threaded_forward(model, ids, pool, block_q=8, block_k=8)
            calls = [int(n) for n in pool.maps]
            last = [tuple(b) for b in pool.last_blocks]
        finally:
            pool.close()
        where = f"threaded_forward on ({B}, {T}) tokens (B·T = {N}, D = {D}, H = {HEADS}, V = {V})"
        assert len(calls) == 2 + 9 * LAYERS, (
            f"{where} made {len(calls)} pool.map calls ({calls}); its docstring states 1 + 9 per block + 1, every "
            f"product in the pool too (BLAS at one thread for the whole pass): {stated}")
        cut = [max(N, width) for width in (3 * D, D, 4 * D, D, V)]  # the larger side is cut
        sizes = (cut[0], B * HEADS, None, cut[1], N, cut[2], N, cut[3], N)
        for i in range(LAYERS):
            got = calls[1 + 9 * i: 10 + 9 * i]
            wrong = [f"{what}: a map over {n}, expected {size}" for what, n, size in zip(order, got, sizes)
                     if size is not None and n != size]
            assert not wrong, f"{where}: block {i}'s maps were {got}; in the order stated ({stated}): " + "; ".join(wrong)
        assert calls[0] == N, f"{where}: the first map is block 0's ln_1 over the {N} rows, got a map over {calls[0]}"
        share = max(4, cut[4] // 3)  # one block per thread: min_rows at least n // threads
        assert calls[-1] == cut[4] and last == _expected_blocks(cut[4], 3 * 2, share), (
            f"{where}: the last map (the head, _head with the pool) was over {calls[-1]} with the blocks {last}: "
            f"expected {cut[4]} ({'the rows' if cut[4] == N else 'the V columns of the logits'}) in one block per "
            f"thread, row_blocks({cut[4]}, 3 × 2, min_rows={share})")


def test_threaded_forward_checks_its_input():
    model, f = _model()
    pool = I.RowPool(2)
    try:
        logits = I.threaded_forward(model, f["ids"][:1, :10], pool)
        assert_close(logits, f["logits"][:1, :10], what="threaded_forward on the first 10 tokens of row 0", atol=1e-4)
        assert logits.dtype == np.float32 and logits.shape == (1, 10, V), \
            f"threaded_forward returns float32 (B, T, V) logits, got {logits.dtype} {logits.shape}"
        with raises_clearly(TypeError, when="threaded_forward with a pool that is not a RowPool", mentions="RowPool"):
            I.threaded_forward(model, f["ids"], None)
        with raises_clearly(ValueError, when=f"threaded_forward on {L + 1} tokens", mentions="max_seq_len"):
            I.threaded_forward(model, np.zeros((1, L + 1), np.int64), pool)
    finally:
        pool.close()
