"""Lab 04 · live comparison with HuggingFace's GPT2LMHeadModel holding the same random
parameters, in several shapes (head counts, context lengths, vocabularies)."""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab
from gptkit.checkpoints import GPT2Shape, hf_model, random_gpt2_state
from gptkit.testing.parameters import set_parameters
from gptkit.testing.torchref import device, to_numpy, torch_or_skip

pytestmark = pytest.mark.torch
G = lab("gpt")

SHAPES = {
    "1 head": GPT2Shape(vocab_size=64, d_model=16, num_layers=2, num_heads=1, max_seq_len=12),
    "4 heads": GPT2Shape(vocab_size=97, d_model=32, num_layers=3, num_heads=4, max_seq_len=20, d_ff=48),
    "8 heads, long context": GPT2Shape(vocab_size=50, d_model=64, num_layers=2, num_heads=8, max_seq_len=64),
}


@pytest.mark.parametrize("name", SHAPES)
def test_logits_match_huggingface(name):
    torch = torch_or_skip()
    shape = SHAPES[name]
    rng = np.random.default_rng(len(name))
    state = random_gpt2_state(shape, rng)
    model = set_parameters(G.GPTModel(**shape.model_kwargs(), rng=rng), state, f"GPTModel ({name})")
    ids = rng.integers(0, shape.vocab_size, (2, shape.max_seq_len))
    with torch.no_grad():
        expected = to_numpy(hf_model(state, shape, device())(torch.from_numpy(ids).to(device())).logits)
    assert_close(model(ids), expected, what=f"logits vs HuggingFace GPT2LMHeadModel ({name})", atol=1e-4, rtol=1e-4)


def test_multi_head_attention_matches_torch_sdpa():
    torch = torch_or_skip()
    rng = np.random.default_rng(9)
    Dm, Hm, T = 32, 4, 9
    layer = G.MultiHeadAttention(Dm, Hm, rng=rng)
    layer.c_attn.weight = rng.normal(0, 0.4, (Dm, 3 * Dm)).astype(np.float32)
    layer.c_attn.bias = rng.normal(0, 0.1, 3 * Dm).astype(np.float32)
    layer.c_proj.weight = rng.normal(0, 0.2, (Dm, Dm)).astype(np.float32)
    layer.c_proj.bias = rng.normal(0, 0.1, Dm).astype(np.float32)
    x = rng.normal(size=(2, T, Dm)).astype(np.float32)
    t = {k: torch.from_numpy(v).to(device()) for k, v in
         dict(x=x, wa=layer.c_attn.weight, ba=layer.c_attn.bias, wp=layer.c_proj.weight, bp=layer.c_proj.bias).items()}
    q, k, v = (t["x"] @ t["wa"] + t["ba"]).split(Dm, dim=-1)
    heads = [z.view(2, T, Hm, Dm // Hm).transpose(1, 2) for z in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*heads, is_causal=True)
    expected = out.transpose(1, 2).reshape(2, T, Dm) @ t["wp"] + t["bp"]
    assert_close(layer(x), to_numpy(expected), what="MultiHeadAttention vs torch SDPA (is_causal=True)",
                 atol=1e-5, rtol=1e-4)
