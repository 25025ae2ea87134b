"""Fixtures for lab 09, made by HuggingFace's MarianMTModel and the reference solution.

Cases: ``masks`` (padding, lengths, encoder / cross-attention / decoder masks), ``attention``
(one Attention layer as self- and cross-attention, a fully padded source row included),
``encoder_layer`` (post-norm, ReLU), ``decoder_layer`` (post-norm, GELU) and
``decoder_layer_pre`` (pre-norm), ``sinusoids``, ``model`` (a tiny random MarianMT: its
logits on a padded batch, from HuggingFace; ``model_trace``: every sub-layer's inputs and
outputs in the reference on that batch), ``model_variants`` (separate embeddings,
learned positions, pre-norm: the reference alone) and ``greedy`` (MarianMT's
``generate()`` tokens). Every parameter is random, LayerNorm gains and all biases too.

``decoding`` is a second random MarianMT whose padding id is 3 (not 0), with its own
random generator: its logits on a padded batch, and ``generate()`` with an explicit
``decoder_start_token_id`` (not the padding id) and an EOS that every row, some rows or
no row emits, so that the padding id, the start token and the stopping rule all show
without torch.

The cases ``masks``, ``encoder_layer``, ``decoder_layer``, ``decoder_layer_pre``,
``sinusoids``, ``model`` and ``decoding`` also store what each bug of
``solutions/09_encoder_decoder/bugs.toml`` that names them in ``diagnose`` outputs.
"""

import numpy as np

from gptkit.testing.firstdiff import record_trace, trace_arrays
from gptkit.testing.fixtures import eos_choices
from gptkit.testing.seq2seq import Seq2SeqShape, hf_marian, random_layer_state, random_seq2seq_state
from grader.fixtures import diagnoses

NEEDS_TORCH = True
LAB = "09_encoder_decoder"

D, H, F = 16, 4, 24  # width, heads (d_head = 4), feed-forward width
SHAPE = Seq2SeqShape(vocab_size=40, d_model=D, num_layers=2, num_heads=H, d_ff=F, max_seq_len=16)
PAD, EOS = SHAPE.pad_id, SHAPE.eos_id


def _with(case, name, outputs, ref):
    case.update(outputs(ref))
    return {**case, **diagnoses(LAB, name, case, outputs, "seq2seq")}


def _params(state):
    return {f"param.{k}": v for k, v in state.items()}


def _layer(m, cls, state, **kw):
    return getattr(m, cls)(D, H, F, rng=np.random.default_rng(0), **kw).load_state_dict(state).eval()


