"""Fixtures for lab 06, made by HuggingFace and checked against the reference solution.

One small GPT-2 with every parameter random (LayerNorm gains and all biases too), and for
it: HuggingFace's logits (for the KV-cache tests), ``generate()``'s greedy and beam-search
tokens (with and without EOS, a batch of prompts, length penalties other than 1), and
its loss with ``labels`` on padded and unpadded batches. Beside them: logits for the
sampler tests with the probabilities each sampling setting must draw from, HuggingFace's
own top-k / top-p / temperature processors' output, and ``torch``'s log-softmax and
cross-entropy.

A failing test names the mistake it sees, so the fixtures also hold what each mistake
would produce: for the deterministic functions, the output of the reference solution with
each bug of ``solutions/06_generation/bugs.toml`` whose ``diagnose`` names the case
(``cache``, ``greedy``, ``beam``, ``loss``) applied, by ``grader.fixtures.diagnoses``; for
the samplers, the distribution a mistake draws from. Every such diagnosis is checked to
differ from the right answer.
"""

import numpy as np

from gptkit.checkpoints import GPT2Shape, hf_model, random_gpt2_state
from grader.fixtures import bugged, diagnoses, differs

NEEDS_TORCH = True
LAB = "06_generation"

SHAPE = GPT2Shape(vocab_size=48, d_model=16, num_layers=2, num_heads=2, max_seq_len=24)
CHUNKS = [5, 1, 1, 2, 1, 3, 1, 10]  # the KV-cache tests feed the 24 tokens in these pieces
PAD = 47  # the padding id of the loss fixtures (a real vocabulary id, as GPT-2's EOS-as-pad is)
# Beam-search settings: (num_beams, max_new_tokens, length_penalty, with an EOS?)
BEAMS = {"a": (3, 8, 1.0, False), "b": (4, 10, 1.0, True), "c": (3, 12, 2.0, True), "d": (2, 9, 0.5, True)}


# -- HuggingFace -----------------------------------------------------------------------------

def _hf_generate(hf, prompt, n, *, num_beams=1, eos=None, length_penalty=1.0):
    import torch

    ids = torch.from_numpy(prompt)
    extra = {"length_penalty": length_penalty} if num_beams > 1 else {}
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                          num_beams=num_beams, eos_token_id=eos, pad_token_id=0 if eos is None else eos, **extra)
    return out.numpy()


def _hf_loss(hf, ids, pad=None):
    import torch

    labels = torch.from_numpy(ids.copy())
    if pad is not None:
        labels[labels == pad] = -100
    with torch.no_grad():
        return np.float32(hf(torch.from_numpy(ids), labels=labels).loss.item())


def _model(ref_gpt, state):
    model = ref_gpt.GPTModel(**SHAPE.model_kwargs(), rng=np.random.default_rng(0))
    return model.load_state_dict(state).eval()


# -- the cases ----------------------------------------------------------------------------------

def _cache_case(gen, model, hf, params, rng):
    import torch

    ids = rng.integers(0, SHAPE.vocab_size, (3, SHAPE.max_seq_len))
    with torch.no_grad():
        logits = hf(torch.from_numpy(ids)).logits.numpy()

    def stepwise(module):
        cache, outs, start = module.KVCache(model, 3), [], 0
        for n in CHUNKS:
            outs.append(module.forward_with_cache(model, ids[:, start : start + n], cache))
            start += n
        return np.concatenate(outs, axis=1)

    assert np.allclose(stepwise(gen), logits, atol=1e-5), "the reference's cached logits differ from HuggingFace's"
    cache = gen.KVCache(model, 3)
    gen.forward_with_cache(model, ids[:, : CHUNKS[0]], cache)
    case = {"ids": ids, "chunks": np.array(CHUNKS), "logits": logits,
            "keys0": cache.keys[0][:, :, : CHUNKS[0]].copy(), "values1": cache.values[1][:, :, : CHUNKS[0]].copy()}
    from gptkit.testing.firstdiff import record_trace, trace_arrays

    with record_trace(model) as calls:  # the model's own sub-layers: a failing test says whether lab 04's model
        model(ids)                      # or the cache path departs first
    case.update(trace_arrays(calls))
    return {**case, **diagnoses(LAB, "cache", case, lambda g: {"logits": stepwise(g)}, "generation"), **params}


def _eos_that_ends_rows(gen, model, prompt, n):
    """An EOS id that ends every row early, at different steps (so the output is shorter
    than the prompt + n and some rows are padded)."""
    greedy = gen.generate(model, prompt, n, temperature=0)
    T = prompt.shape[1]
    for eos in range(SHAPE.vocab_size):
        out = gen.generate(model, prompt, n, temperature=0, eos_token_id=eos)
        ends = [np.flatnonzero(row[T:] == eos) for row in out]
        if all(e.size for e in ends) and out.shape[1] < T + n and len({int(e[0]) for e in ends}) > 1 \
                and not np.array_equal(out, greedy[:, : out.shape[1]]):
            return eos
    raise AssertionError("no EOS id ends every row at different steps: change the seed")


