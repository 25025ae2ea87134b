"""Lab 02 · live comparison with torch.nn.Embedding."""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab
from gptkit.testing.torchref import device, to_numpy, torch_or_skip

pytestmark = pytest.mark.torch
emb = lab("embeddings")


def test_token_embedding_matches_torch_embedding():
    torch = torch_or_skip()
    rng = np.random.default_rng(5)
    weight = rng.normal(size=(40, 8)).astype(np.float32)
    ids = rng.integers(0, 40, size=(2, 9))
    ref = torch.nn.Embedding(40, 8).to(device())
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(weight))
    layer = emb.TokenEmbedding(40, 8, rng=rng)
    layer.weight = weight
    expected = to_numpy(ref(torch.from_numpy(ids).to(device())))
    assert_close(layer(ids), expected, what="TokenEmbedding vs torch.nn.Embedding", atol=0, rtol=0)
