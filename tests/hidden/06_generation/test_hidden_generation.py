"""Hidden checks for lab 06: shapes the public tests do not use, against independent
computations written here (hidden tests hold no stored answers)."""

import numpy as np

from gptkit.testing import assert_close, lab
from gptkit.checkpoints import GPT2Shape, random_gpt2_state
from gptkit.testing.parameters import set_parameters

S = lab("generation")
G = lab("gpt")
SHAPE = GPT2Shape(vocab_size=23, d_model=12, num_layers=2, num_heads=4, max_seq_len=18)


def _model(seed):
    rng = np.random.default_rng(seed)
    return set_parameters(G.GPTModel(**SHAPE.model_kwargs(), rng=rng), random_gpt2_state(SHAPE, rng), "GPTModel")


def test_cross_entropy_against_float64_with_padding():
    rng = np.random.default_rng(6060)
    logits = rng.normal(0, 4, (3, 5, 11)).astype(np.float32)
    targets = rng.integers(0, 11, (3, 5))
    targets[1, 3:] = 7  # padding, ignored below
    keep = np.ones_like(targets, bool)
    keep[1, 3:] = False
    x = logits.astype(np.float64)
    logp = x - x.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, targets[..., None], -1)[..., 0][keep].mean()
    got = S.cross_entropy(logits, np.where(keep, targets, -100), ignore_index=-100)
    assert_close(np.float64(got), np.float64(expected), what="cross_entropy with ignored targets", atol=1e-5)


def test_cache_in_uneven_chunks_equals_the_full_pass():
    model = _model(6061)
    ids = np.random.default_rng(6062).integers(0, SHAPE.vocab_size, (2, 13))
    full = model(ids)
    cache = S.KVCache(model, 2)
    parts = [S.forward_with_cache(model, ids[:, a:b], cache) for a, b in ((0, 5), (5, 6), (6, 13))]
    assert_close(np.concatenate(parts, axis=1), full, what="logits from chunks of 5, 1 and 7 tokens", atol=1e-5)


def test_one_beam_follows_the_models_own_argmax():
    model = _model(6063)
    prompt = np.array([[4, 8, 15]])
    out = S.beam_search(model, prompt, 1, 7)
    for t in range(3, 10):
        assert out[0, t] == model(out[:, :t])[0, -1].argmax(), f"token {t} is not the argmax after position {t - 1}"
