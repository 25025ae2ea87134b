"""Lab 09 · live comparison with ``torch.nn.TransformerEncoderLayer`` and
``TransformerDecoderLayer`` (batch_first) holding the same random parameters: post-norm and
pre-norm, ReLU and GELU, with ``tgt_mask``, ``tgt_key_padding_mask`` and
``memory_key_padding_mask``. On CUDA when available (TF32 off), else the CPU."""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab
from gptkit.testing.parameters import set_parameters
from gptkit.testing.seq2seq import random_layer_state, torch_layer
from gptkit.testing.torchref import device, to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
M = lab("seq2seq")
D, H, F = 32, 4, 48


def _inputs(rng):
    x = rng.normal(size=(3, 5, D)).astype(np.float32)
    memory = rng.normal(size=(3, 7, D)).astype(np.float32)
    src_keep = np.ones((3, 7), bool)
    src_keep[1, 4:] = False
    src_keep[2, 2:] = False
    tgt_keep = np.ones((3, 5), bool)
    tgt_keep[2, 3:] = False
    return x, memory, src_keep, tgt_keep


def _layers(cross, norm_first, activation, seed):
    """torch's layer and ours (``DecoderLayer`` with ``cross``, else ``EncoderLayer``) holding the
    same random parameters, and the generator that drew them (it goes on to draw the inputs)."""
    rng = np.random.default_rng(seed + 2 * norm_first + (activation == "gelu"))
    state = random_layer_state(D, F, rng, cross=cross)
    ref = torch_layer(state, d_model=D, num_heads=H, d_ff=F, cross=cross, norm_first=norm_first,
                      activation=activation, device=device())
    name = "DecoderLayer" if cross else "EncoderLayer"
    ours = set_parameters(getattr(M, name)(D, H, F, activation=activation, norm_first=norm_first, rng=rng),
                          state, name)
    return ref, ours, rng


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_matches_torch(norm_first, activation):
    torch = torch_or_skip()
    ref, ours, rng = _layers(True, norm_first, activation, seed=90)
    x, memory, src_keep, tgt_keep = _inputs(rng)
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool, device=device()), 1)  # True = may not attend
    expected = ref(to_torch(x), to_torch(memory), tgt_mask=causal, tgt_key_padding_mask=to_torch(~tgt_keep),
                   memory_key_padding_mask=to_torch(~src_keep))
    got = ours(x, memory, M.decoder_mask(tgt_keep), M.cross_attention_mask(src_keep, 5))
    name = "pre-norm" if norm_first else "post-norm"
    # padded target positions carry nothing: compare the real ones
    assert_close(np.asarray(got)[tgt_keep], to_numpy(expected)[tgt_keep], atol=6e-5, rtol=3e-4,
                 what=f"DecoderLayer ({name}, {activation}) vs torch TransformerDecoderLayer")


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    torch_or_skip()
    ref, ours, rng = _layers(False, norm_first, activation, seed=80)
    _, memory, src_keep, _ = _inputs(rng)
    expected = ref(to_torch(memory), src_key_padding_mask=to_torch(~src_keep))
    got = ours(memory, M.encoder_mask(src_keep))
    # torch's encoder leaves padded query rows as they come; compare the real positions
    assert_close(got[src_keep], to_numpy(expected)[src_keep],
                 what=f"EncoderLayer ({'pre' if norm_first else 'post'}-norm, {activation}) vs torch "
                      "TransformerEncoderLayer at real source positions", atol=6e-5, rtol=3e-4)
