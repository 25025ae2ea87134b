"""Lab 06 · live checks against HuggingFace and PyTorch, on random GPT-2 checkpoints in
several shapes (every parameter random) and one of GPT-2 small's shape (124M parameters):
greedy and beam-search ``generate()``, logits through the KV cache, the loss with
``labels``, ``torch.nn.functional.cross_entropy``, and HuggingFace's own top-k, top-p and
temperature processors. HuggingFace runs on CUDA when there is one (TF32 off), else the CPU.
"""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab
from gptkit.checkpoints import GPT2_SMALL, GPT2Shape, hf_model, random_gpt2_state
from gptkit.testing.parameters import set_parameters
from gptkit.testing.torchref import device, to_numpy, to_torch, torch_or_skip

pytestmark = pytest.mark.torch
S = lab("generation")
G = lab("gpt")

SHAPES = {
    "1 head": GPT2Shape(vocab_size=64, d_model=16, num_layers=2, num_heads=1, max_seq_len=32),
    "4 heads": GPT2Shape(vocab_size=97, d_model=32, num_layers=3, num_heads=4, max_seq_len=40, d_ff=48),
    "8 heads, eps 1e-3": GPT2Shape(vocab_size=50, d_model=64, num_layers=2, num_heads=8, max_seq_len=48,
                                   layer_norm_eps=1e-3),
}


def _pair(shape, seed):
    """The student's GPTModel and HuggingFace's GPT2LMHeadModel holding the same random parameters."""
    torch_or_skip()
    rng = np.random.default_rng(seed)
    state = random_gpt2_state(shape, rng)
    model = set_parameters(G.GPTModel(**shape.model_kwargs(), rng=rng), state, "GPTModel")
    return model, hf_model(state, shape, device()), rng


def _hf_generate(hf, prompt, n, *, num_beams=1, eos=None, length_penalty=1.0):
    torch = torch_or_skip()
    ids = to_torch(prompt)
    extra = {"length_penalty": length_penalty} if num_beams > 1 else {}
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                          num_beams=num_beams, eos_token_id=eos, pad_token_id=0 if eos is None else eos, **extra)
    return to_numpy(out)


def _same_tokens(ours, theirs, what):
    __tracebackhide__ = True
    assert ours.shape == theirs.shape, f"{what}: HuggingFace gives shape {theirs.shape}, yours {ours.shape}"
    if not np.array_equal(ours, theirs):
        b, t = (int(i) for i in np.argwhere(ours != theirs)[0])
        raise AssertionError(f"{what}: first difference at row {b}, position {t}: HuggingFace chose "
                             f"{int(theirs[b, t])}, yours {int(ours[b, t])}")


@pytest.mark.parametrize("name", SHAPES)
def test_greedy_generate_matches_huggingface(name):
    model, hf, rng = _pair(SHAPES[name], seed=len(name))
    prompt = rng.integers(0, SHAPES[name].vocab_size, (3, 5))
    theirs = _hf_generate(hf, prompt, 16)
    _same_tokens(S.generate(model, prompt, 16, temperature=0), theirs, f"greedy generate() ({name})")
    eos = int(theirs[1, 5 + 3])  # a token that row 1 emits: it ends there
    theirs = _hf_generate(hf, prompt, 16, eos=eos)
    _same_tokens(S.generate(model, prompt, 16, temperature=0, eos_token_id=eos), theirs,
                 f"greedy generate() with eos_token_id={eos} ({name})")


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("num_beams, length_penalty, with_eos", [(2, 1.0, False), (3, 1.0, True), (4, 2.0, True),
                                                                  (3, 0.5, True)])
def test_beam_search_matches_huggingface(name, num_beams, length_penalty, with_eos):
    model, hf, rng = _pair(SHAPES[name], seed=7 * len(name) + num_beams)
    prompt = rng.integers(0, SHAPES[name].vocab_size, (2, 4))
    n = 12
    eos = int(_hf_generate(hf, prompt, n, num_beams=num_beams)[0, 4 + 2]) if with_eos else None
    theirs = _hf_generate(hf, prompt, n, num_beams=num_beams, eos=eos, length_penalty=length_penalty)
    ours = S.beam_search(model, prompt, num_beams, n, eos_token_id=eos, length_penalty=length_penalty)
    _same_tokens(ours, theirs, f"beam search, num_beams={num_beams}, length_penalty={length_penalty}, "
                               f"eos_token_id={eos} ({name})")


