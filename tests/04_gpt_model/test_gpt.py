"""Lab 04 · multi-head attention with GPT-2's fused q/k/v, the pre-norm block, GPTModel."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptkit.testing import (assert_causal, assert_close, assert_float32, assert_ndarray, assert_rejects_bad_x, first_difference,
                            fixture_params, lab, load_fixture, raises_clearly, stored_diagnoses)
from gptkit.testing.parameters import set_parameters

G = lab("gpt")
LAB = "04_gpt_model"
D, H, F = 12, 3, 20  # the fixtures' sizes: d_head = 4

# A failing comparison names the catalogued mistake it matches: the fixtures store what each
# bug in solutions/04_gpt_model/bugs.toml that lists the case in `diagnose` outputs, with
# the bug's concept as its label (`stored_diagnoses`).


def _mha(dropout=0.1):
    f = load_fixture(LAB, "mha")
    layer = G.MultiHeadAttention(D, H, dropout=dropout, rng=np.random.default_rng(1))
    return set_parameters(layer, fixture_params(f), f"MultiHeadAttention({D}, {H})"), f


def _block():
    f = load_fixture(LAB, "block")
    layer = G.TransformerBlock(D, H, F, dropout=0.1, rng=np.random.default_rng(1))
    return set_parameters(layer, fixture_params(f), f"TransformerBlock({D}, {H}, {F})"), f


def _model(case="model", dropout=0.1):
    f = load_fixture(LAB, case)
    p = fixture_params(f)
    V, Dm = p["wte.weight"].shape
    L = p["wpe.weight"].shape[0]
    layers = len({k.split(".")[1] for k in p if k.startswith("h.")})
    Fm = p["h.0.mlp.c_fc.weight"].shape[1]
    model = G.GPTModel(V, Dm, layers, H, Fm, L, dropout=dropout, rng=np.random.default_rng(1))
    return set_parameters(model, p, f"GPTModel(vocab_size={V}, d_model={Dm}, num_layers={layers})"), f


def _matches_reference(out, f, key, output_name, *, what, hint, locate=None, atol=1e-5, rtol=1e-4, mistakes=None):
    """``out`` must match the fixture's ``f[key]`` (naming the catalogued mistake it matches,
    or one of ``mistakes``, {label: what that mistake outputs}, and with ``locate`` the
    first place that differs) and be float32."""
    __tracebackhide__ = True
    assert_close(out, f[key], what=what, diagnoses={**stored_diagnoses(f, key), **(mistakes or {})}, hint=hint,
                 locate=locate, atol=atol, rtol=rtol)
    assert_float32(out, output_name)


# --- heads ---------------------------------------------------------------------------------

def test_split_heads_gives_each_head_its_columns():
    layer, _ = _mha()
    f = load_fixture(LAB, "heads")
    out = layer.split_heads(f["x"])
    assert_close(out, f["split"], what="split_heads(x) for x (2, 5, 12), 3 heads", atol=0, rtol=0,
                 diagnoses=stored_diagnoses(f, "split"),
                 hint="(B, T, D) → (B, H, T, d_head): head h gets columns h·d_head … (h+1)·d_head-1 of x")


def test_merge_heads_puts_head_h_back_at_its_columns():
    layer, _ = _mha()
    B, T, d = 2, 4, D // H
    x = np.zeros((B, H, T, d), np.float32)
    x += np.arange(H, dtype=np.float32)[None, :, None, None] * 100 + np.arange(d, dtype=np.float32)
    x += np.arange(T, dtype=np.float32)[None, None, :, None] * 10
    merged = assert_ndarray(layer.merge_heads(x.copy()), "merge_heads (B, H, T, d_head) → (B, T, D)",
                            dtype=np.float32, shape=(B, T, D))
    for c in range(D):
        h, j = divmod(c, d)
        if not np.array_equal(merged[:, :, c], x[:, h, :, j]):
            raise AssertionError(
                f"merge_heads: column {c} of the output must hold head {h}'s column {j}, but it holds "
                "other values: the heads are put back in the wrong order (move the head axis back next to "
                "d_head, then reshape)")


@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 6), st.integers(1, 3))
def test_merge_heads_inverts_split_heads(heads, d_head, T, B):
    layer = G.MultiHeadAttention(heads * d_head, heads, rng=np.random.default_rng(0))
    x = np.random.default_rng(T).normal(size=(B, T, heads * d_head)).astype(np.float32)
    split = assert_ndarray(layer.split_heads(x.copy()), "split_heads (B, T, D) → (B, H, T, d_head)",
                           dtype=np.float32, shape=(B, heads, T, d_head))
    assert_close(layer.merge_heads(split), x, what="merge_heads(split_heads(x))", atol=0, rtol=0,
                 hint="merge_heads must undo split_heads exactly")


# --- attention over all heads ---------------------------------------------------------------

def test_attend_matches_reference():
    layer, _ = _mha()
    f = load_fixture(LAB, "attend")
    out = layer.attend(f["q"], f["k"], f["v"])
    assert_close(layer.attend(f["q"], f["k"], f["v"]), out, what="attend(q, k, v) called twice in eval mode",
                 hint="the same inputs gave different outputs: dropout is active in eval mode, where it must be "
                      "the identity")
    q, k, v = (np.float64(f[n]) for n in "qkv")
    *_, T, d_head = q.shape

    def scaled(scale):  # causal attention with the scores multiplied by scale
        s = np.where(np.tril(np.ones((T, T), bool)), q @ k.swapaxes(-1, -2) * scale, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        return w / w.sum(-1, keepdims=True) @ v

    _matches_reference(out, f, "out", "attend output",
                       what="attend(q, k, v) for 3 heads of width 4, T = S = 7",
                       mistakes={"scores scaled by 1/√d_model (d_model = 12) instead of 1/√d_head": scaled(12 ** -0.5),
                                 "scores scaled by 1/d_head instead of 1/√d_head": scaled(1 / d_head),
                                 "scores not scaled: divide q·kᵀ by √d_head": scaled(1.0),
                                 "scores multiplied by √d_head instead of divided by it": scaled(d_head ** 0.5)},
                       hint="softmax(q·kᵀ/√d_head + causal mask) @ v, for every batch row and head at once")


def test_attend_with_fewer_queries_than_keys():
    layer, _ = _mha()
    f = load_fixture(LAB, "attend")
    out = layer.attend(f["q"][:, :, 4:], f["k"], f["v"])
    assert_close(out, f["out_T3"], what="attend for T = 3 queries over S = 7 keys",
                 hint="with S > T the queries are the last T positions: query i sits at position "
                      "S - T + i and sees keys 0 … S - T + i (lab 01's causal_mask(T, S))")


def _attention_float64(q, k, v):
    """softmax(q·kᵀ/√d_head + causal mask) @ v in float64; query i sits at position S - T + i."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    T, S = q.shape[-2], k.shape[-2]  # queries, keys
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])  # (B, H, T, S)
    future = np.arange(S)[None, :] > np.arange(S - T, S)[:, None]  # key j after query i's position
    scores[..., future] = -np.inf
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v


