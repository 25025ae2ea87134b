"""Fixtures for lab 04: a random multi-head attention, block and small GPT (every
parameter random: LayerNorm gains and all biases too), their outputs, and what the
catalogue's mistakes would output instead: each bug in ``solutions/04_gpt_model/bugs.toml``
whose ``diagnose`` names one of the cases ``heads``, ``attend``, ``mha``, ``block``,
``model``, ``model_square`` is applied to the solution and run on that case (so a failing
test can name the mistake without the tests holding a second implementation).
``model_trace`` holds every sub-layer's inputs and outputs in the reference model on the
``model`` case's ids, so a failing logits test names the first sub-layer that differs."""

import numpy as np

from gptkit.checkpoints import GPT2Shape, random_gpt2_state
from gptkit.testing.firstdiff import record_trace, trace_arrays
from gptkit.testing.fixtures import diagnosis_key, label_key
from grader.fixtures import diagnoses

NEEDS_TORCH = False
LAB = "04_gpt_model"

D, H, F = 12, 3, 20  # width, heads (d_head = 4), feed-forward width
SMALL = GPT2Shape(vocab_size=40, d_model=D, num_layers=2, num_heads=H, max_seq_len=10, d_ff=F)
SQUARE = GPT2Shape(vocab_size=D, d_model=D, num_layers=1, num_heads=H, max_seq_len=8, d_ff=F)  # V = D


def _sub(state, prefix):
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _with_diagnoses(case, name, outputs, ref):
    """``case`` plus what each catalogued bug diagnosed on ``name`` outputs there."""
    case.update(outputs(ref))
    return {**case, **diagnoses(LAB, name, case, outputs, "gpt")}


def _qkv_probes(state: dict, prefix: str, output: str, run) -> dict[str, np.ndarray]:
    """What the reference outputs when ``c_attn``'s q, k, v blocks are taken in another order
    (``run(state)`` → the case's output): a student's result that matches one names the order
    their code took, however it was written (stored beside the catalogue's diagnoses)."""
    import itertools

    names = ("q", "k", "v")
    stored = {}
    for order in itertools.permutations(range(3)):
        if order == (0, 1, 2):
            continue
        moved = dict(state)
        for part in ("weight", "bias"):
            key = f"{prefix}c_attn.{part}"
            blocks = np.split(state[key], 3, axis=-1)
            moved[key] = np.concatenate([blocks[i] for i in order], axis=-1)
        probe = "probe-qkv-" + "".join(names[i] for i in order)
        stored[diagnosis_key(output, probe)] = run(moved)
        stored[label_key(probe)] = np.array(
            f"q, k, v taken from c_attn's blocks in the wrong order, as {', '.join(names[i] for i in order)} "
            "(GPT-2 stores q in the first D columns, then k, then v)")
    return stored


def _model(gpt, shape, state):
    m = gpt.GPTModel(**shape.model_kwargs(), dropout=0.1, rng=np.random.default_rng(0))
    return m.load_state_dict(state).eval()


def _block(gpt, state):
    b = gpt.TransformerBlock(D, H, F, dropout=0.1, rng=np.random.default_rng(0))
    return b.load_state_dict(state).eval()


def _mha(gpt, state=None):
    a = gpt.MultiHeadAttention(D, H, dropout=0.1, rng=np.random.default_rng(0))
    return a.load_state_dict(state).eval() if state is not None else a


def build() -> dict[str, dict[str, np.ndarray]]:
    import gpt as ref

    rng = np.random.default_rng(404)
    cases = {}

    x = rng.normal(0, 1, (2, 5, D)).astype(np.float32)
    mha = ref.MultiHeadAttention(D, H, rng=rng)
    cases["heads"] = _with_diagnoses({"x": x}, "heads", lambda gpt: {"split": _mha(gpt).split_heads(x)}, ref)

    q, k, v = (rng.normal(0, 1.5, (2, H, 7, D // H)).astype(np.float32) for _ in range(3))
    cases["attend"] = _with_diagnoses(
        {"q": q, "k": k, "v": v, "out_T3": mha.attend(q[:, :, 4:], k, v)},  # the last 3 queries over all 7 keys
        "attend", lambda gpt: {"out": _mha(gpt).attend(q, k, v)}, ref)

    state = random_gpt2_state(SMALL, rng)
    attn_state = _sub(state, "h.0.attn.")
    x = rng.normal(0, 1, (2, 6, D)).astype(np.float32)
    cases["mha"] = _with_diagnoses({"x": x, **{f"param.{k}": v for k, v in attn_state.items()}},
                                   "mha", lambda gpt: {"out": _mha(gpt, attn_state)(x)}, ref)
    cases["mha"].update(_qkv_probes(attn_state, "", "out", lambda st: _mha(ref, st)(x)))

    block_state = _sub(state, "h.0.")
    cases["block"] = _with_diagnoses({"x": x, **{f"param.{k}": v for k, v in block_state.items()}},
                                     "block", lambda gpt: {"out": _block(gpt, block_state)(x)}, ref)
    cases["block"].update(_qkv_probes(block_state, "attn.", "out", lambda st: _block(ref, st)(x)))

    ids = rng.integers(0, SMALL.vocab_size, (2, 7))
    case = {"ids": ids, **{f"param.{k}": v for k, v in state.items()}}
    case["ids_full"] = rng.integers(0, SMALL.vocab_size, (1, SMALL.max_seq_len))
    case["logits_full"] = _model(ref, SMALL, state)(case["ids_full"])
    cases["model"] = _with_diagnoses(case, "model", lambda gpt: {"logits": _model(gpt, SMALL, state)(ids)}, ref)
    with record_trace(traced := _model(ref, SMALL, state)) as calls:  # each sub-layer's inputs and outputs
        traced(ids)
    cases["model_trace"] = trace_arrays(calls)

    square = random_gpt2_state(SQUARE, rng)
    ids = rng.integers(0, SQUARE.vocab_size, (2, 5))
    cases["model_square"] = _with_diagnoses({"ids": ids, **{f"param.{k}": v for k, v in square.items()}},
                                            "model_square",
                                            lambda gpt: {"logits": _model(gpt, SQUARE, square)(ids)}, ref)
    return cases