def _greedy_case(gen, model, hf, rng):
    prompt = rng.integers(0, SHAPE.vocab_size, (3, 4))
    n = 14
    greedy = _hf_generate(hf, prompt, n)
    eos = _eos_that_ends_rows(gen, model, prompt, n)
    greedy_eos = _hf_generate(hf, prompt, n, eos=eos)
    assert np.array_equal(gen.generate(model, prompt, n, temperature=0), greedy)
    assert np.array_equal(gen.generate(model, prompt, n, temperature=0, eos_token_id=eos), greedy_eos)
    # one row repeated: the first new token's distribution, for the statistical tests of generate
    import torch

    with torch.no_grad():
        last = hf(torch.from_numpy(prompt[:1])).logits[:, -1].numpy()
    from causal_mask import softmax

    def probs(x):
        return softmax(x, axis=-1).astype(np.float64)

    case = {"prompt": prompt, "greedy": greedy, "eos": np.int64(eos), "greedy_eos": greedy_eos,
            "next_probs": probs(last[0]),
            "next_probs_t05_k5": probs(gen.top_k_filter(gen.apply_temperature(last[0], 0.5), 5))}
    return {**case, **diagnoses(LAB, "greedy", case, lambda g: {
        "greedy_eos": g.generate(model, prompt, n, temperature=0, eos_token_id=eos)}, "generation")}


def _beam_eos(gen, model, prompt, nb, n, lp, must_differ=()):
    """An EOS id that ends some hypotheses early and changes the result (with a length
    penalty other than 1, one for which the penalty changes the result too), and for which
    each variant in ``must_differ`` gives another result."""
    plain = gen.beam_search(model, prompt, nb, n, length_penalty=lp)
    for eos in range(SHAPE.vocab_size):
        out = gen.beam_search(model, prompt, nb, n, eos_token_id=eos, length_penalty=lp)
        if out.shape[1] == plain.shape[1] and np.array_equal(out, plain):
            continue
        if not (out[:, prompt.shape[1]:] == eos).any() or out.shape[1] == prompt.shape[1] + 1:
            continue
        if lp != 1.0 and np.array_equal(out, gen.beam_search(model, prompt, nb, n, eos_token_id=eos)):
            continue
        if any(np.array_equal(out, v.beam_search(model, prompt, nb, n, eos_token_id=eos, length_penalty=lp))
               for v in must_differ):
            continue
        return eos
    raise AssertionError("no EOS id makes this beam search interesting: change the seed")


def _beam_case(gen, model, hf, rng):
    prompt = rng.integers(0, SHAPE.vocab_size, (2, 3))
    case, searches = {"prompt": prompt}, {}
    # with a length penalty above 1, a row's early stop changes the result: make it show
    never_stops = bugged(LAB, "beam-never-stops-early", "generation")
    for name, (nb, n, lp, with_eos) in BEAMS.items():
        eos = _beam_eos(gen, model, prompt, nb, n, lp, [never_stops] if lp > 1 else []) if with_eos else None
        out = _hf_generate(hf, prompt, n, num_beams=nb, eos=eos, length_penalty=lp)
        mine = gen.beam_search(model, prompt, nb, n, eos_token_id=eos, length_penalty=lp)
        assert mine.shape == out.shape and np.array_equal(mine, out), f"beam {name}: the reference differs from HF"
        case.update({f"{name}_num_beams": np.int64(nb), f"{name}_max_new_tokens": np.int64(n),
                     f"{name}_length_penalty": np.float64(lp), f"{name}_eos": np.int64(-1 if eos is None else eos),
                     f"{name}_out": out})
        searches[name] = dict(num_beams=nb, max_new_tokens=n, eos_token_id=eos, length_penalty=lp)

    def outputs(g):
        return {f"{name}_out": g.beam_search(model, prompt, **kw) for name, kw in searches.items()}

    return {**case, **diagnoses(LAB, "beam", case, outputs, "generation")}


def _loss_case(gen, model, hf, rng):
    ids = rng.integers(0, SHAPE.vocab_size - 1, (3, 10))
    padded = ids.copy()
    for row, length in enumerate((10, 7, 4)):
        padded[row, length:] = PAD  # right padding
    full = rng.integers(0, SHAPE.vocab_size, (2, 9))
    case = {"padded": padded, "pad": np.int64(PAD), "full": full,
            "loss_padded": _hf_loss(hf, padded, PAD), "loss_full": _hf_loss(hf, full)}
    assert abs(gen.next_token_loss(model, padded, PAD) - case["loss_padded"]) < 1e-5
    assert abs(gen.next_token_loss(model, full) - case["loss_full"]) < 1e-5
    return {**case, **diagnoses(LAB, "loss", case, lambda g: {
        "loss_padded": g.next_token_loss(model, padded, PAD), "loss_full": g.next_token_loss(model, full)},
        "generation")}


