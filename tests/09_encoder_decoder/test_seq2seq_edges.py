"""Lab 09 · edge cases: greedy decoding honours the options it is given (an explicit source
keep-mask, cache_cross=False), token 0 as the end-of-sequence token, an empty batch's length
mask, shift_right on empty targets and without touching its labels, and Marian's sinusoids
at long positions."""

import numpy as np

from gptkit.testing import assert_close, explains_errors, fixture_params, lab, load_fixture
from gptkit.testing.parameters import set_parameters

M = lab("seq2seq")
LAB = "09_encoder_decoder"
H = 4  # the fixtures' heads (d_model 16, d_head 4)


def _decoding_model():
    """The fixtures' random MarianMT-shaped model whose padding id is 3."""
    f = load_fixture(LAB, "decoding")
    p = fixture_params(f)
    V, D = p["shared.weight"].shape
    kw = dict(vocab_size=V, d_model=D, num_heads=H, d_ff=p["encoder.layers.0.fc1.weight"].shape[1], max_seq_len=16,
              num_layers=len({k.split(".")[2] for k in p if k.startswith("encoder.layers.")}),
              num_decoder_layers=len({k.split(".")[2] for k in p if k.startswith("decoder.layers.")}),
              pad_id=int(f["pad"]))
    model = M.EncoderDecoderModel(**kw, rng=np.random.default_rng(1))
    return set_parameters(model, p, f"EncoderDecoderModel(pad_id={int(f['pad'])})"), p, int(f["pad"])


def test_greedy_decode_uses_the_src_keep_it_is_given():
    model, p, pad = _decoding_model()
    V = p["shared.weight"].shape[0]
    rng = np.random.default_rng(91)
    src = rng.integers(0, V, (3, 7))
    src[src == pad] = pad + 1  # no padding id in the source: only src_keep hides tokens
    keep = np.ones((3, 7), bool)
    keep[0, 4:] = keep[1, 2:] = False
    padded = np.where(keep, src, pad)  # the same source, hidden tokens replaced by the padding id
    for kw in ({}, {"use_cache": False}):
        want = np.asarray(M.greedy_decode(model, padded, 8, **kw))
        got = np.asarray(M.greedy_decode(model, src, 8, src_keep=keep, **kw))
        assert got.shape == want.shape and np.array_equal(got, want), (
            f"greedy_decode(src, 8, src_keep=keep{', use_cache=False' if kw else ''}) with tokens hidden by keep "
            f"(not padding ids) gave {got.tolist()}, but the same source with those tokens replaced by the padding "
            f"id gives {want.tolist()}: an explicit src_keep replaces padding_mask(src_ids, pad_id) everywhere "
            "(model.encode and every decoding step)")


def test_greedy_decode_passes_cache_cross_on():
    model, p, pad = _decoding_model()
    src = np.array([[5, 6, 7, 8], [9, 10, 11, pad]])
    calls = {"project_kv": 0}
    for layer in model.decoder.layers:
        project = layer.encoder_attn.project_kv

        def counted_project(*args, _project=project, **kw):
            calls["project_kv"] += 1
            return _project(*args, **kw)
        layer.encoder_attn.project_kv = counted_project
    out = np.asarray(M.greedy_decode(model, src, 6, cache_cross=False))
    n, steps = len(model.decoder.layers), out.shape[1] - 1
    assert calls["project_kv"] >= n * steps, (
        f"greedy_decode(src, 6, cache_cross=False) computed the cross-attention keys and values "
        f"{calls['project_kv']} times for {n} decoder layers and {steps} steps: with cache_cross=False the "
        "DecoderCache stores None and every step recomputes them (pass cache_cross on to DecoderCache)")


def test_greedy_decode_eos_id_0_is_an_eos():
    model, p, pad = _decoding_model()
    bias = np.zeros(p["shared.weight"].shape[0], np.float32)
    bias[0] = 1e3  # token 0 wins every step
    model.final_logits_bias = bias
    src = np.array([[5, 6, 7, 8], [9, 10, 11, pad]])
    for kw in ({}, {"use_cache": False}):
        out = np.asarray(M.greedy_decode(model, src, 6, eos_id=0, **kw))
        assert out.tolist() == [[pad, 0], [pad, 0]], (
            f"greedy_decode(src, 6, eos_id=0{', use_cache=False' if kw else ''}) with a model whose best token is "
            f"always 0: expected [[{pad}, 0], [{pad}, 0]] (the start token, then EOS, and both rows are finished), "
            f"got {out.tolist()}: eos_id=0 is token 0, an EOS like any other: test `eos_id is not None`, not its "
            "truth value")


