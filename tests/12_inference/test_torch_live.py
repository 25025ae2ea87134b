"""Lab 12 · live checks against PyTorch and HuggingFace: tiled attention against
``torch.nn.functional.scaled_dot_product_attention`` (causal, and with more keys than
queries through an explicit mask), and the fast forward, also with int8 weights, against
HuggingFace's ``GPT2LMHeadModel`` holding the same random parameters. PyTorch runs on CUDA
when there is one (TF32 off), else the CPU.
"""

import numpy as np
import pytest

from gptkit.checkpoints import SMALL_SHAPES, hf_model, random_gpt2_state
from gptkit.testing import assert_close, lab
from gptkit.testing.parameters import set_parameters
from gptkit.testing.torchref import device, to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
I = lab("inference")
G = lab("gpt")


@pytest.mark.parametrize("T, S, block_q, block_k", [(100, 100, 32, 16), (37, 80, 8, 24), (1, 33, 64, 64)])
def test_tiled_attention_matches_torch(T, S, block_q, block_k):
    torch = torch_or_skip()
    rng = np.random.default_rng(T + S)
    q = (2 * rng.standard_normal((2, 3, T, 16))).astype(np.float32)
    k, v = rng.standard_normal((2, 3, S, 16)).astype(np.float32), rng.standard_normal((2, 3, S, 16)).astype(np.float32)
    allowed = np.arange(S)[None, :] <= (S - T + np.arange(T))[:, None]  # query i at position S − T + i
    with torch.no_grad():
        ref = torch.nn.functional.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v),
                                                               attn_mask=to_torch(allowed))
    out = I.tiled_causal_attention(q, k, v, block_q=block_q, block_k=block_k)
    assert_close(out, to_numpy(ref), what=f"tiled attention vs torch's scaled_dot_product_attention, T={T}, S={S}")


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_fast_forward_matches_huggingface(int8):
    torch = torch_or_skip()
    shape = SMALL_SHAPES["4 heads"]
    rng = np.random.default_rng(12)
    state = random_gpt2_state(shape, rng)
    model = set_parameters(G.GPTModel(**shape.model_kwargs(), rng=rng), state, "GPTModel")
    ids = rng.integers(0, shape.vocab_size, (2, shape.max_seq_len))
    with torch.no_grad():
        ref = to_numpy(hf_model(state, shape, device())(to_torch(ids)).logits)
    if not int8:
        assert_close(I.fast_forward(model, ids, block_q=8, block_k=16), ref,
                     what="fast_forward vs HuggingFace's GPT2LMHeadModel")
        return
    logits = I.fast_forward(I.quantize_model(model, 16), ids)
    err = float(np.abs(logits - ref).max() / np.abs(ref).max())
    assert err < 0.05, f"int8 weights (blocks of 16) moved the logits by {err:.3f} of HuggingFace's largest"