def _cross_entropy_case(gen, rng):
    import torch
    import torch.nn.functional as F

    logits = rng.normal(0, 3, (4, 5, 11)).astype(np.float32)
    targets = rng.integers(0, 11, (4, 5))
    targets_ignoring = targets.copy()
    targets_ignoring[rng.random((4, 5)) < 0.3] = -100
    big = (logits * 400 + 3000).astype(np.float32)  # exp() of these overflows float32
    t = torch.from_numpy

    def ce(x, y):
        return np.float32(F.cross_entropy(t(x).reshape(-1, 11), t(y).reshape(-1), ignore_index=-100).item())

    case = {"logits": logits, "targets": targets, "targets_ignoring": targets_ignoring, "big": big,
            "ce": ce(logits, targets), "ce_ignoring": ce(logits, targets_ignoring), "ce_big": ce(big, targets),
            "log_softmax": torch.log_softmax(t(logits), -1).numpy(),
            "log_softmax_big": torch.log_softmax(t(big), -1).numpy()}
    assert abs(gen.cross_entropy(logits, targets_ignoring, ignore_index=-100) - case["ce_ignoring"]) < 1e-5
    assert abs(gen.cross_entropy(big, targets) - case["ce_big"]) < 1e-2
    return case


def _sampling_case(gen, rng):
    """Rows of logits, and the distribution each sampling setting must draw from."""
    import torch
    from causal_mask import softmax
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    V = 10
    logits = np.stack([np.sort(rng.normal(0, s, V))[rng.permutation(V)] for s in (1.0, 2.0, 1.5)]).astype(np.float32)
    T, K, P = gen.apply_temperature, gen.top_k_filter, gen.top_p_filter

    def hf(processor, x):
        return processor(None, torch.from_numpy(x)).numpy()

    case = {"logits": logits}
    # what HuggingFace's processors give: the filters must agree with them
    for name, proc, mine in [("temperature_07", TemperatureLogitsWarper(0.7), T(logits, 0.7)),
                             ("top_k_3", TopKLogitsWarper(3), K(logits, 3)),
                             ("top_p_08", TopPLogitsWarper(0.8), P(logits, 0.8)),
                             ("top_p_05", TopPLogitsWarper(0.5), P(logits, 0.5))]:
        case[f"hf_{name}"] = hf(proc, logits)
        assert np.allclose(mine, case[f"hf_{name}"], atol=1e-6), name
    ties = np.array([[2.0, 1.0, 1.0, 3.0, 1.0, 0.0, -1.0, 1.0]], np.float32)  # the 3rd largest, 1.0, four times
    case["ties"] = ties
    case["hf_ties_top_k_3"] = hf(TopKLogitsWarper(3), ties)
    assert np.array_equal(K(ties, 3), case["hf_ties_top_k_3"]) and np.isfinite(case["hf_ties_top_k_3"]).sum() == 6

    def probs(x):
        return softmax(x, axis=-1).astype(np.float64)

    # setting → (expected distribution, {mistake: the distribution it draws from})
    kept_p = np.isfinite(P(logits, 0.8))
    one_too_few = kept_p.copy()
    for row in range(len(logits)):  # drop the least likely kept token
        kept = np.flatnonzero(kept_p[row])
        one_too_few[row, kept[np.argmin(logits[row, kept])]] = False
    settings = {
        "t1": (probs(logits), {}),
        "t05": (probs(T(logits, 0.5)), {"ignored": probs(logits), "multiplied": probs(logits * 0.5)}),
        "t2": (probs(T(logits, 2.0)), {"ignored": probs(logits), "multiplied": probs(logits * 2.0)}),
        "k3": (probs(K(logits, 3)), {"k2": probs(K(logits, 2)), "k4": probs(K(logits, 4)), "unfiltered": probs(logits)}),
        "p08": (probs(P(logits, 0.8)), {"one_too_few": probs(np.where(one_too_few, logits, -np.inf)),
                                        "unfiltered": probs(logits)}),
        "combo": (probs(P(K(T(logits, 0.7), 5), 0.9)),
                  {"unfiltered": probs(T(logits, 0.7)), "p_before_t": probs(T(P(K(logits, 5), 0.9), 0.7))}),
    }
    for name, (expected, mistakes) in settings.items():
        case[f"probs_{name}"] = expected
        for mistake, p in mistakes.items():
            assert differs(expected, p, tol=1e-3), f"the mistake {name}/{mistake} draws from the right distribution"
            case[f"probs_{name}_{mistake}"] = p
    return case


def build() -> dict[str, dict[str, np.ndarray]]:
    import generation as gen
    import gpt as ref_gpt

    rng = np.random.default_rng(606)
    state = random_gpt2_state(SHAPE, rng)
    model = _model(ref_gpt, state)
    hf = hf_model(state, SHAPE)
    params = {f"param.{k}": v for k, v in state.items()}
    return {
        "cache": _cache_case(gen, model, hf, params, rng),
        "greedy": _greedy_case(gen, model, hf, rng),
        "beam": _beam_case(gen, model, hf, rng),
        "loss": _loss_case(gen, model, hf, rng),
        "cross_entropy": _cross_entropy_case(gen, rng),
        "sampling": _sampling_case(gen, rng),
    }
