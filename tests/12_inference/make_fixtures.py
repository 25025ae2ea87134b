"""Fixtures for lab 12, made from the reference solutions of labs 01–06 and 12 (no PyTorch).

One small GPT-2 with every parameter random (LayerNorm gains and all biases too), and two
drafts of the same vocabulary: a smaller random one and one "near" the target (the
target's parameters plus a little noise, so that some drafts are accepted and some are
not). For them:

- ``attention``: q, k, v of four shapes (T not a multiple of the tiles, S > T keys, one
  query, aligned tiles) with lab 01's causal attention computed in float64, and the
  number of tiles a tiled pass must visit;
- ``gelu``: inputs over [−6, 6] and GPT-2's tanh GELU in float64;
- ``model``: the target's parameters, token ids and lab 04's logits (for ``fast_forward``);
- ``slots``: a series of ``forward_slots`` calls on two sequences of different lengths in
  two slots of a three-slot cache, with lab 04's logits for each call's tokens;
- ``batched``: five prompts of different lengths through a two-slot ``BatchedDecoder``,
  each request's tokens from lab 06's greedy ``generate`` alone, the request in each slot
  after each step, and the number of forward passes;
- ``speculative``: the drafts' parameters and, per setting (the target as its own draft,
  the near draft, the small draft, prompt lookup, and an EOS), lab 06's greedy tokens and
  the reference's proposed / accepted / rounds counts;
- ``lookup``: contexts and what prompt lookup proposes for them;
- ``int8``: a weight with columns of very different sizes, its int8 values, scales and
  dequantised weight, an Int8Linear's output, and the quantised model's logits.

What each catalogued mistake outputs on a case that its ``diagnose`` names is stored
beside the right answer (``grader.fixtures.diagnoses``).
"""

import numpy as np

from gptkit.checkpoints import GPT2Shape, random_gpt2_state
from grader.fixtures import diagnoses

NEEDS_TORCH = False
LAB = "12_inference"

SHAPE = GPT2Shape(vocab_size=40, d_model=16, num_layers=2, num_heads=2, max_seq_len=48)
DRAFT_SHAPE = GPT2Shape(vocab_size=40, d_model=8, num_layers=1, num_heads=2, max_seq_len=48)
NEAR_NOISE = 0.15  # the near draft: each target parameter plus noise of NEAR_NOISE × its tensor's spread
# (name, T, S, d, d_v, leading dims, block_q, block_k)
ATTENTION = [("a", 37, 37, 8, 8, (2, 3), 8, 16), ("b", 10, 50, 4, 6, (2,), 4, 7),
             ("c", 1, 9, 4, 4, (), 64, 64), ("d", 64, 64, 16, 16, (1, 2), 16, 16)]
BATCH_PROMPTS = [3, 7, 1, 12, 5]  # prompt lengths, in order of submission
BATCH_NEW = [6, 2, 9, 4, 8]  # max_new_tokens of each
MAX_BATCH = 2
SLOT_CALLS = [((2,), 5, "a"), ((0,), 9, "b"), ((0, 2), 1, "ba"), ((2, 0), 3, "ab")]  # (slots, T, which rows)
SPEC_NEW = 23
# speculative_sample this cold is greedy: p and q are one-hot (along the greedy tokens the target's two
# largest logits differ by more than 4e-3, so exp(−gap / COLD) is 0), whatever the random numbers
COLD = 1e-6
# prompt lookup proposes 25 after this prompt; at WARM the target gives it 0.33 (0.11 at temperature 1)
LOOKUP_PROMPT, WARM = [23, 35, 25, 23, 19, 1, 23, 35], 0.5
LOOKUP = [([1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 1, 2, 3], 4, 3), ([5, 6, 7, 0, 8, 7, 0, 5, 6, 7], 3, 3),
          ([1, 2, 3, 4], 2, 3), ([4, 4, 4, 4], 5, 3), ([3, 1, 3, 2, 3, 1, 3], 2, 2)]


def _model(gpt, shape, state):
    model = gpt.GPTModel(**shape.model_kwargs(), rng=np.random.default_rng(0))
    return model.load_state_dict(state).eval()


def _params(state, prefix="param."):
    return {prefix + k: v for k, v in state.items()}