def test_attention_dropout_acts_on_the_weights():
    # Every value vector of a head is the same u: whatever weights a query keeps, its output is a multiple of u.
    # Dropout on the output instead would zero single features and break that.
    D, heads, d = 16, 4, 4
    layer = M.Attention(D, heads, 0.5, rng=np.random.default_rng(3))
    layer.train()
    rng = np.random.default_rng(92)
    q, k = rng.normal(size=(2, heads, 5, d)), rng.normal(size=(2, heads, 5, d))
    u = rng.normal(size=(1, heads, 1, d)) + 2.0
    out = np.asarray(layer.attend(q, k, np.broadcast_to(u, (2, heads, 5, d)).copy()), np.float64)
    c = (out * u).sum(-1, keepdims=True) / (u * u).sum(-1, keepdims=True)  # each output's multiple of u
    off = np.abs(out - c * u).max()
    assert off < 1e-5, (
        f"Attention(dropout=0.5) in training mode, every value vector of a head equal to one vector u: an output "
        f"is {off:.3g} away from a multiple of u. Dropout acts on the attention weights (softmax, then dropout, "
        "then @ v), not on the attention's output")
    assert np.abs(c - 1).max() > 1e-3, (
        "Attention(dropout=0.5) in training mode: no attention weight was dropped (every query's weights still sum "
        "to 1): dropout acts on the attention weights while training")


def test_sublayer_dropout_comes_before_the_residual_add():
    D, heads, F = 16, 4, 24
    x = np.random.default_rng(93).normal(size=(2, 5, D)).astype(np.float32)
    for norm_first in (True, False):
        layer = M.EncoderLayer(D, heads, F, 0.5, norm_first=norm_first, rng=np.random.default_rng(4))
        layer.train()
        norm = layer.self_attn_layer_norm
        got = np.asarray(layer.sublayer(x, lambda y: np.zeros_like(y), norm))
        want = x if norm_first else np.asarray(norm(x))
        form = "x + dropout(f(norm(x)))" if norm_first else "norm(x + dropout(f(x)))"
        assert np.allclose(got, want, atol=1e-6), (
            f"sublayer (norm_first={norm_first}, dropout 0.5, training) of a sub-layer f that outputs 0 changed the "
            f"residual stream: {form} leaves {'x' if norm_first else 'norm(x)'} as it is when f gives 0. Dropout "
            "acts on f's output before the residual add, never on the sum")


def test_length_mask_of_an_empty_batch():
    for lengths, shown in ((np.zeros(0, np.int64), "np.zeros(0, int)"), ([], "[]")):
        with explains_errors(f"length_mask({shown}, 4): an empty batch (B = 0)",
                             "an empty batch gives a (0, max_len) mask: compare np.arange(max_len) with the lengths "
                             "as a column (lengths[:, None]) instead of looping or stacking rows"):
            got = np.asarray(M.length_mask(lengths, 4))
        assert got.shape == (0, 4) and got.dtype == bool, (
            f"length_mask({shown}, 4) of an empty batch: expected a bool (0, 4) mask, got {got.dtype} {got.shape}")


def test_shift_right_leaves_the_labels_unchanged():
    labels = np.array([[5, 6, -100, -100], [7, -100, 8, -100]])
    before = labels.copy()
    got = np.asarray(M.shift_right(labels, 1, 0))
    assert np.array_equal(labels, before), (
        f"shift_right(labels, start_id=1, pad_id=0) changed the labels it was given: {before.tolist()} became "
        f"{labels.tolist()}. Replace -100 by pad_id in the shifted copy, never in the labels: the loss still needs "
        "their -100s")
    assert got.tolist() == [[1, 5, 6, 0], [1, 7, 0, 8]], (
        f"shift_right({before.tolist()}, start_id=1, pad_id=0): expected [[1, 5, 6, 0], [1, 7, 0, 8]], got "
        f"{got.tolist()}")


def test_shift_right_of_empty_targets():
    labels = np.zeros((2, 0), np.int64)
    with explains_errors("shift_right(labels of shape (2, 0), start_id=1, pad_id=0): targets of length T = 0",
                         "T = 0 gives an empty (2, 0) array: there is no column 0 to hold start_id, so write it "
                         "through a slice (out[:, :1]) or return early"):
        got = np.asarray(M.shift_right(labels, 1, 0))
    assert got.shape == (2, 0) and got.dtype == np.int64, (
        f"shift_right of labels of shape (2, 0): expected an int64 (2, 0) array, got {got.dtype} {got.shape}")


def test_marian_sinusoids_are_accurate_at_long_positions():
    L, D = 20_000, 16
    pos = np.arange(L, dtype=np.float64)[:, None]
    angles = pos / np.power(10000.0, np.arange(0, D, 2, dtype=np.float64)[None, :] / D)
    want = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    got = np.asarray(M.marian_sinusoids(L, D))
    rows = [0, 1, 4095, 12_345, L - 1]
    if got.shape == want.shape:
        off = np.abs(got[rows].astype(np.float64) - want[rows]).max(axis=1)  # per position
        if off[:2].max() <= 2e-6 < off[2:].max() < 0.05:
            raise AssertionError(
                f"marian_sinusoids({L}, {D}): right at positions 0 and 1 but off by up to {off[2:].max():.2g} at "
                f"positions {rows[2:]}: the error grows with the position, the mark of angles computed in float32. "
                "Compute the angles pos / 10000^(2i/D) in float64 (or reuse lab 02's table) and convert only the "
                "finished table to float32: a float32 angle near 20,000 is off by up to 0.001 radians")
    assert_close(got[rows], want[rows].astype(np.float32), what=f"marian_sinusoids({L}, {D}) at positions {rows}",
                 atol=2e-6, rtol=0,
                 hint="compute the angles pos / 10000^(2i/D) in float64 (or reuse lab 02's table) and convert only "
                      "the finished table to float32: a float32 angle near 20,000 is off by up to 0.001 radians")
