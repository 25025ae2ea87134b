"""Hidden checks for lab 12: shapes and settings the public tests do not use, against
independent computations written here or the student's own earlier labs (lab 04's model,
lab 06's greedy ``generate``); no stored answers."""

import math

import numpy as np

from gptkit.checkpoints import GPT2Shape, random_gpt2_state
from gptkit.testing import assert_close, lab
from gptkit.testing.parameters import set_parameters

I = lab("inference")
G = lab("gpt")
S = lab("generation")
SHAPE = GPT2Shape(vocab_size=29, d_model=24, num_layers=2, num_heads=4, max_seq_len=40, d_ff=40)


def _model(seed, state=None):
    rng = np.random.default_rng(seed)
    state = random_gpt2_state(SHAPE, rng) if state is None else state
    return set_parameters(G.GPTModel(**SHAPE.model_kwargs(), rng=rng), state, "GPTModel"), state


def _attention64(q, k, v):
    T, S_ = q.shape[-2], k.shape[-2]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    s = np.where(np.arange(S_)[None, :] <= (S_ - T + np.arange(T))[:, None], s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def test_tiled_attention_keeps_float64_exactly():
    rng = np.random.default_rng(1201)
    q, k, v = rng.normal(0, 3, (3, 21, 5)), rng.normal(size=(3, 30, 5)), rng.normal(size=(3, 30, 2))
    out = I.tiled_causal_attention(q, k, v, block_q=6, block_k=5)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64, "float64 in gives float64 out"
    assert_close(out, _attention64(q, k, v), atol=1e-12, rtol=1e-10, what="tiled attention in float64")


def test_fast_forward_on_another_shape():
    model, _ = _model(1202)
    ids = np.random.default_rng(1203).integers(0, SHAPE.vocab_size, (3, 37))
    assert_close(I.fast_forward(model, ids, block_q=5, block_k=9), model(ids), atol=1e-4,
                 what="fast_forward, 4 heads, d_ff=40, T=37 in tiles of 5 × 9")


def test_many_requests_through_few_slots_equal_greedy_alone():
    model, _ = _model(1204)
    rng = np.random.default_rng(1205)
    lengths, budgets = [1, 6, 2, 9, 4, 3, 1], [5, 3, 8, 2, 7, 4, 6]
    prompts = [rng.integers(0, SHAPE.vocab_size, n) for n in lengths]
    for slots in (1, 3):
        dec = I.BatchedDecoder(model, slots)
        for p, n in zip(prompts, budgets):
            dec.submit(p, n)
        done = dec.run()
        for rid, (p, n) in enumerate(zip(prompts, budgets)):
            expected = S.generate(model, p[None], n, temperature=0)[0]
            assert np.array_equal(done[rid], expected), (
                f"{slots} slot(s): request {rid} (prompt of {len(p)}) got {done[rid].tolist()}, "
                f"greedy alone gives {expected.tolist()}")


def test_speculative_greedy_with_any_k():
    model, state = _model(1206)
    rng = np.random.default_rng(1207)
    near_state = {k: (v + 0.1 * v.std() * rng.standard_normal(v.shape)).astype(np.float32) for k, v in state.items()}
    near, _ = _model(1208, near_state)
    prompt = rng.integers(0, SHAPE.vocab_size, 4)
    expected = S.generate(model, prompt[None], 30, temperature=0)[0]
    for k in (1, 2, 6):
        for draft in (near, None):
            tokens, stats = I.speculative_greedy(model, draft, prompt, 30, k=k, ngram=2)
            assert np.array_equal(tokens, expected), f"k={k}, {'near draft' if draft else 'prompt lookup'}: not greedy"
            assert 0 <= stats["accepted"] <= stats["proposed"] and stats["rounds"] <= 30


def test_accept_or_resample_row_by_row():
    rng = np.random.default_rng(1209)
    p = rng.dirichlet(np.ones(5), size=3)
    q = rng.dirichlet(np.ones(5), size=3)
    n = 40000
    drafted = np.stack([rng.choice(5, size=n, p=q[r]) for r in range(3)], axis=1)  # (n, 3)
    tokens, accepted = I.accept_or_resample(np.broadcast_to(p, (n, 3, 5)).copy(), np.broadcast_to(q, (n, 3, 5)).copy(),
                                            drafted, np.random.default_rng(1210))
    for r in range(3):
        freq = np.bincount(tokens[:, r], minlength=5) / n
        ok = np.abs(freq - p[r]) <= 5 * np.sqrt(p[r] * (1 - p[r]) / n) + 1.5 / n
        assert ok.all(), f"row {r}: frequencies {freq.round(4)} against the target's {p[r].round(4)}"
        rate = np.minimum(p[r], q[r]).sum()
        assert abs(accepted[:, r].mean() - rate) <= 5 * math.sqrt(rate * (1 - rate) / n) + 1e-9


def test_int8_with_one_short_block_and_no_bias():
    rng = np.random.default_rng(1211)
    W = rng.normal(0, 0.3, (50, 9)).astype(np.float32)
    W[:, 4] = 0.0
    q, scales = I.quantize_int8(W, 64)
    assert q.dtype == np.int8 and scales.shape == (1, 9) and scales[0, 4] == 0
    expected = np.abs(W).max(axis=0) / 127
    assert_close(scales[0], expected.astype(np.float32), atol=0, rtol=1e-6, what="one block's scales")
    assert np.all(np.abs(W - q * scales[0]) <= scales[0] / 2 * (1 + 1e-5) + 1e-12)
    L3 = lab("layers")
    linear = L3.Linear(50, 9, bias=False, rng=rng)
    linear.weight = W
    x = rng.normal(size=(7, 50)).astype(np.float32)
    assert_close(I.Int8Linear(linear, 64)(x), x @ (q.astype(np.float32) * scales[0]), atol=1e-5,
                 what="Int8Linear without a bias on a 2-D x")


def test_prompt_lookup_edges():
    assert I.prompt_lookup_draft(np.array([5]), 3).tolist() == [], "one token has nothing before it to match"
    assert I.prompt_lookup_draft(np.array([2, 8, 2]), 5, ngram=1).tolist() == [8, 2]
    assert I.prompt_lookup_draft(np.array([1, 2, 9, 1, 2]), 1, ngram=4).tolist() == [9]


def test_profile_of_a_one_block_model():
    shape = GPT2Shape(vocab_size=11, d_model=8, num_layers=1, num_heads=2, max_seq_len=8)
    rng = np.random.default_rng(1212)
    model = set_parameters(G.GPTModel(**shape.model_kwargs(), rng=rng), random_gpt2_state(shape, rng), "GPTModel")
    table = I.profile_forward(model, rng.integers(0, 11, (1, 5)), repeats=1)
    names = [name for name, _ in table]
    assert names == ["embeddings", "h.0.ln_1", "h.0.attn", "h.0.ln_2", "h.0.mlp", "ln_f", "head", "total"], names
    assert math.isclose(table[-1][1], sum(s for _, s in table[:-1]), rel_tol=1e-9, abs_tol=1e-12)
