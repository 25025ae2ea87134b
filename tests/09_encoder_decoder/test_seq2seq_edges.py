"""Lab 09 · edge cases: greedy decoding honours the options it is given (an explicit source
keep-mask, cache_cross=False) and token 0 as the end-of-sequence token."""

import numpy as np

from gptkit.testing import fixture_params, lab, load_fixture
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
