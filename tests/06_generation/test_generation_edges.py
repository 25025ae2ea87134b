"""Lab 06 · edge cases: token 0 as the end-of-sequence token, and a loss that leaves the
ids it is given as they were."""

import numpy as np

from gptkit.testing import fixture_params, lab, load_fixture
from gptkit.testing.parameters import set_parameters

S = lab("generation")
G = lab("gpt")
LAB = "06_generation"
V, D, LAYERS, HEADS, L = 48, 16, 2, 2, 24  # the fixtures' model (d_head = 8)


def _model(state=None):
    f = load_fixture(LAB, "cache")
    model = G.GPTModel(V, D, LAYERS, HEADS, 4 * D, L, rng=np.random.default_rng(1))
    return set_parameters(model, state or fixture_params(f), f"GPTModel(vocab_size={V}, d_model={D})")


def _model_that_says_0():
    """The fixtures' model with its final LayerNorm's gain zeroed: every position's hidden state is the
    bias b, and token 0's embedding is 4·b, so token 0 has by far the highest logit everywhere."""
    state = {k: np.array(v) for k, v in fixture_params(load_fixture(LAB, "cache")).items()}
    b = np.random.default_rng(60).normal(size=D).astype(np.float32)
    state["ln_f.weight"], state["ln_f.bias"] = np.zeros(D, np.float32), b
    state["wte.weight"][0] = 4 * b
    return _model(state)


def test_generate_eos_token_id_0_is_an_eos():
    model = _model_that_says_0()
    prompt = np.array([[5, 6, 7], [8, 9, 10]])
    for use_cache in (True, False):
        out = np.asarray(S.generate(model, prompt, 6, temperature=0, eos_token_id=0, use_cache=use_cache))
        assert out.tolist() == [[5, 6, 7, 0], [8, 9, 10, 0]], (
            f"generate(temperature=0, eos_token_id=0, use_cache={use_cache}) with a model whose best token is "
            f"always 0: expected [[5, 6, 7, 0], [8, 9, 10, 0]] (both rows emit EOS at once, generation stops), got "
            f"{out.tolist()}: eos_token_id=0 is token 0, an EOS like any other: test `eos_token_id is not None`, "
            "not its truth value")


def test_next_token_loss_leaves_the_ids_unchanged():
    model = _model()
    ids = np.array([[3, 7, 1, 0, 0], [4, 4, 9, 2, 5]])
    before = ids.copy()
    S.next_token_loss(model, ids, pad_id=0)
    assert np.array_equal(ids, before), (
        f"next_token_loss changed the token ids it was given: {before.tolist()} became {ids.tolist()}. Shift by "
        "slicing (logits[:, :-1] against token_ids[:, 1:]), never in place: the caller still needs its ids")
    logits, targets = np.random.default_rng(61).normal(size=(2, 4, V)).astype(np.float32), ids[:, 1:]
    logits_before, targets_before = logits.copy(), targets.copy()
    S.cross_entropy(logits, targets, ignore_index=0)
    assert np.array_equal(logits, logits_before) and np.array_equal(targets, targets_before), (
        "cross_entropy changed the logits or targets it was given: compute into new arrays, never in place")
