"""Lab 09 · live comparison with HuggingFace's MarianMTModel (post-norm, sinusoidal
positions, shared embeddings) holding the same random parameters, in several shapes:
logits on padded batches and greedy ``generate()`` token for token."""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab
from gptkit.testing.parameters import set_parameters
from gptkit.testing.seq2seq import Seq2SeqShape, hf_marian, random_seq2seq_state
from gptkit.testing.torchref import device, to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
M = lab("seq2seq")

SHAPES = {
    "1 head, ReLU": Seq2SeqShape(vocab_size=60, d_model=16, num_layers=1, num_heads=1, d_ff=32, max_seq_len=24),
    "4 heads, GELU, 3+2 layers": Seq2SeqShape(vocab_size=97, d_model=32, num_layers=3, num_decoder_layers=2,
                                              num_heads=4, d_ff=48, max_seq_len=24, activation="gelu"),
    "8 heads, pad 3, eos 5": Seq2SeqShape(vocab_size=50, d_model=64, num_layers=2, num_heads=8, d_ff=64,
                                          max_seq_len=32, pad_id=3, eos_id=5),
    "2 heads, swish (SiLU)": Seq2SeqShape(vocab_size=40, d_model=16, num_layers=2, num_heads=2, d_ff=24,
                                          max_seq_len=24, activation="swish"),
}


def _pair(name):
    torch_or_skip()
    shape = SHAPES[name]
    rng = np.random.default_rng(len(name))
    state = random_seq2seq_state(shape, rng)
    model = set_parameters(M.EncoderDecoderModel(**shape.model_kwargs(), rng=rng), state, f"EncoderDecoderModel ({name})")
    return shape, model, hf_marian(state, shape, device()), rng


def _padded_source(shape, rng, B=4, S=9):
    src = rng.integers(0, shape.vocab_size, (B, S))
    src[src == shape.pad_id] = (shape.pad_id + 1) % shape.vocab_size
    for b, n in enumerate([S, S - 3, 2, S - 1][:B]):
        src[b, n:] = shape.pad_id
    return src


@pytest.mark.parametrize("name", SHAPES)
def test_logits_match_marian_on_padded_batches(name):
    torch = torch_or_skip()
    shape, model, hf, rng = _pair(name)
    src = _padded_source(shape, rng)
    tgt = rng.integers(0, shape.vocab_size, (4, 7))
    tgt[:, 0] = shape.pad_id
    tgt_keep = np.ones((4, 7), bool)
    tgt_keep[1, 5:] = tgt_keep[3, 2:] = False
    with torch.no_grad():
        expected = hf(input_ids=to_torch(src), attention_mask=to_torch((src != shape.pad_id).astype(np.int64)),
                      decoder_input_ids=to_torch(tgt), decoder_attention_mask=to_torch(tgt_keep.astype(np.int64))).logits
    expected = to_numpy(expected)
    # Padded target positions carry nothing (no loss, no prediction is read there): only the real ones decide.
    # The bound is certified (docs/tolerances.md): the reference and an independent solution both differ from
    # MarianMT by 9.7e-5 at real positions, torch's rounding against NumPy's.
    assert_close(np.asarray(model(src, tgt, tgt_keep=tgt_keep))[tgt_keep], expected[tgt_keep],
                 what=f"logits vs MarianMTModel ({name})", atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("name", SHAPES)
def test_greedy_matches_marian_generate(name):
    torch = torch_or_skip()
    shape, model, hf, rng = _pair(name)
    src = _padded_source(shape, rng)
    with torch.no_grad():
        theirs = to_numpy(hf.generate(to_torch(src), attention_mask=to_torch((src != shape.pad_id).astype(np.int64)),
                                      max_new_tokens=12, do_sample=False, num_beams=1, eos_token_id=shape.eos_id))
    for kw in ({}, {"use_cache": False}, {"cache_cross": False}):
        ours = np.asarray(M.greedy_decode(model, src, 12, eos_id=shape.eos_id, **kw))
        assert ours.shape == theirs.shape and np.array_equal(ours, theirs), (
            f"greedy_decode {kw} ({name}) differs from MarianMT's generate(): expected {theirs.tolist()}, "
            f"got {ours.tolist()}")


@pytest.mark.parametrize("name", SHAPES)
def test_greedy_from_another_start_token_matches_marian_generate(name):
    torch = torch_or_skip()
    shape, model, hf, rng = _pair(name)
    src = _padded_source(shape, rng)
    start = (shape.pad_id + 4) % shape.vocab_size  # not the padding id
    mask = to_torch((src != shape.pad_id).astype(np.int64))
    with torch.no_grad():
        plain = to_numpy(hf.generate(to_torch(src), attention_mask=mask, max_new_tokens=10, do_sample=False,
                                     num_beams=1, decoder_start_token_id=start, eos_token_id=None))
    for eos in {int(plain[0, 3]), int(plain[-1, -1])}:  # a token some rows emit, one the last row ends on
        with torch.no_grad():
            theirs = to_numpy(hf.generate(to_torch(src), attention_mask=mask, max_new_tokens=10, do_sample=False,
                                          num_beams=1, decoder_start_token_id=start, eos_token_id=eos,
                                          pad_token_id=shape.pad_id))
        ours = np.asarray(M.greedy_decode(model, src, 10, start_id=start, eos_id=eos))
        assert ours.shape == theirs.shape and np.array_equal(ours, theirs), (
            f"greedy_decode(start_id={start}, eos_id={eos}) ({name}) differs from MarianMT's generate("
            f"decoder_start_token_id={start}): expected {theirs.tolist()}, got {ours.tolist()}")