@pytest.mark.parametrize("T, S", [(300, 300), (200, 333)])
def test_attend_on_long_sequences(T, S):
    # Longer than any fixture: an implementation that works on the queries in blocks (or
    # in any other way) must give the plain formula's answer at every position.
    layer, _ = _mha()
    rng = np.random.default_rng(T + S)
    q = rng.normal(size=(1, H, T, D // H)).astype(np.float32)
    k, v = rng.normal(size=(2, 1, H, S, D // H)).astype(np.float32)
    expected = _attention_float64(q, k, v)  # before the call, from the test's own arrays
    out = layer.attend(q.copy(), k.copy(), v.copy())
    assert_close(out, expected, what=f"attend for T = {T} queries over S = {S} keys",
                 hint="softmax(q·kᵀ/√d_head + causal mask) @ v at every position; query i sits at "
                      "position S - T + i and sees keys 0 … S - T + i")
    assert_float32(out, "attend output")


@given(st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_attend_never_looks_at_future_keys(t, seed):
    layer, _ = _mha()
    f = load_fixture(LAB, "attend")
    q, k, v = f["q"], f["k"], f["v"]
    out = assert_ndarray(layer.attend(q.copy(), k.copy(), v.copy()), "attend(q, k, v)", dtype=np.float32,
                         shape=q.shape)
    rng = np.random.default_rng(seed)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, t + 1:] = rng.normal(size=k2[:, :, t + 1:].shape)
    v2[:, :, t + 1:] = rng.normal(size=v2[:, :, t + 1:].shape)
    assert_close(layer.attend(q, k2, v2)[:, :, : t + 1], out[:, :, : t + 1], what=f"attend outputs at positions 0…{t}",
                 atol=1e-6, hint=f"changing keys and values after position {t} changed earlier outputs: "
                                 "a query is attending to the future")


# --- MultiHeadAttention -------------------------------------------------------------------------

def _mha_with_blocks(f, order):
    """MultiHeadAttention(12, 3) of the fixture in float64, with c_attn's three blocks of
    width D read as q, k, v in ``order`` (the names of the blocks it takes for q, k, v)."""
    p = fixture_params(f)
    x = np.float64(f["x"])
    B, T, Dm = x.shape
    blocks = dict(zip("qkv", np.split(x @ p["c_attn.weight"] + p["c_attn.bias"], 3, axis=-1)))
    q, k, v = (blocks[name].reshape(B, T, H, Dm // H).transpose(0, 2, 1, 3) for name in order)
    s = np.where(np.tril(np.ones((T, T), bool)), q @ k.swapaxes(-1, -2) / np.sqrt(Dm // H), -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    out = (w / w.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(B, T, Dm)
    return out @ p["c_proj.weight"] + p["c_proj.bias"]


def test_multi_head_attention_matches_reference():
    layer, f = _mha()
    orders = ("qvk", "kqv", "kvq", "vqk", "vkq")
    _matches_reference(layer(f["x"]), f, "out", "MultiHeadAttention output",
                       what="MultiHeadAttention(12, 3) on x (2, 6, 12)",
                       mistakes={f"c_attn's blocks taken in the wrong order ({', '.join(o)} as q, k, v): GPT-2 "
                                 "stores q's block first, then k's, then v's": _mha_with_blocks(f, o) for o in orders},
                       hint="c_attn → split into q, k, v (blocks of width D) → split_heads → attend → "
                            "merge_heads → c_proj")


@given(st.integers(0, 4), st.integers(0, 2**32 - 1))
def test_multi_head_attention_is_causal(t, seed):
    layer, f = _mha()
    assert_causal(layer, f["x"], t, lambda shape: np.random.default_rng(seed).normal(size=shape),
                  what="MultiHeadAttention outputs")


def test_multi_head_attention_rejects_bad_input():
    layer, f = _mha()
    layer(f["x"])
    assert_rejects_bad_x(layer, "MultiHeadAttention(12, 3)", 12, 8)
    with raises_clearly(ValueError, when="MultiHeadAttention(10, 3): 10 is not divisible by 3", mentions="divisible"):
        G.MultiHeadAttention(10, 3)


# --- TransformerBlock -------------------------------------------------------------------------

BLOCK_WIRINGS = {  # how a sub-layer f with its LayerNorm n joins the stream x
    "pre-norm, x + f(n(x))": lambda x, f, n: x + f(n(x)),
    "post-norm, n(x + f(x))": lambda x, f, n: n(x + f(x)),
    "no residual, f(n(x))": lambda x, f, n: f(n(x)),
}


def _rewired_block(block, x):
    """{what a block wired another way outputs: its output}, from the block's own sub-layers:
    every pair of wirings of (attention, MLP) but GPT-2's pre-norm pair."""
    found = {}
    for a_label, a_wire in BLOCK_WIRINGS.items():
        for m_label, m_wire in BLOCK_WIRINGS.items():
            if a_label == m_label == "pre-norm, x + f(n(x))":
                continue
            try:
                out = m_wire(a_wire(x, block.attn, block.ln_1), block.mlp, block.ln_2)
            except Exception:  # noqa: BLE001 - a diagnosis must never hide the failure it explains
                continue
            where = (f"{a_label} around both sub-layers" if a_label == m_label
                     else f"{a_label} around the attention and {m_label} around the MLP")
            found[f"{where}: GPT-2's blocks are pre-norm with a residual around each sub-layer"] = out
    return found


def test_block_matches_reference():
    block, f = _block()
    _matches_reference(block(f["x"]), f, "out", "TransformerBlock output",
                       what="TransformerBlock(12, 3, 20) on x (2, 6, 12)", mistakes=_rewired_block(block, f["x"]),
                       hint="pre-norm: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))")


# --- GPTModel -------------------------------------------------------------------------------------

def test_model_logits_match_reference():
    model, f = _model()
    _matches_reference(model(f["ids"]), f, "logits", "GPTModel logits",
                       what="GPTModel logits (2 layers, V=40, D=12) for ids (2, 7)", atol=3e-5, rtol=3e-4,
                       hint="wte(ids) + wpe(T) → blocks → ln_f → @ wte.weight.T",
                       locate=lambda: first_difference(model, load_fixture(LAB, "model_trace")))


def test_model_handles_max_seq_len_tokens():
    model, f = _model()
    assert_close(model(f["ids_full"]), f["logits_full"], what="GPTModel logits for a sequence of max_seq_len=10 tokens",
                 hint="if test_model_logits_match_reference passes, look at the last positions: every "
                      "position 0 … max_seq_len-1 has its own embedding")


def test_output_head_is_tied_and_not_transposed():
    model, f = _model("model_square")
    assert_close(model(f["ids"]), f["logits"], what="GPTModel logits when vocab_size = d_model = 12",
                 diagnoses=stored_diagnoses(f, "logits"),
                 hint="if test_model_logits_match_reference passes, the head is the suspect: it is tied, "
                      "logits = ln_f(x) @ wte.weight.T, one score per vocabulary row")


def test_parameters_have_gpt2_names():
    model, f = _model()
    model(f["ids"])
    names = set(model.state_dict())
    expected = set(fixture_params(f))
    assert names == expected, (
        f"GPTModel.state_dict() must use GPT-2's names: missing {sorted(expected - names)[:6]}, "
        f"extra {sorted(names - expected)[:6]}")
    before = model(f["ids"])
    model.wte.weight *= 2  # the head is tied: the logits must see the change
    assert not np.allclose(model(f["ids"]), before), (
        "changing wte.weight did not change the logits: the output head must reuse wte.weight (tied)")


@given(st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_model_is_causal(t, seed):
    model, f = _model()
    assert_causal(model, f["ids"], t, lambda shape: np.random.default_rng(seed).integers(0, 40, shape),
                  what="logits", outputs="logits", cause="information flows from the future", atol=1e-5)


def test_dropout_only_while_training():
    model, f = _model(dropout=0.3)
    without_dropout, _ = _model(dropout=0.0)
    eval_logits = model(f["ids"])
    assert_close(eval_logits, without_dropout(f["ids"]), what="GPTModel(dropout=0.3) in eval mode vs GPTModel(dropout=0.0)",
                 hint="dropout is active in eval mode: in eval mode (the default) dropout must be the "
                      "identity, so the dropout rate cannot change the logits")
    assert_close(model(f["ids"]), eval_logits, what="two eval-mode calls", atol=0, rtol=0,
                 hint="in eval mode the model must be deterministic: dropout is active in eval mode")
    model.train()
    a, b = model(f["ids"]), model(f["ids"])
    assert not np.allclose(a, eval_logits) and not np.allclose(a, b), (
        "GPTModel(dropout=0.3).train() gives the same logits as eval mode: dropout is never applied "
        "while training (embeddings, attention weights, residual branches)")
    model.eval()
    assert_close(model(f["ids"]), eval_logits, what="logits after .eval()",
                 hint="model.eval() must switch dropout off again in every sub-layer")


def test_model_rejects_bad_input():
    model, f = _model()
    model(f["ids"])
    # The ids are checked by lab 02's TokenEmbedding: ask only what lab 02 asks (an error
    # naming the offending id), not this solution's wording.
    with raises_clearly((ValueError, IndexError), when="GPTModel on token id 40 with vocab_size=40", mentions="40"):
        model(np.array([[1, 40]]))
    with raises_clearly((ValueError, IndexError), when="GPTModel on token id -1", mentions="-1"):
        model(np.array([[-1, 2]]))
    with raises_clearly(ValueError, when="GPTModel on 11 tokens with max_seq_len=10", mentions="max_seq_len"):
        model(np.zeros((1, 11), np.int64))
    with raises_clearly(ValueError, when="GPTModel on 1-D token ids", mentions="dimensions"):
        model(np.array([1, 2, 3]))
    with raises_clearly(TypeError, when="GPTModel on float token ids"):  # lab 02 asks no wording
        model(np.array([[1.0, 2.0]]))