@pytest.mark.parametrize("name", SHAPES)
def test_cached_logits_match_huggingface(name):
    torch = torch_or_skip()
    shape = SHAPES[name]
    model, hf, rng = _pair(shape, seed=3 * len(name))
    ids = rng.integers(0, shape.vocab_size, (2, shape.max_seq_len))
    cache = S.KVCache(model, 2)
    pieces, start = [], 0
    for n in (7, 1, 1, 3, 1, shape.max_seq_len - 13):
        pieces.append(S.forward_with_cache(model, ids[:, start : start + n], cache))
        start += n
    with torch.no_grad():
        expected = to_numpy(hf(to_torch(ids)).logits)
    assert_close(np.concatenate(pieces, axis=1), expected, what=f"logits through the KV cache vs HuggingFace ({name})",
                 atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape, ignore", [((6, 13), False), ((3, 4, 29), True), ((2, 3, 5, 7), True)])
def test_cross_entropy_matches_torch(shape, ignore):
    torch = torch_or_skip()
    rng = np.random.default_rng(sum(shape))
    logits = rng.normal(0, 4, shape).astype(np.float32)
    targets = rng.integers(0, shape[-1], shape[:-1])
    if ignore:
        targets[rng.random(targets.shape) < 0.4] = -100
        targets.reshape(-1)[0] = 1  # at least one counts
    ours = S.cross_entropy(logits, targets, ignore_index=-100 if ignore else None)
    expected = torch.nn.functional.cross_entropy(to_torch(logits).reshape(-1, shape[-1]),
                                                 to_torch(targets).reshape(-1), ignore_index=-100)
    assert_close(np.asarray(ours), to_numpy(expected), what=f"cross_entropy on logits {shape} vs torch",
                 atol=1e-5, rtol=1e-5)
    assert_close(S.log_softmax(logits), to_numpy(torch.log_softmax(to_torch(logits), dim=-1)),
                 what=f"log_softmax on {shape} vs torch", atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SHAPES)
def test_next_token_loss_matches_huggingface_labels(name):
    torch = torch_or_skip()
    shape = SHAPES[name]
    model, hf, rng = _pair(shape, seed=11 * len(name))
    pad = shape.vocab_size - 1
    ids = rng.integers(0, pad, (4, 20))
    for row, length in enumerate((20, 15, 9, 2)):
        ids[row, length:] = pad
    labels = ids.copy()
    labels[ids == pad] = -100
    ours = S.next_token_loss(model, ids, pad_id=pad)
    with torch.no_grad():
        expected = hf(to_torch(ids), labels=to_torch(labels)).loss
    assert_close(np.asarray(ours), to_numpy(expected), what=f"next_token_loss vs HuggingFace's loss ({name})",
                 atol=1e-5, rtol=1e-5)
    assert_close(np.asarray(S.perplexity(model, ids, pad_id=pad)), np.exp(to_numpy(expected)),
                 what=f"perplexity vs exp(HuggingFace's loss) ({name})", atol=1e-4, rtol=1e-4)


def test_filters_match_huggingface_processors():
    torch = torch_or_skip()
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    rng = np.random.default_rng(12)
    logits = (rng.normal(0, 3, (64, 30)).astype(np.float32))
    logits[:8] = np.round(logits[:8])  # rows with ties

    def hf(processor):
        with torch.no_grad():
            return to_numpy(processor(None, to_torch(logits)))

    for k in (1, 2, 5, 29, 30, 45):
        ours = S.top_k_filter(logits, k)
        theirs = hf(TopKLogitsWarper(k))
        assert np.array_equal(np.isfinite(ours), np.isfinite(theirs)), (
            f"top_k_filter(logits, {k}) keeps other tokens than HuggingFace's top_k={k} "
            f"(rows {np.flatnonzero((np.isfinite(ours) != np.isfinite(theirs)).any(axis=1)).tolist()})")
    for p in (0.05, 0.3, 0.7, 0.95, 1.0):
        ours = S.top_p_filter(logits[8:], p)
        theirs = hf(TopPLogitsWarper(p))[8:]
        assert np.array_equal(np.isfinite(ours), np.isfinite(theirs)), (
            f"top_p_filter(logits, {p}) keeps other tokens than HuggingFace's top_p={p} "
            f"(rows {np.flatnonzero((np.isfinite(ours) != np.isfinite(theirs)).any(axis=1)).tolist()})")
    for t in (0.3, 1.7):
        assert_close(S.apply_temperature(logits, t), hf(TemperatureLogitsWarper(t)),
                     what=f"apply_temperature(logits, {t}) vs HuggingFace's temperature", atol=1e-6)


def test_top_p_ties_match_huggingface():
    # Equal probabilities everywhere: HuggingFace keeps the higher ids among ties. Its
    # processor runs on the CPU here, where torch's sort keeps equal values in id order.
    torch = torch_or_skip()
    from transformers.generation.logits_process import TopPLogitsWarper

    rng = np.random.default_rng(9)
    for logits in (np.zeros((1, 8), np.float32), rng.integers(-2, 3, (40, 12)).astype(np.float32)):
        for p in (0.1, 0.3, 0.5, 0.75, 0.9):
            ours = np.isfinite(S.top_p_filter(logits, p))
            with torch.no_grad():
                theirs = np.isfinite(TopPLogitsWarper(p)(None, torch.from_numpy(logits)).numpy())
            rows = np.flatnonzero((ours != theirs).any(axis=1)).tolist()
            if rows:
                r = rows[0]
                raise AssertionError(
                    f"top_p_filter(logits, {p}) on tied logits keeps other tokens than HuggingFace's "
                    f"top_p={p} in rows {rows}; row {r}, logits {logits[r].tolist()}: yours keeps ids "
                    f"{np.flatnonzero(ours[r]).tolist()}, HuggingFace {np.flatnonzero(theirs[r]).tolist()}. "
                    "Among equally likely tokens the higher id comes first")


@pytest.fixture(scope="module")
def gpt2_small_pair():
    """A GPT-2-small-shaped model (124M parameters, every one random) in both libraries."""
    return _pair(GPT2_SMALL, seed=124)


def test_gpt2_small_shaped_generation_with_cache(gpt2_small_pair):
    model, hf, rng = gpt2_small_pair
    prompt = rng.integers(0, GPT2_SMALL.vocab_size, (2, 12))
    _same_tokens(S.generate(model, prompt, 16, temperature=0), _hf_generate(hf, prompt, 16),
                 "GPT-2-small-shaped greedy generate() with the KV cache, 16 tokens")


def test_gpt2_small_shaped_loss(gpt2_small_pair):
    torch = torch_or_skip()
    model, hf, rng = gpt2_small_pair
    ids = rng.integers(0, GPT2_SMALL.vocab_size, (2, 64))
    ours = S.next_token_loss(model, ids)
    with torch.no_grad():
        expected = hf(to_torch(ids), labels=to_torch(ids)).loss
    assert_close(np.asarray(ours), to_numpy(expected), what="GPT-2-small-shaped next_token_loss vs HuggingFace",
                 atol=1e-4, rtol=1e-4)
