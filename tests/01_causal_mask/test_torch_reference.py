"""Lab 01 · live comparison with PyTorch's scaled_dot_product_attention and softmax."""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab
from gptkit.testing.torchref import to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
cm = lab("causal_mask")


@pytest.mark.parametrize("T,S", [(6, 6), (3, 8)])
def test_attention_matches_torch_sdpa(T, S):
    torch = torch_or_skip()
    rng = np.random.default_rng(11)
    q = rng.normal(size=(2, 4, T, 16)).astype(np.float32)
    k = rng.normal(size=(2, 4, S, 16)).astype(np.float32)
    v = rng.normal(size=(2, 4, S, 8)).astype(np.float32)
    mask = np.tril(np.ones((T, S), bool), k=S - T)  # torch's own bottom-right causal mask
    expected = torch.nn.functional.scaled_dot_product_attention(
        to_torch(q), to_torch(k), to_torch(v), attn_mask=to_torch(mask))
    out, _ = cm.scaled_dot_product_attention(q.copy(), k.copy(), v.copy(), cm.causal_mask(T, S))
    assert_close(out, to_numpy(expected), what=f"attention output vs torch SDPA (T={T}, S={S})",
                 atol=1e-5, rtol=1e-4)


def test_softmax_matches_torch():
    torch = torch_or_skip()
    x = np.random.default_rng(3).normal(0, 20, size=(4, 33)).astype(np.float32)
    expected = to_numpy(torch.softmax(to_torch(x), dim=-1))
    assert_close(cm.softmax(x.copy()), expected, what="softmax vs torch.softmax")
