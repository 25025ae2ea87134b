"""Lab 03 · live comparison with torch.nn.LayerNorm and GELU (tanh and erf forms)."""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab
from gptkit.testing.torchref import device, to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
L = lab("layers")


def test_layernorm_matches_torch():
    torch = torch_or_skip()
    rng = np.random.default_rng(8)
    x = (rng.normal(size=(3, 7, 32)) * 4 + 1).astype(np.float32)
    w, b = rng.normal(size=32).astype(np.float32), rng.normal(size=32).astype(np.float32)
    ref = torch.nn.LayerNorm(32, eps=1e-5).to(device())
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(w))
        ref.bias.copy_(torch.from_numpy(b))
    ln = L.LayerNorm(32)
    ln.weight, ln.bias = w.copy(), b.copy()
    expected = to_numpy(ref(to_torch(x)))
    assert_close(ln(x.copy()), expected, what="LayerNorm vs torch.nn.LayerNorm", atol=1e-5)


@pytest.mark.parametrize("form", ["tanh", "none"])
def test_gelu_matches_torch(form):
    torch = torch_or_skip()
    x = np.linspace(-5, 5, 301, dtype=np.float32)
    expected = to_numpy(torch.nn.functional.gelu(to_torch(x), approximate=form))
    ours = L.gelu(x) if form == "tanh" else L.gelu_exact(x)
    assert_close(ours, expected, what=f"GELU ({form}) vs torch.nn.functional.gelu", atol=2e-6, rtol=1e-5)
