"""Lab 09 · padding masks, cross-attention, post-norm encoder and decoder layers, the
encoder–decoder model (MarianMT's layout) and greedy decoding with cached cross-attention."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptkit.testing import (assert_close, assert_float32, explains_errors, first_difference, fixture_params, lab,
                            load_fixture, raises_clearly, stored_diagnoses)
from gptkit.testing.parameters import set_parameters

M = lab("seq2seq")
LAB = "09_encoder_decoder"
D, H, F = 16, 4, 24  # the fixtures' sizes: d_head = 4
PAD = 0
SHAPE_HINT = ("a mask is (B, 1, T, S): T queries (target positions) by S keys (source positions); a shape "
              "error here often means a mask built (B, 1, S, T), or cross-attention keys and values taken "
              "from the decoder stream instead of the encoder's output (memory)")


def _model_kwargs(f):
    p = fixture_params(f)
    V, Dm = p["shared.weight"].shape
    enc = len({k.split(".")[2] for k in p if k.startswith("encoder.layers.")})
    dec = len({k.split(".")[2] for k in p if k.startswith("decoder.layers.")})
    return dict(vocab_size=V, d_model=Dm, num_layers=enc, num_decoder_layers=dec, num_heads=H,
                d_ff=p["encoder.layers.0.fc1.weight"].shape[1], max_seq_len=16, pad_id=PAD)


def _model(case="model", **kw):
    f = load_fixture(LAB, case)
    model = M.EncoderDecoderModel(**_model_kwargs(f), rng=np.random.default_rng(1), **kw)
    return set_parameters(model, fixture_params(f), "EncoderDecoderModel"), f


def _second_call(run, model, what, case="model"):
    """``run(model)`` on a model that has already run once. When it raises, the hint follows
    from what a new model with the same parameters does with the same input: when that
    works, the first call left state behind; when it fails too, it is the shapes."""
    __tracebackhide__ = True
    try:
        return run(model)
    except (NotImplementedError, AssertionError):
        raise
    except Exception as exc:  # noqa: BLE001 - the student's code on valid input
        with explains_errors(f"{what}, on a new model", SHAPE_HINT):
            run(_model(case)[0])
        raise AssertionError(
            f"{what} raised {type(exc).__name__}: {exc}, yet a new model with the same parameters takes that "
            "input: state kept from the earlier call is reused (keys and values, a mask or a buffer stored on a "
            "layer). Each call must use its own inputs only; what decoding may keep belongs in DecoderCache"
        ) from exc


def _decoder_layer(case="decoder_layer", activation="gelu", norm_first=False, dropout=0.0):
    f = load_fixture(LAB, case)
    layer = M.DecoderLayer(D, H, F, dropout, activation=activation, norm_first=norm_first, rng=np.random.default_rng(1))
    return set_parameters(layer, fixture_params(f), f"DecoderLayer({D}, {H}, {F})"), f


def _real(a, keep):
    """The rows of real (unpadded) query positions: padded ones carry nothing, so they decide no grade."""
    return np.asarray(a)[np.asarray(keep, bool)]


def _real_diagnoses(f, output, keep):
    return {label: _real(v, keep) for label, v in stored_diagnoses(f, output).items()}


# --- masks ----------------------------------------------------------------------------------------

def test_padding_and_length_masks():
    f = load_fixture(LAB, "masks")
    assert_close(M.padding_mask(f["src"], PAD), f["padding"], what="padding_mask(src, pad_id=0)", atol=0, rtol=0,
                 hint="True at real tokens, False where the id is the padding id")
    assert_close(M.length_mask(np.array([5, 3, 0]), 5), f["lengths_mask"], what="length_mask([5, 3, 0], 5)",
                 atol=0, rtol=0, hint="row b is True at positions 0 … lengths[b]-1")


def test_cross_attention_mask_hides_source_padding_only():
    f = load_fixture(LAB, "masks")
    keep = f["src"] != PAD
    got = np.asarray(M.cross_attention_mask(keep, 3))
    assert got.shape == (3, 1, 3, 5), (
        f"cross_attention_mask(src_keep (3, 5), tgt_len=3) must be (B, 1, T, S) = (3, 1, 3, 5), got {got.shape}: "
        "the query (target) length comes before the key (source) length")
    pad = np.broadcast_to(keep[:, None, None, :], (3, 1, 3, 5))
    assert_close(got, f["cross"], what="cross_attention_mask for T = 3 queries over S = 5 source keys", atol=0, rtol=0,
                 diagnoses={**stored_diagnoses(f, "cross"),
                            "a causal mask in the cross-attention (query t sees source keys 0 … t only)":
                            pad & np.tril(np.ones((3, 5), bool)),
                            "a causal mask in the cross-attention (aligned to the last source key)":
                            pad & np.tril(np.ones((3, 5), bool), 2),
                            "a mask that ignores the source padding (every source key visible)": np.ones((3, 1, 3, 5), bool)},
                 hint="every target query sees every real source token (no causal mask: the source is all "
                      "known) and none of the source padding")


def test_encoder_mask_is_key_padding_without_causality():
    f = load_fixture(LAB, "masks")
    got = np.asarray(M.encoder_mask(f["src"] != PAD))
    assert_close(got, f["encoder"], what="encoder_mask (B, 1, S, S)", atol=0, rtol=0,
                 hint="the encoder's self-attention has no causal mask: each position sees every real source "
                      "token, none of the padding")


def test_decoder_mask_is_causal_and_hides_target_padding():
    f = load_fixture(LAB, "masks")
    got = np.asarray(M.decoder_mask(f["tgt_keep"]))
    keep = np.asarray(f["tgt_keep"], bool)
    causal = np.tril(np.ones((keep.shape[1],) * 2, bool))[None, None]
    assert_close(got, f["decoder"], what="decoder_mask (B, 1, T, T)", atol=0, rtol=0,
                 diagnoses={**stored_diagnoses(f, "decoder"),
                            "a causal mask without the target padding: padded keys must be hidden too":
                            np.broadcast_to(causal, f["decoder"].shape),
                            "the target padding hidden on the query rows instead of the key columns: a padded "
                            "target token must be hidden as a key": causal & keep[:, None, :, None],
                            "the target padding hidden without the causal mask (future keys visible)":
                            np.broadcast_to(keep[:, None, None, :], f["decoder"].shape)},
                 hint="query t may see key u when u ≤ t (causal) AND u is a real target token: the target "
                      "padding must be hidden too")


def test_masks_reject_non_bool_keep():
    M.cross_attention_mask(np.ones((2, 3), bool), 2)  # valid input first: an unfinished stub fails here
    with raises_clearly(TypeError, when="cross_attention_mask on an int keep array", mentions="bool"):
        M.cross_attention_mask(np.ones((2, 3), np.int64), 2)


# --- attention ------------------------------------------------------------------------------------

def _attention():
    f = load_fixture(LAB, "attention")
    layer = M.Attention(D, H, rng=np.random.default_rng(1))
    return set_parameters(layer, fixture_params(f), f"Attention({D}, {H})"), f


def _attention_scaled(layer, x, memory, keep, scale):
    """The layer's attention of x over memory with its own projections, in float64, the
    scores multiplied by ``scale``: what a wrong scale outputs."""
    def heads(a):
        a = np.float64(a)
        return a.reshape(*a.shape[:2], H, -1).transpose(0, 2, 1, 3)

    q, k, v = heads(layer.q_proj(x)), heads(layer.k_proj(memory)), heads(layer.v_proj(memory))
    seen = np.asarray(keep, bool)[:, None, None, :]
    s = np.where(seen, q @ k.swapaxes(-1, -2) * scale, -np.inf)
    s = s - np.where(seen.any(-1, keepdims=True), s.max(-1, keepdims=True), 0.0)
    w = np.where(seen, np.exp(s), 0.0)
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
    merged = (w @ v).transpose(0, 2, 1, 3).reshape(*np.shape(x)[:2], -1)
    return layer.out_proj(merged.astype(np.float32))


def test_cross_attention_matches_reference():
    layer, f = _attention()
    with explains_errors("Attention(x (3, 4, D), memory (3, 6, D), mask (3, 1, 4, 6))", SHAPE_HINT):
        out = layer(f["x"], f["memory"], M.cross_attention_mask(f["mem_keep"], 4))
    d_head = D // H
    scales = {"scores scaled by 1/√d_model instead of 1/√d_head": 1 / np.sqrt(D),
              "scores scaled by 1/d_head instead of 1/√d_head": 1 / d_head,
              "scores not scaled: divide q·kᵀ by √d_head": 1.0,
              "scores multiplied by √d_head instead of divided by it": np.sqrt(d_head)}
    assert_close(out, f["cross"], what="cross-attention: queries from x (T = 4), keys and values from memory (S = 6)",
                 diagnoses={label: _attention_scaled(layer, f["x"], f["memory"], f["mem_keep"], scale)
                            for label, scale in scales.items()},
                 hint="q = q_proj(x); k, v = k_proj(memory), v_proj(memory); softmax(q·kᵀ/√d_head, padded "
                      "source keys hidden) @ v; out_proj. A query with no source key at all gets zeros")
    assert_float32(out, "Attention output")


def test_fully_padded_source_row_gives_no_nan():
    layer, f = _attention()
    out = layer(f["x"], f["memory"], M.cross_attention_mask(f["mem_keep"], 4))
    assert np.isfinite(out).all(), (
        "row 2 of the source is all padding: its queries may see no key, and the cross-attention output "
        "holds NaN (a softmax over a row of -inf). Give such a row zero weights instead")
    assert_close(out[2], np.broadcast_to(layer.out_proj.bias, (4, D)), what="the fully padded row's output",
                 hint="with no key to attend to, the attention output is 0, so the layer returns out_proj's bias")


def test_masked_self_attention_matches_reference():
    layer, f = _attention()
    out = layer(f["x"], mask=M.decoder_mask(f["self_keep"]))
    assert_close(_real(out, f["self_keep"]), _real(f["self"], f["self_keep"]),
                 what="self-attention (memory=None) under decoder_mask, at the real query positions",
                 hint="with memory=None, keys and values come from x itself")


@given(st.integers(0, 2), st.integers(0, 2**32 - 1))
def test_cross_attention_ignores_padded_memory(row, seed):
    layer, f = _attention()
    keep = f["mem_keep"]
    out = layer(f["x"], f["memory"], M.cross_attention_mask(keep, 4))
    memory = f["memory"].copy()
    rng = np.random.default_rng(seed)
    memory[row][~keep[row]] = rng.normal(size=memory[row][~keep[row]].shape) * 10
    assert_close(layer(f["x"], memory, M.cross_attention_mask(keep, 4)), out, what="cross-attention after changing "
                 "padded memory positions", hint="changing the encoder's output at padded source positions changed "
                 "the result: source padding is not masked")


# --- layers ---------------------------------------------------------------------------------------

WIRINGS = {  # how a sub-layer f with its LayerNorm n is joined to the stream x, right and wrong
    "post": ("post-norm, n(x + f(x))", lambda x, f, n: n(x + f(x))),
    "pre": ("pre-norm, x + f(n(x))", lambda x, f, n: x + f(n(x))),
    "outside": ("the residual added after the LayerNorm, x + n(f(x)): the residual goes inside it, n(x + f(x))",
                lambda x, f, n: x + n(f(x))),
    "normed": ("a pre-norm residual that adds the normalised n(x) instead of x itself, n(x) + f(n(x))",
               lambda x, f, n: n(x) + f(n(x))),
    "none": ("no residual at all, n(f(x)): the sub-layer's input is added back", lambda x, f, n: n(f(x))),
}


def _rewired(layer, x, mask, memory=None, cross_mask=None, right="post"):
    """{what a wiring mistake outputs: the layer's output}, built from the layer's own
    sub-layers, every wiring but ``right``; post-norm and pre-norm read as "pre-norm in a
    post-norm layer" (or the other way)."""
    subs = [(lambda h: layer.self_attn(h, mask=mask), layer.self_attn_layer_norm)]
    if memory is not None:
        subs.append((lambda h: layer.encoder_attn(h, memory, cross_mask), layer.encoder_attn_layer_norm))
    subs.append((layer.feed_forward, layer.final_layer_norm))
    found = {}
    for key, (label, wire) in WIRINGS.items():
        if key == right:
            continue
        if key in ("post", "pre"):
            label = f"{label} where the layer is {WIRINGS[right][0].split(',')[0]}"
        out = x
        try:
            for f, n in subs:
                out = wire(out, f, n)
        except Exception:  # noqa: BLE001 - a diagnosis must never hide the failure it explains
            continue
        found[label] = out
    return found


def test_encoder_layer_matches_reference():
    f = load_fixture(LAB, "encoder_layer")
    layer = set_parameters(M.EncoderLayer(D, H, F, rng=np.random.default_rng(1)), fixture_params(f), "EncoderLayer")
    out = layer(f["x"], M.encoder_mask(f["src_keep"]))
    assert_close(_real(out, f["src_keep"]), _real(f["out"], f["src_keep"]),
                 what="EncoderLayer (post-norm, ReLU) on x (3, 6, 16), at the real source positions",
                 diagnoses={**_real_diagnoses(f, "out", f["src_keep"]), **{
                     label: _real(v, f["src_keep"])
                     for label, v in _rewired(layer, f["x"], M.encoder_mask(f["src_keep"])).items()}},
                 hint="post-norm: x = LN(x + SelfAttn(x)); x = LN(x + FFN(x)), no causal mask, each "
                      "sub-layer with its own LayerNorm and the residual inside the LayerNorm")
    assert_float32(out, "EncoderLayer output")


def test_decoder_layer_post_norm_matches_reference():
    layer, f = _decoder_layer()
    with explains_errors("DecoderLayer on x (3, 4, D) over memory (3, 6, D)", SHAPE_HINT):
        out = layer(f["x"], f["memory"], M.decoder_mask(f["tgt_keep"]), M.cross_attention_mask(f["src_keep"], 4))
    assert_close(_real(out, f["tgt_keep"]), _real(f["out"], f["tgt_keep"]),
                 what="DecoderLayer (post-norm, GELU) on x (3, 4, 16) over memory (3, 6, 16), at the real target "
                      "positions", atol=1e-4, rtol=1e-3,
                 diagnoses={**_real_diagnoses(f, "out", f["tgt_keep"]), **{
                     label: _real(v, f["tgt_keep"]) for label, v in _rewired(
                         layer, f["x"], M.decoder_mask(f["tgt_keep"]), f["memory"],
                         M.cross_attention_mask(f["src_keep"], 4)).items()}},
                 hint="post-norm: x = LN(x + SelfAttn(x)); x = LN(x + CrossAttn(x, memory)); x = LN(x + FFN(x)), "
                      "each sub-layer with its own LayerNorm; the cross-attention's keys and values come from "
                      "the encoder's output")
    assert_float32(out, "DecoderLayer output")


def test_decoder_layer_pre_norm_matches_reference():
    layer, f = _decoder_layer("decoder_layer_pre", activation="relu", norm_first=True)
    with explains_errors("DecoderLayer(norm_first=True)", SHAPE_HINT):
        out = layer(f["x"], f["memory"], M.decoder_mask(f["tgt_keep"]), M.cross_attention_mask(f["src_keep"], 4))
    assert_close(_real(out, f["tgt_keep"]), _real(f["out"], f["tgt_keep"]),
                 what="DecoderLayer (pre-norm, norm_first=True, ReLU), at the real target positions",
                 atol=1e-4, rtol=1e-3,
                 diagnoses={**_real_diagnoses(f, "out", f["tgt_keep"]), **{
                     label: _real(v, f["tgt_keep"]) for label, v in _rewired(
                         layer, f["x"], M.decoder_mask(f["tgt_keep"]), f["memory"],
                         M.cross_attention_mask(f["src_keep"], 4), right="pre").items()}},
                 hint="pre-norm: x = x + SelfAttn(LN(x)); x = x + CrossAttn(LN(x), memory); x = x + FFN(LN(x))")


@given(st.integers(0, 2), st.integers(0, 2**32 - 1))
def test_decoder_layer_is_causal(t, seed):
    layer, f = _decoder_layer()
    x, mem = f["x"], f["memory"]
    keep = np.ones((3, 4), bool)
    args = (M.decoder_mask(keep), M.cross_attention_mask(f["src_keep"], 4))
    out = layer(x, mem, *args)
    changed = x.copy()
    changed[:, t + 1:] = np.random.default_rng(seed).normal(size=changed[:, t + 1:].shape)
    assert_close(layer(changed, mem, *args)[:, : t + 1], out[:, : t + 1], what=f"DecoderLayer outputs at 0…{t}",
                 hint=f"changing target positions after {t} changed earlier outputs: the decoder's "
                      "self-attention must be causal")


def test_decoder_layers_use_their_own_layernorms():
    layer, f = _decoder_layer()
    args = (f["x"], f["memory"], M.decoder_mask(f["tgt_keep"]), M.cross_attention_mask(f["src_keep"], 4))
    before = layer(*args)
    for name in ("encoder_attn_layer_norm", "final_layer_norm"):
        norm = getattr(layer, name)
        saved = norm.weight.copy()
        norm.weight = saved * 2
        after = layer(*args)
        norm.weight = saved
        assert not np.allclose(after, before), (
            f"doubling {name}.weight changed nothing: each of the three sub-layers has its own LayerNorm "
            "(self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm)")


@pytest.mark.parametrize("name", ["swish", "silu"])
def test_swish_encoder_layer_uses_silu(name):
    """HuggingFace's MarianMT configs name SiLU "swish": the feed-forward is fc2(h·σ(h)), h = fc1(x), at
    inputs large enough that a sigmoid, a tanh or ReLU in its place would differ."""
    f = load_fixture(LAB, "encoder_layer")
    rng = np.random.default_rng(5)
    layer = set_parameters(M.EncoderLayer(D, H, F, activation=name, rng=rng),
                           fixture_params(f), f"EncoderLayer(activation={name!r})")
    x = rng.normal(0, 3, (2, 3, D)).astype(np.float32)
    out = layer(x)
    mid = layer.self_attn_layer_norm(x + layer.self_attn(x))  # post-norm: the first sub-layer, as your layer has it
    h = mid.astype(np.float64) @ layer.fc1.weight + layer.fc1.bias
    def through(act):
        return layer.final_layer_norm(mid + (act(h) @ layer.fc2.weight + layer.fc2.bias).astype(np.float32))

    expected = through(lambda h: h / (1 + np.exp(-h)))
    assert_close(out, expected, what=f"EncoderLayer(activation={name!r}) on x (2, 3, {D})", atol=1e-4,
                 diagnoses={"σ(h) alone, the sigmoid without the factor h (swish is h·σ(h))":
                            through(lambda h: 1 / (1 + np.exp(-h))),
                            "tanh(h) in place of h·σ(h)": through(np.tanh),
                            "ReLU in place of h·σ(h)": through(lambda h: np.maximum(h, 0)),
                            "GELU in place of h·σ(h)": through(lambda h: h * 0.5 * (1 + np.tanh(
                                np.sqrt(2 / np.pi) * (h + 0.044715 * h * h * h))))},
                 hint="swish and silu are both x·σ(x), between fc1 and fc2")
    assert_float32(out, f"EncoderLayer(activation={name!r}) output")


def test_dropout_only_while_training():
    layer, f = _decoder_layer(dropout=0.3)
    args = (f["x"], f["memory"], M.decoder_mask(f["tgt_keep"]), M.cross_attention_mask(f["src_keep"], 4))
    assert_close(layer(*args), f["out"], what="DecoderLayer(dropout=0.3) in eval mode", atol=1e-4, rtol=1e-3,
                 hint="dropout is active in eval mode: in eval mode it must be the identity")
    layer.train()
    assert not np.allclose(layer(*args), f["out"]), "DecoderLayer(dropout=0.3).train() never applies dropout"


# --- the model ------------------------------------------------------------------------------------

def test_sinusoids_in_marian_order():
    f = load_fixture(LAB, "sinusoids")
    table = np.asarray(f["table"])
    half = table.shape[1] // 2
    interleaved = np.empty_like(table)
    interleaved[:, 0::2], interleaved[:, 1::2] = table[:, :half], table[:, half:]
    assert_close(M.marian_sinusoids(12, D), f["table"], what="marian_sinusoids(12, 16)",
                 diagnoses={**stored_diagnoses(f, "table"),
                            "the cosines first and the sines second: Marian puts every sine first":
                            np.concatenate([table[:, half:], table[:, :half]], axis=1),
                            "lab 02's interleaved table (sine, cosine, sine, …): Marian puts every sine first, then "
                            "every cosine": interleaved},
                 hint="MarianMT puts every sine first (columns 0 … D/2-1), then every cosine of the same "
                      "angles (columns D/2 … D-1)")


def test_shift_right_for_teacher_forcing():
    f = load_fixture(LAB, "model")
    got = M.shift_right(f["labels"], PAD, PAD)
    assert np.array_equal(got, f["tgt"]), (
        f"shift_right(labels, start_id=0, pad_id=0): expected {f['tgt'].tolist()}, got {np.asarray(got).tolist()}: "
        "the decoder input is the start token followed by labels[:, :-1], with -100 replaced by the padding id")


def test_model_logits_match_marian():
    model, f = _model()
    with explains_errors("EncoderDecoderModel(src (3, 7), tgt (3, 6))", SHAPE_HINT):
        logits = model(f["src"], f["tgt"], tgt_keep=f["tgt_keep"])
    keep, expected = f["tgt_keep"], _real(f["logits"], f["tgt_keep"])
    assert_close(_real(logits, keep), expected, atol=5e-4, rtol=5e-4,
                 what="logits vs HuggingFace MarianMTModel (stored), padded source and target",
                 diagnoses=_real_diagnoses(f, "logits", keep),
                 locate=lambda: first_difference(model, load_fixture(LAB, "model_trace"), atol=1e-4),
                 hint="embed (tokens·√D + Marian's sinusoids) → encoder → decoder (causal self-attention, "
                      "cross-attention over the real source tokens) → @ shared.weight.T + final_logits_bias")
    assert_float32(logits, "EncoderDecoderModel logits")


def test_model_variants_match_reference():
    f = load_fixture(LAB, "model_variants")
    kw = _model_kwargs({"param.shared.weight": f["param.src_embed.weight"],
                        **{k: v for k, v in f.items() if k.startswith("param.") and "shared" not in k}})
    kw.update(share_embeddings=False, positions="learned", norm_first=True, activation="gelu")
    model = set_parameters(M.EncoderDecoderModel(**kw, rng=np.random.default_rng(1)), fixture_params(f),
                           "EncoderDecoderModel(share_embeddings=False, positions='learned', norm_first=True)")
    assert_close(model(f["src"], f["tgt"]), f["logits"], what="separate embeddings, learned positions, pre-norm",
                 atol=1e-4, rtol=1e-4, hint="the head is tied to tgt_embed; pre-norm stacks end with their layer_norm")


@given(st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_model_is_causal_in_the_target(t, seed):
    model, f = _model()
    logits = model(f["src"], f["tgt"])
    changed = f["tgt"].copy()
    changed[:, t:] = np.random.default_rng(seed).integers(1, 40, changed[:, t:].shape)
    assert_close(model(f["src"], changed)[:, :t], logits[:, :t], what=f"logits at target positions 0…{t - 1}",
                 atol=1e-4, hint=f"changing target tokens from position {t} on changed earlier logits: "
                                 "information flows from the future")


@given(st.integers(1, 4))
def test_more_source_padding_changes_nothing(extra):
    model, f = _model()
    src = f["src"]
    logits = model(src, f["tgt"])
    longer = np.concatenate([src, np.full((src.shape[0], extra), PAD)], axis=1)
    got = _second_call(lambda m: m(longer, f["tgt"]), model,
                       f"EncoderDecoderModel on the source with {extra} more padding columns, after a call on the "
                       "source without them")
    assert_close(got, logits, what=f"logits with {extra} more source padding columns", atol=5e-4, rtol=1e-3,
                 hint="extending the source padding changed the output: padded source positions must be "
                      "masked in the encoder and in the cross-attention")


def test_permuting_the_batch_permutes_the_output():
    model, f = _model()
    logits = model(f["src"], f["tgt"], tgt_keep=f["tgt_keep"])
    order = np.array([2, 0, 1])
    got = model(f["src"][order], f["tgt"][order], tgt_keep=f["tgt_keep"][order])
    assert_close(got, logits[order], what="logits of the batch in another order", atol=2e-4, rtol=2e-3,
                 hint="rows of a batch must not influence each other (a mask or a reshape mixes rows)")


def test_shared_embedding_is_tied_to_the_head():
    model, f = _model()
    before = model(f["src"], f["tgt"])
    model.final_logits_bias = model.final_logits_bias + 1
    assert_close(model(f["src"], f["tgt"]), before + 1, what="logits after adding 1 to final_logits_bias",
                 hint="the logits are decoder output @ shared.weight.T + final_logits_bias")


# --- decoding ---------------------------------------------------------------------------------------

def test_greedy_matches_marian_generate():
    model, _ = _model()
    f = load_fixture(LAB, "greedy")
    for kw, key in (({}, "tokens"), ({"eos_id": int(f["eos"])}, "tokens_eos")):
        got = np.asarray(M.greedy_decode(model, f["src"], 10, **kw))
        assert got.shape == f[key].shape and np.array_equal(got, f[key]), (
            f"greedy_decode(model, src, 10, {kw}) must equal MarianMT's generate(): expected "
            f"{f[key].tolist()}, got {got.tolist()} (start with the padding id; after EOS a row only pads)")


def test_cached_step_equals_full_decode():
    model, f = _model()
    src, keep = f["src"], f["src"] != PAD
    memory = model.encode(src, keep)
    ids = np.concatenate([np.zeros((3, 1), np.int64), f["tgt"][:, 1:]], axis=1)
    full = model.decode(ids, memory, keep)
    cache = M.DecoderCache(model, memory)
    pieces = [M.decode_step(model, ids[:, a:b], memory, keep, cache) for a, b in ((0, 2), (2, 3), (3, 6))]
    assert_close(np.concatenate(pieces, axis=1), full, what="decode_step in pieces 2 + 1 + 3 vs decode of all 6",
                 atol=1e-4, hint="new tokens sit at positions cache.length …: their self-attention sees every "
                                 "cached key (causal mask of T queries over length+T keys), the cross-attention "
                                 "the cached keys and values of the encoder's output")


def test_encoder_runs_once_and_cross_attention_is_cached():
    model, f = _model()
    calls = {"encode": 0, "project_kv": 0}
    encode = model.encode

    def counted_encode(*args, **kw):
        calls["encode"] += 1
        return encode(*args, **kw)
    model.encode = counted_encode
    for i, layer in enumerate(model.decoder.layers):
        project = layer.encoder_attn.project_kv

        def counted_project(*args, _project=project, **kw):
            calls["project_kv"] += 1
            return _project(*args, **kw)
        layer.encoder_attn.project_kv = counted_project
    M.greedy_decode(model, f["src"], 8)
    assert calls["encode"] == 1, (
        f"greedy_decode for 8 tokens ran the encoder {calls['encode']} times: run model.encode once per "
        "call and reuse its output at every step")
    n = len(model.decoder.layers)
    assert calls["project_kv"] == n, (
        f"greedy_decode for 8 tokens computed the cross-attention keys and values {calls['project_kv']} times "
        f"for {n} decoder layers: compute them once per layer (DecoderCache) and read them from the cache, "
        "cached, at every step")


# --- another padding id, an explicit start token, and the stopping rule ------------------------------

def _decoding_model():
    f = load_fixture(LAB, "decoding")
    kw = {**_model_kwargs(f), "pad_id": int(f["pad"])}
    model = M.EncoderDecoderModel(**kw, rng=np.random.default_rng(1))
    return set_parameters(model, fixture_params(f), f"EncoderDecoderModel(pad_id={int(f['pad'])})"), f


def test_shift_right_with_a_start_token_other_than_padding():
    labels = np.array([[7, 8, 9, -100], [4, -100, -100, -100]])
    got = np.asarray(M.shift_right(labels, 5, 3))
    want = np.array([[5, 7, 8, 9], [5, 4, 3, 3]])
    assert np.array_equal(got, want), (
        f"shift_right(labels, start_id=5, pad_id=3) of {labels.tolist()}: expected {want.tolist()}, "
        f"got {got.tolist()}: "
        "start_id first (not the padding id), then labels[:, :-1] with -100 replaced by pad_id")


def test_model_with_another_padding_id_matches_marian():
    model, f = _decoding_model()
    logits = model(f["src"], f["tgt"])
    assert_close(logits, f["logits"], what=f"logits vs MarianMTModel with pad_token_id={int(f['pad'])} (the source "
                 "holds real tokens with id 0, the target the padding id as a real token)", atol=5e-4, rtol=5e-4,
                 diagnoses=stored_diagnoses(f, "logits"),
                 hint="the source's padding is where the id is the model's padding id (model.pad_id), not 0")


def test_greedy_with_a_start_token_and_eos():
    model, f = _decoding_model()
    start, n = int(f["start"]), 9
    for which, story in (("all", "every row emits it before the limit: decoding stops once the last row has "
                                 "(its EOS appended)"),
                         ("some", "some rows emit it: after it they only pad, with the model's padding id"),
                         ("none", "no row emits it: every row gets max_new_tokens tokens")):
        eos, want = int(f[f"eos_{which}"]), f[f"tokens_{which}"]
        for kw in ({}, {"use_cache": False}, {"cache_cross": False}):
            got = np.asarray(M.greedy_decode(model, f["src"], n, start_id=start, eos_id=eos, **kw))
            if not (got.shape == want.shape and np.array_equal(got, want)):
                found = stored_diagnoses(f, f"tokens_{which}")
                match = next((label for label, value in found.items()
                              if value.shape == got.shape and np.array_equal(value, got)), None)
                settings = "".join(f", {k}={v}" for k, v in kw.items())
                raise AssertionError(
                    f"greedy_decode(model, src, {n}, start_id={start}, eos_id={eos}{settings}) "
                    f"with padding id {int(f['pad'])}, where {story}: MarianMT's generate() gives {want.tolist()}, "
                    f"yours {got.tolist()}" + (f". Your result matches {match}" if match else
                                               ". Every row starts with start_id"))


def test_decoding_keeps_nothing_between_calls():
    model, f = _model()
    src, other = f["src"], f["src"][::-1].copy()
    model(src, f["tgt"])  # a first sentence
    second = model(other, f["tgt"])
    fresh, _ = _model()
    assert_close(second, fresh(other, f["tgt"]), what="logits for a second source sentence, after a first one, vs "
                 "a fresh model", atol=1e-5, hint="a layer keeps nothing from one call to the next: the "
                 "cross-attention's keys and values come from this call's memory (or this call's DecoderCache)")
    tokens = np.asarray(M.greedy_decode(model, other, 6))
    assert np.array_equal(tokens, np.asarray(M.greedy_decode(fresh, other, 6, use_cache=False))), (
        "greedy_decode on a second source, after other calls on the same model, differs from a fresh model's "
        "decoding without a cache: a layer keeps nothing from one call to the next")


def test_two_decoder_caches_interleaved():
    model, f = _model()
    keep = f["src"] != PAD
    other = f["src"][[1, 2, 0]]
    other_keep = other != PAD
    memories = [model.encode(f["src"], keep), model.encode(other, other_keep)]
    ids = np.concatenate([np.zeros((3, 1), np.int64), f["tgt"][:, 1:]], axis=1)
    caches = [M.DecoderCache(model, m) for m in memories]
    pieces = [[], []]
    for a, b in ((0, 2), (2, 3), (3, 6)):
        for i, (m, k) in enumerate(zip(memories, (keep, other_keep))):
            pieces[i].append(M.decode_step(model, ids[:, a:b], m, k, caches[i]))
    for i, (m, k) in enumerate(zip(memories, (keep, other_keep))):
        assert_close(np.concatenate(pieces[i], axis=1), model.decode(ids, m, k), atol=5e-4, rtol=1e-3,
                     what=f"decode_step through cache {i + 1} of two used in turn (two source sentences) vs decode",
                     hint="each DecoderCache holds its own keys and values: nothing is shared between caches or "
                          "kept on the layers")


def test_attention_without_a_mask_sees_every_key():
    layer, f = _attention()
    x, memory = f["x"], f["memory"]
    B, T, S = x.shape[0], x.shape[1], memory.shape[1]
    for what, args, full in (("self-attention", (x,), np.ones((B, 1, T, T), bool)),
                             ("cross-attention", (x, memory), np.ones((B, 1, T, S), bool))):
        n_keys = full.shape[-1]
        causal = np.broadcast_to(np.tril(np.ones((T, n_keys), bool), n_keys - T), full.shape)
        assert_close(layer(*args), layer(*args, mask=full), what=f"{what} with mask=None vs a mask that allows "
                     "every key", diagnoses={"mask=None read as a causal mask (the future hidden)":
                                             layer(*args, mask=causal)},
                     hint="mask=None means no mask at all: every key may be seen (no causal mask)")