def build() -> dict[str, dict[str, np.ndarray]]:
    import torch

    import seq2seq as ref

    rng = np.random.default_rng(909)
    cases = {}

    # masks: 3 sources of S = 5 (row 1 padded after 3 tokens, row 2 entirely padding), T = 3
    src = rng.integers(2, SHAPE.vocab_size, (3, 5))
    src[1, 3:] = PAD
    src[2, :] = PAD
    tgt_keep = np.array([[True, True, True], [True, True, False], [True, False, False]])
    keep = src != PAD

    def masks(m):
        return {"padding": m.padding_mask(src, PAD), "lengths_mask": m.length_mask(np.array([5, 3, 0]), 5),
                "encoder": np.ascontiguousarray(m.encoder_mask(keep)),
                "cross": np.ascontiguousarray(m.cross_attention_mask(keep, 3)),
                "decoder": np.ascontiguousarray(m.decoder_mask(tgt_keep))}
    cases["masks"] = _with({"src": src, "tgt_keep": tgt_keep}, "masks", masks, ref)

    # one Attention layer: self-attention under a decoder mask, cross-attention over padded memory
    attn_state = {k.split(".", 1)[1]: v for k, v in random_layer_state(D, F, rng, cross=False).items()
                  if k.startswith("self_attn.")}
    layer = ref.Attention(D, H, rng=np.random.default_rng(0)).load_state_dict(attn_state).eval()
    x = rng.normal(0, 1, (3, 4, D)).astype(np.float32)
    memory = rng.normal(0, 1, (3, 6, D)).astype(np.float32)
    mem_keep = np.ones((3, 6), bool)
    mem_keep[1, 4:] = False
    mem_keep[2, :] = False  # no source token at all: the output must still be finite
    self_keep = np.array([[True] * 4, [True, True, True, False], [True, True, False, False]])
    cases["attention"] = {"x": x, "memory": memory, "mem_keep": mem_keep, "self_keep": self_keep,
                          **_params(attn_state),
                          "cross": layer(x, memory, ref.cross_attention_mask(mem_keep, 4)),
                          "self": layer(x, mask=ref.decoder_mask(self_keep))}

    # layers: T = 4 target positions over S = 6 source positions, both padded
    tgt_keep = np.array([[True] * 4, [True, True, True, False], [True, True, False, False]])
    src_keep = np.ones((3, 6), bool)
    src_keep[1, 4:] = False
    src_keep[2, 2:] = False
    enc_state = random_layer_state(D, F, rng, cross=False)
    xs = rng.normal(0, 1, (3, 6, D)).astype(np.float32)
    cases["encoder_layer"] = _with(
        {"x": xs, "src_keep": src_keep, **_params(enc_state)}, "encoder_layer",
        lambda m: {"out": _layer(m, "EncoderLayer", enc_state)(xs, m.encoder_mask(src_keep))}, ref)
    for name, act, pre in (("decoder_layer", "gelu", False), ("decoder_layer_pre", "relu", True)):
        dec_state = random_layer_state(D, F, rng, cross=True)
        xt = rng.normal(0, 1, (3, 4, D)).astype(np.float32)
        mem = rng.normal(0, 1, (3, 6, D)).astype(np.float32)

        def run(m, dec_state=dec_state, xt=xt, mem=mem, act=act, pre=pre):
            layer = _layer(m, "DecoderLayer", dec_state, activation=act, norm_first=pre)
            return {"out": layer(xt, mem, m.decoder_mask(tgt_keep), m.cross_attention_mask(src_keep, 4))}
        cases[name] = _with({"x": xt, "memory": mem, "src_keep": src_keep, "tgt_keep": tgt_keep,
                             **_params(dec_state)}, name, run, ref)

    cases["sinusoids"] = _with({}, "sinusoids", lambda m: {"table": m.marian_sinusoids(12, D)}, ref)

    # the model: a tiny random MarianMT; logits on a padded batch come from HuggingFace
    state = random_seq2seq_state(SHAPE, rng)
    hf = hf_marian(state, SHAPE)
    src = rng.integers(2, SHAPE.vocab_size, (3, 7))
    src[1, 5:] = PAD
    src[2, 3:] = PAD
    labels = rng.integers(2, SHAPE.vocab_size, (3, 6))
    labels[2, 4:] = -100
    tgt = ref.shift_right(labels, PAD, PAD)
    tgt_keep = labels != -100
    tgt_keep = np.concatenate([np.ones((3, 1), bool), tgt_keep[:, :-1]], axis=1)  # the shifted labels' padding
    with torch.no_grad():
        logits = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != PAD).long(),
                    decoder_input_ids=torch.from_numpy(tgt),
                    decoder_attention_mask=torch.from_numpy(tgt_keep).long()).logits.numpy()

    def model_logits(m):
        model = m.EncoderDecoderModel(**SHAPE.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()
        return {"logits": model(src, tgt, tgt_keep=tgt_keep)}
    assert np.allclose(model_logits(ref)["logits"], logits, atol=1e-4, rtol=1e-4), "the reference differs from MarianMT"
    case = {"src": src, "labels": labels, "tgt": tgt, "tgt_keep": tgt_keep, **_params(state)}
    case["logits"] = logits
    cases["model"] = {**case, **diagnoses(LAB, "model", case, model_logits, "seq2seq")}
    traced = ref.EncoderDecoderModel(**SHAPE.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()
    with record_trace(traced) as calls:  # every sub-layer's inputs and outputs: a failing logits test names the first
        traced(src, tgt, tgt_keep=tgt_keep)
    cases["model_trace"] = trace_arrays(calls)

    # greedy decoding: MarianMT's generate() with an EOS that one row emits
    with torch.no_grad():
        kw = dict(attention_mask=torch.from_numpy(src != PAD).long(), max_new_tokens=10, do_sample=False, num_beams=1)
        plain = hf.generate(torch.from_numpy(src), **kw).numpy()
        eos = int(plain[0, 3])
        hf.generation_config.eos_token_id = eos
        with_eos = hf.generate(torch.from_numpy(src), eos_token_id=eos, **kw).numpy()
    model = ref.EncoderDecoderModel(**SHAPE.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()
    assert np.array_equal(ref.greedy_decode(model, src, 10), plain), "the reference's greedy tokens differ from MarianMT"
    assert np.array_equal(ref.greedy_decode(model, src, 10, eos_id=eos), with_eos)
    cases["greedy"] = {"src": src, "tokens": plain, "eos": np.int64(eos), "tokens_eos": with_eos}

    # variants HuggingFace has no model for: separate embeddings, learned positions, pre-norm
    kw = dict(SHAPE.model_kwargs(), share_embeddings=False, positions="learned", norm_first=True,
              activation="gelu", num_decoder_layers=1)
    var = ref.EncoderDecoderModel(**kw, rng=np.random.default_rng(0))
    vstate = {}
    for name, value in var.state_dict().items():
        if "layer_norm.weight" in name:
            vstate[name] = (1 + 0.2 * rng.standard_normal(value.shape)).astype(np.float32)
        else:
            vstate[name] = (0.4 * rng.standard_normal(value.shape)).astype(np.float32)
    var.load_state_dict(vstate)
    cases["model_variants"] = {"src": src, "tgt": tgt, **_params(vstate), "logits": var(src, tgt)}
    cases["decoding"] = _decoding_case(ref, np.random.default_rng(919))
    return cases


DECODING_SHAPE = Seq2SeqShape(vocab_size=40, d_model=D, num_layers=2, num_heads=H, d_ff=F, max_seq_len=16, pad_id=3)
START, NEW_TOKENS = 5, 9


def _decoding_case(ref, rng):
    """A MarianMT with padding id 3: logits, and generate() from start token 5 with an EOS
    that every row, some rows or no row emits."""
    import torch

    shape = DECODING_SHAPE
    pad = shape.pad_id
    state = random_seq2seq_state(shape, rng)
    hf = hf_marian(state, shape)
    model = ref.EncoderDecoderModel(**shape.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()

    def hf_generate(eos):
        with torch.no_grad():
            return hf.generate(torch.from_numpy(src), attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                               num_beams=1, decoder_start_token_id=START, eos_token_id=eos, pad_token_id=pad).numpy()

    for _ in range(200):  # sources until one has EOS ids for all three situations
        src = rng.integers(4, shape.vocab_size, (3, 6))
        src[:, 1] = 0  # a real token whose id is 0: padding is the id 3 here
        src[1, 4:] = pad
        src[2, 3:] = pad
        eos = eos_choices(ref.greedy_decode(model, src, NEW_TOKENS, start_id=START)[:, 1:], skip=(pad, START))
        if eos:
            break
    else:
        raise AssertionError("decoding: no source gives an EOS for all, some and no rows")
    tgt = np.concatenate([np.full((3, 1), START), rng.integers(4, shape.vocab_size, (3, 4))], axis=1)
    tgt[:, 2] = pad  # the padding id inside the target is a real token: tgt_keep defaults to all True
    mask = torch.from_numpy(src != pad).long()
    with torch.no_grad():
        logits = hf(input_ids=torch.from_numpy(src), attention_mask=mask,
                    decoder_input_ids=torch.from_numpy(tgt)).logits
    case = {"src": src, "tgt": tgt, "start": np.int64(START), "pad": np.int64(pad), **_params(state),
            "logits": logits.numpy()}
    case.update({f"eos_{k}": np.int64(v) for k, v in eos.items()})
    case.update({f"tokens_{k}": hf_generate(v) for k, v in eos.items()})

    def outputs(m):
        mdl = m.EncoderDecoderModel(**shape.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()
        out = {"logits": mdl(src, tgt)}
        out.update({f"tokens_{k}": m.greedy_decode(mdl, src, NEW_TOKENS, start_id=START, eos_id=v)
                    for k, v in eos.items()})
        return out

    mine = outputs(ref)
    assert np.allclose(mine["logits"], case["logits"], atol=1e-4, rtol=1e-4), \
        "decoding: the reference differs from MarianMT"
    for k in eos:
        assert np.array_equal(mine[f"tokens_{k}"], case[f"tokens_{k}"]), f"decoding: greedy tokens differ ({k})"
        for kw in ({"use_cache": False}, {"cache_cross": False}):
            assert np.array_equal(ref.greedy_decode(model, src, NEW_TOKENS, start_id=START, eos_id=eos[k], **kw),
                                  case[f"tokens_{k}"]), f"decoding: greedy tokens differ ({k}, {kw})"
    return {**case, **diagnoses(LAB, "decoding", case, outputs, "seq2seq")}
