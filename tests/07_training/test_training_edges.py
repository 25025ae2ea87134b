"""Lab 07 · edge cases: clipping gradients whose norm is 0, the checkpoint's "format"
metadata that HuggingFace needs, and a loss that leaves its inputs as they were."""

import json

import numpy as np

from gptkit.checkpoints import GPT2Shape
from gptkit.testing import explains_errors, fixture_params, lab, load_fixture
from gptkit.testing.parameters import set_parameters

S = lab("training")
G = lab("gpt")
LAB = "07_training"
SHAPE = GPT2Shape(vocab_size=13, d_model=16, num_layers=2, num_heads=2, max_seq_len=10)  # the fixtures' model


def _model(state):
    model = G.GPTModel(**SHAPE.model_kwargs(), rng=np.random.default_rng(1))
    return set_parameters(model, state, f"GPTModel(vocab_size={SHAPE.vocab_size}, d_model={SHAPE.d_model})")


def test_clip_grad_norm_of_zero_gradients():
    grads = {"w": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}
    with explains_errors("clip_grad_norm of gradients that are all 0 (max_norm=1.0)",
                         "the factor is min(1, max_norm / (norm + 1e-6)): the 1e-6 keeps a norm of 0 from dividing "
                         "by zero"):
        clipped, norm = S.clip_grad_norm(grads, 1.0)
    assert float(norm) == 0.0, f"clip_grad_norm of gradients that are all 0: the norm is 0.0, got {norm}"
    for k, g in grads.items():
        got = np.asarray(clipped[k])
        assert np.isfinite(got).all() and not got.any(), (
            f"clip_grad_norm of gradients that are all 0 gave {k!r} = {got.ravel()[:4]}…: they stay 0 (the factor "
            "is min(1, max_norm / (norm + 1e-6)): the 1e-6 keeps a norm of 0 from dividing by zero)")


def test_checkpoint_metadata_says_format_pt(tmp_path):
    f = load_fixture(LAB, "model")
    S.save_checkpoint(tmp_path / "ckpt", _model(fixture_params(f)), {"step": "3"})
    raw = (tmp_path / "ckpt" / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError:
        return  # a malformed header: test_write_safetensors_layout says what is wrong with it
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    assert meta == {"format": "pt", "step": "3"}, (
        f"save_checkpoint(folder, model, {{'step': '3'}}) wrote the metadata {meta}: expected "
        "{'format': 'pt', 'step': '3'}. HuggingFace's from_pretrained refuses a safetensors file whose metadata does "
        "not say \"format\": \"pt\"; save_checkpoint adds it to the metadata it is given")


def test_softmax_cross_entropy_leaves_its_inputs_unchanged():
    rng = np.random.default_rng(77)
    logits = rng.normal(0, 3, (2, 5, 11)).astype(np.float32)
    targets = rng.integers(0, 11, (2, 5))
    logits_before, targets_before = logits.copy(), targets.copy()
    S.softmax_cross_entropy(logits, targets)
    assert np.array_equal(logits, logits_before) and np.array_equal(targets, targets_before), (
        "softmax_cross_entropy changed the arrays it was given (" + ("the logits" if not np.array_equal(
            logits, logits_before) else "the targets") + "): subtract the max into a new array, never in place "
        "(`z = z - m`, not `z -= m`): the caller still needs its logits")


def test_softmax_cross_entropy_of_one_target_then_of_none():
    logits = np.array([[[2.0, -1.0, 0.5]]], np.float32)  # (1, 1, 3): one target, whose loss is −log softmax
    loss, _ = S.softmax_cross_entropy(logits, np.array([[0]]))
    z = np.float64(logits[0, 0])
    expected = np.log(np.exp(z - z.max()).sum()) - (z[0] - z.max())
    assert abs(float(loss) - expected) < 1e-5, (
        f"softmax_cross_entropy of one target gave {float(loss)}, expected −log softmax(logits)[target] = {expected}")
    empty = np.zeros((1, 0, 3), np.float32)
    try:
        S.softmax_cross_entropy(empty, np.zeros((1, 0), np.int64))
    except ValueError:
        return
    raise AssertionError("softmax_cross_entropy of logits (1, 0, 3) and no targets returned a value: the README asks "
                         "for ValueError, since a mean over N = 0 targets has no value (mean() of nothing is NaN)")