def _gelu64(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


# -- the cases ------------------------------------------------------------------------------------

def _attention_case(causal_mask, rng):
    case = {}
    for name, T, S, d, dv, lead, bq, bk in ATTENTION:
        q = (3 * rng.standard_normal((*lead, T, d))).astype(np.float32)  # large scores: the max moves between tiles
        k = rng.standard_normal((*lead, S, d)).astype(np.float32)
        v = rng.standard_normal((*lead, S, dv)).astype(np.float32)
        out, _ = causal_mask.scaled_dot_product_attention(q.astype(np.float64), k.astype(np.float64),
                                                          v.astype(np.float64), causal_mask.causal_mask(T, S))
        visited = sum(len(range(0, S - T + min(q0 + bq, T), bk)) for q0 in range(0, T, bq))
        case.update({f"q_{name}": q, f"k_{name}": k, f"v_{name}": v, f"out_{name}": out.astype(np.float32),
                     f"blocks_{name}": np.array([bq, bk]), f"visited_{name}": np.array(visited),
                     f"total_{name}": np.array(-(-T // bq) * -(-S // bk))})

    def outputs(m):
        return {f"out_{n}": m.tiled_causal_attention(case[f"q_{n}"], case[f"k_{n}"], case[f"v_{n}"], block_q=bq,
                                                      block_k=bk) for n, _, _, _, _, _, bq, bk in ATTENTION}

    got = outputs(__import__("inference"))
    for n, *_ in ATTENTION:
        assert np.allclose(got[f"out_{n}"], case[f"out_{n}"], atol=1e-5), f"tiled attention {n} differs from lab 01's"
    return {**case, **diagnoses(LAB, "attention", case, outputs, "inference")}


def _gelu_case(rng):
    x = np.concatenate([np.linspace(-6, 6, 49), rng.uniform(-4, 4, 51)]).astype(np.float32).reshape(4, 25)
    case = {"x": x, "gelu": _gelu64(x).astype(np.float32)}
    return {**case, **diagnoses(LAB, "gelu", case, lambda m: {"gelu": m.fast_gelu(x.copy())}, "inference")}


def _model_case(inf, model, state, rng):
    ids = rng.integers(0, SHAPE.vocab_size, (2, 33))
    case = {"ids": ids, "logits": model(ids), **_params(state)}

    def outputs(m):
        return {"logits": m.fast_forward(model, ids, block_q=8, block_k=8)}

    assert np.allclose(outputs(inf)["logits"], case["logits"], atol=1e-5)
    return {**case, **diagnoses(LAB, "model", case, outputs, "inference")}


def _slots_case(inf, model, rng):
    rows = {"a": rng.integers(0, SHAPE.vocab_size, 9), "b": rng.integers(0, SHAPE.vocab_size, 13)}
    case = {"row_a": rows["a"], "row_b": rows["b"]}
    fed = {"a": 0, "b": 0}
    for i, (slots, T, which) in enumerate(SLOT_CALLS):
        ids = np.stack([rows[w][fed[w] : fed[w] + T] for w in which])
        case[f"ids_{i}"], case[f"slots_{i}"] = ids, np.array(slots)
        case[f"logits_{i}"] = np.stack([model(rows[w][None, : fed[w] + T])[0, -T:] for w in which])
        for w in which:
            fed[w] += T
    case["lengths"] = np.array([fed["b"], 0, fed["a"]])

    def outputs(m):
        cache = m.SlotCache(model, 3)
        got = {f"logits_{i}": m.forward_slots(model, case[f"ids_{i}"], cache, case[f"slots_{i}"])
               for i in range(len(SLOT_CALLS))}
        return {**got, "lengths": cache.lengths.copy()}

    got = outputs(inf)
    assert all(np.allclose(got[k], case[k], atol=1e-5) for k in got), "forward_slots differs from lab 04's model"
    return {**case, **diagnoses(LAB, "slots", case, outputs, "inference")}


def _run_batched(m, model, prompts, news, eos):
    dec = m.BatchedDecoder(model, MAX_BATCH)
    for p, n, e in zip(prompts, news, eos):
        dec.submit(p, n, eos=e)
    trace = []
    while dec.waiting or any(s is not None for s in dec.slots):
        dec.step()
        trace.append([-1 if s is None else s for s in dec.slots])
        if len(trace) > 100:
            break
    done = dec.run()
    width = max(len(t) for t in done.values())
    tokens = np.full((len(prompts), width), -1, dtype=np.int64)
    for rid, t in done.items():
        tokens[rid, : len(t)] = t
    return {"tokens": tokens, "trace": np.array(trace, dtype=np.int64), "forward_calls": np.array(dec.forward_calls)}


def _batched_case(inf, gen, model, rng):
    prompts = [rng.integers(0, SHAPE.vocab_size, n) for n in BATCH_PROMPTS]
    alone = [gen.generate(model, p[None], n, temperature=0)[0] for p, n in zip(prompts, BATCH_NEW)]
    # request 4 stops at an EOS: its greedy output's third new token (which does not occur before)
    new4 = alone[4][len(prompts[4]) :]
    eos4 = int(next(t for i, t in enumerate(new4) if i >= 2 and t not in new4[:i]))
    eos = [None, None, None, None, eos4]
    alone[4] = gen.generate(model, prompts[4][None], BATCH_NEW[4], temperature=0, eos_token_id=eos4)[0]
    assert len(alone[4]) < len(prompts[4]) + BATCH_NEW[4]
    case = {f"prompt_{i}": p for i, p in enumerate(prompts)}
    case.update({"max_new": np.array(BATCH_NEW), "eos": np.array(eos4)})
    width = max(len(a) for a in alone)
    tokens = np.full((len(prompts), width), -1, dtype=np.int64)
    for i, a in enumerate(alone):
        tokens[i, : len(a)] = a
    ref = _run_batched(inf, model, prompts, BATCH_NEW, eos)
    assert np.array_equal(ref["tokens"], tokens), "the batched decoder's tokens differ from lab 06's generate alone"
    case.update(ref)

    def outputs(m):
        return _run_batched(m, model, prompts, BATCH_NEW, eos)

    return {**case, **diagnoses(LAB, "batched", case, outputs, "inference")}


SPEC_SETTINGS = ["self", "near", "small", "lookup", "eos"]  # each: (draft, k, ngram, prompt, eos)


def _speculative_case(inf, gen, gpt, model, state, rng):
    near_state = {k: (v + NEAR_NOISE * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
                  for k, v in state.items()}
    small_state = random_gpt2_state(DRAFT_SHAPE, rng)
    near, small = _model(gpt, SHAPE, near_state), _model(gpt, DRAFT_SHAPE, small_state)
    p0 = rng.integers(0, SHAPE.vocab_size, 5)
    p1 = np.array([3, 7, 9, 3, 7, 2, 3, 7, 9, 1], dtype=np.int64)
    greedy0 = gen.generate(model, p0[None], SPEC_NEW, temperature=0)[0]
    eos = int(greedy0[len(p0) + 9])
    settings = {"self": (model, 4, 3, p0, None), "near": (near, 3, 3, p0, None), "small": (small, 4, 3, p0, None),
                "lookup": (None, 3, 2, p1, None), "eos": (near, 3, 3, p0, eos)}
    case = {**_params(near_state, "near."), **_params(small_state, "small."), "prompt_0": p0, "prompt_1": p1,
            "eos": np.array(eos)}
    # the near draft's own greedy tokens after a context, and after that context cut back and changed
    context = greedy0[:10]
    case["drafter_context"], case["drafter_tokens"] = context, gen.generate(near, context[None], 3, temperature=0)[0, 10:]
    changed = np.concatenate([context[:8], [(int(context[8]) + 1) % SHAPE.vocab_size]])
    case["drafter_changed"] = changed
    case["drafter_changed_tokens"] = gen.generate(near, changed[None], 3, temperature=0)[0, 9:]
    # prompt lookup's one draft, and the target's distribution for it at WARM and at temperature 1
    lookup_prompt = np.array(LOOKUP_PROMPT, dtype=np.int64)
    logits = model(lookup_prompt[None])[0, -1].astype(np.float64)
    case["sample_prompt"], case["sample_draft"] = lookup_prompt, inf.prompt_lookup_draft(lookup_prompt, 1, ngram=2)
    for key, temperature in (("sample_p", WARM), ("sample_p1", 1.0)):
        z = np.exp(logits / temperature - (logits / temperature).max())
        case[key] = z / z.sum()
    assert case["sample_draft"].shape == (1,) and 0.25 < case["sample_p"][case["sample_draft"][0]] < 0.6
    for name, (draft, k, ngram, prompt, e) in settings.items():
        case[f"tokens_{name}"] = gen.generate(model, prompt[None], SPEC_NEW, temperature=0, eos_token_id=e)[0]
        case[f"k_{name}"], case[f"ngram_{name}"] = np.array(k), np.array(ngram)

    def outputs(m):
        out = {}
        for name, (draft, k, ngram, prompt, e) in settings.items():
            try:
                tokens, stats = m.speculative_greedy(model, draft, prompt, SPEC_NEW, k=k, ngram=ngram, eos=e)
            except Exception:  # noqa: BLE001 - a mistake that breaks the loop: the test's hint names it
                continue
            out[f"tokens_{name}"] = tokens
            out[f"counts_{name}"] = np.array([stats["proposed"], stats["accepted"], stats["rounds"]])
        try:  # sampling so cold that it is greedy, with the near draft: rejections and acceptances
            tokens, stats = m.speculative_sample(model, near, p0, SPEC_NEW, k=settings["near"][1], temperature=COLD,
                                                 rng=np.random.default_rng(5))
        except Exception:  # noqa: BLE001
            return out
        out["cold_tokens"] = tokens
        out["cold_counts"] = np.array([stats["proposed"], stats["accepted"], stats["rounds"]])
        return out

    ref = outputs(inf)
    for name in settings:
        assert np.array_equal(ref[f"tokens_{name}"], case[f"tokens_{name}"]), f"speculative {name} differs from greedy"
    proposed, accepted, _ = ref["counts_near"]
    assert 0.2 < accepted / proposed < 0.95, f"the near draft's acceptance {accepted}/{proposed}: change NEAR_NOISE"
    assert ref["counts_lookup"][1] > 0, "prompt lookup never accepted: change prompt_1"
    assert np.array_equal(ref["cold_tokens"], case["tokens_near"]), "cold speculative sampling is not greedy"
    assert np.array_equal(ref["cold_counts"], ref["counts_near"]), "cold speculative sampling's counts differ"
    case.update(ref)
    return {**case, **diagnoses(LAB, "speculative", case, outputs, "inference")}


def _lookup_case(inf):
    case = {}
    for i, (context, k, ngram) in enumerate(LOOKUP):
        case[f"context_{i}"], case[f"k_{i}"], case[f"ngram_{i}"] = np.array(context), np.array(k), np.array(ngram)

    def outputs(m):
        return {f"draft_{i}": m.prompt_lookup_draft(np.array(c), k, ngram=n) for i, (c, k, n) in enumerate(LOOKUP)}

    case.update(outputs(inf))
    return {**case, **diagnoses(LAB, "lookup", case, outputs, "inference")}


def _int8_case(inf, layers, gpt, state, rng):
    W = (rng.standard_normal((70, 24)) * np.exp(1.5 * rng.standard_normal(24))).astype(np.float32)
    W[16:32, 3] = 0.0  # a block of zeros: scale 0
    bias = (0.1 * rng.standard_normal(24)).astype(np.float32)
    x = rng.standard_normal((3, 5, 70)).astype(np.float32)
    ids = rng.integers(0, SHAPE.vocab_size, (2, 20))
    case = {"W": W, "bias": bias, "x": x, "ids": ids, "block": np.array(16), "model_block": np.array(8)}
    case["float_logits"] = _model(gpt, SHAPE, state)(ids)

    def outputs(m):
        q, scales = m.quantize_int8(W, 16)
        lin = layers.Linear(70, 24, rng=np.random.default_rng(0))
        lin.weight, lin.bias = W.copy(), bias.copy()
        quantised = m.quantize_model(_model(gpt, SHAPE, state), 8)
        return {"q": q, "scales": scales, "dequantised": m.dequantize_int8(q, scales, 16),
                "linear_out": m.Int8Linear(lin, 16)(x), "logits": m.fast_forward(quantised, ids)}

    case.update(outputs(inf))
    return {**case, **diagnoses(LAB, "int8", case, outputs, "inference")}


def build():
    import causal_mask
    import generation as gen
    import gpt
    import inference as inf
    import layers

    rng = np.random.default_rng(12)
    state = random_gpt2_state(SHAPE, rng)
    model = _model(gpt, SHAPE, state)
    return {
        "attention": _attention_case(causal_mask, rng),
        "gelu": _gelu_case(rng),
        "model": _model_case(inf, model, state, rng),
        "slots": _slots_case(inf, model, rng),
        "batched": _batched_case(inf, gen, model, rng),
        "speculative": _speculative_case(inf, gen, gpt, model, state, rng),
        "lookup": _lookup_case(inf),
        "int8": _int8_case(inf, layers, gpt, state, rng),
    }
