"""Hidden checks for lab 02."""

import numpy as np

from gptkit.testing import assert_close, lab

emb = lab("embeddings")


def test_sum_with_offset_on_a_large_table():
    rng = np.random.default_rng(77)
    V, L, D = 500, 64, 24
    layer = emb.GPTEmbedding(V, L, D, rng=rng)
    wte, wpe = rng.normal(size=(V, D)).astype(np.float32), rng.normal(size=(L, D)).astype(np.float32)
    layer.wte.weight, layer.wpe.weight = wte.copy(), wpe.copy()
    ids = rng.integers(0, V, size=(4, 20))
    expected = wte[ids] + wpe[40:60]  # from the test's own arrays, before the call
    out = layer(ids.copy(), offset=40)
    assert_close(out, expected, what="GPTEmbedding with offset 40")


def test_sinusoid_matches_closed_form():
    L, D = 33, 10
    pos = np.arange(L)[:, None]
    i = np.arange(0, D, 2)[None, :]
    expected = np.zeros((L, D))
    expected[:, 0::2] = np.sin(pos / 10000 ** (i / D))
    expected[:, 1::2] = np.cos(pos / 10000 ** (i / D))
    assert_close(emb.sinusoidal_positional_encoding(L, D), expected, what="sinusoidal encoding", atol=1e-5)
