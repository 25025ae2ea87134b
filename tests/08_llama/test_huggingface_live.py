"""Lab 08 · live checks against HuggingFace's Llama (``LlamaForCausalLM``), on random
checkpoints in several shapes (every parameter random, RMSNorm gains included): logits,
logits through the cache, greedy ``generate()`` token for token, ``LlamaRMSNorm``,
``apply_rotary_pos_emb`` at offset positions and ``repeat_kv``. HuggingFace runs on CUDA
when there is one (TF32 off), else the CPU.
"""

import numpy as np
import pytest

from gptkit.llama_checkpoints import LlamaShape, hf_llama, random_llama_state
from gptkit.testing import assert_close, lab
from gptkit.testing.torchref import device, to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
L = lab("llama")

SHAPES = {
    "GQA 8 over 2 heads": LlamaShape(vocab_size=96, d_model=64, num_layers=2, num_heads=8, num_kv_heads=2,
                                     d_ff=80, max_seq_len=48),
    "MHA, tied, eps 1e-5": LlamaShape(vocab_size=50, d_model=32, num_layers=3, num_heads=4, num_kv_heads=4,
                                      d_ff=56, max_seq_len=40, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "MQA, theta 1e6": LlamaShape(vocab_size=70, d_model=48, num_layers=2, num_heads=3, num_kv_heads=1,
                                 d_ff=64, max_seq_len=64, rope_theta=1e6),
}


def _pair(name, seed):
    torch_or_skip()
    shape = SHAPES[name]
    rng = np.random.default_rng(seed)
    state = random_llama_state(shape, rng)
    model = L.LlamaModel(**shape.model_kwargs(), rng=rng)
    ours = {L.model_name(k): L.to_model_layout(L.model_name(k), v) for k, v in state.items()}
    model.load_state_dict(ours)
    return model.eval(), hf_llama(state, shape, device()), rng


def _hf_generate(hf, prompt, n, eos=None):
    torch = torch_or_skip()
    ids = to_torch(prompt)
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                          eos_token_id=eos, pad_token_id=0 if eos is None else eos)
    return to_numpy(out)


@pytest.mark.parametrize("name", SHAPES)
def test_logits_and_cache_match_huggingface(name):
    torch = torch_or_skip()
    model, hf, rng = _pair(name, seed=len(name))
    ids = rng.integers(0, SHAPES[name].vocab_size, (2, 30))
    with torch.no_grad():
        expected = to_numpy(hf(to_torch(ids)).logits)
    assert_close(model(ids), expected, what=f"logits vs LlamaForCausalLM ({name})", atol=1e-4)
    cache, parts, start = L.LlamaCache(model, 2), [], 0
    for n in (9, 1, 1, 5, 14):
        parts.append(L.forward_with_cache(model, ids[:, start : start + n], cache))
        start += n
    assert_close(np.concatenate(parts, axis=1), expected, what=f"cached logits vs LlamaForCausalLM ({name})",
                 atol=1e-4)


@pytest.mark.parametrize("name", SHAPES)
def test_greedy_generate_matches_huggingface(name):
    model, hf, rng = _pair(name, seed=3 * len(name))
    prompt = rng.integers(0, SHAPES[name].vocab_size, (3, 5))
    for eos in (None, int(_hf_generate(hf, prompt, 16)[1, 5 + 4])):
        theirs = _hf_generate(hf, prompt, 16, eos)
        ours = np.asarray(L.generate(model, prompt, 16, eos_token_id=eos))
        assert ours.shape == theirs.shape and np.array_equal(ours, theirs), (
            f"greedy generate (eos_token_id={eos}, {name}): HuggingFace {theirs.tolist()}, yours {ours.tolist()}")


@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_rmsnorm_matches_llama_rmsnorm(eps):
    torch = torch_or_skip()
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    rng = np.random.default_rng(8)
    x = (rng.standard_normal((4, 6, 24)) * 1e-3).astype(np.float32)
    w = (1 + 0.3 * rng.standard_normal(24)).astype(np.float32)
    ref = LlamaRMSNorm(24, eps=eps).to(device())
    ref.weight.data = to_torch(w)
    norm = L.RMSNorm(24, eps=eps)
    norm.weight = w
    with torch.no_grad():
        expected = to_numpy(ref(to_torch(x)))
    assert_close(norm(x), expected, what=f"RMSNorm(eps={eps:g}) vs LlamaRMSNorm on inputs ~1e-3", atol=1e-5)


@pytest.mark.parametrize("offset, theta", [(0, 10000.0), (37, 10000.0), (5, 500000.0)])
def test_rope_matches_apply_rotary_pos_emb(offset, theta):
    torch = torch_or_skip()
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    rng = np.random.default_rng(offset)
    x = rng.standard_normal((2, 4, 9, 16)).astype(np.float32)
    positions = np.arange(9) + offset
    rot = LlamaRotaryEmbedding(config=LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=theta)).to(device())
    t = to_torch(x)
    cos, sin = rot(t, to_torch(positions)[None])
    q, _ = apply_rotary_pos_emb(t, t, cos, sin)
    assert_close(L.apply_rope(x, positions, theta), to_numpy(q), atol=1e-5,
                 what=f"apply_rope at positions {offset}…{offset + 8}, base {theta:g} vs apply_rotary_pos_emb")


def test_repeat_kv_matches_huggingface():
    torch_or_skip()
    from transformers.models.llama.modeling_llama import repeat_kv

    x = np.random.default_rng(9).standard_normal((2, 3, 5, 4)).astype(np.float32)
    assert_close(L.repeat_kv(x, 4), to_numpy(repeat_kv(to_torch(x), 4)), what="repeat_kv(x, 4) vs HuggingFace",
                 atol=0, rtol=0)


@pytest.mark.parametrize("name", SHAPES)
def test_logits_at_positions_with_gaps_match_position_ids(name):
    torch = torch_or_skip()
    model, hf, rng = _pair(name, seed=5 * len(name))
    T = 12
    positions = np.sort(rng.choice(np.arange(3, SHAPES[name].max_seq_len), T, replace=False))  # gaps, an offset
    ids = rng.integers(0, SHAPES[name].vocab_size, (2, T))
    with torch.no_grad():
        out = hf(to_torch(ids), position_ids=to_torch(positions)[None].expand(2, -1), output_hidden_states=True)
    assert_close(model.layers[0](to_numpy(out.hidden_states[0]), positions), to_numpy(out.hidden_states[1]),
                 what=f"the first LlamaBlock at positions {positions.tolist()} vs HuggingFace's ({name})", atol=1e-4)
    assert_close(model(ids, positions), to_numpy(out.logits), atol=1e-4,
                 what=f"logits at positions {positions.tolist()} vs LlamaForCausalLM's position_ids ({name})")
