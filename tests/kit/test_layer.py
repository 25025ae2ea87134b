"""The kit's Layer base class: modes recurse, state dicts name and check parameters;
and the student-facing state-dict comparison and GPT-2 names it uses."""

import numpy as np
import pytest

from gptkit import Layer, gpt2_parameter_names, gpt2_parameter_shapes, state_diff


class Leaf(Layer):
    def __init__(self, n):
        self.weight = np.zeros((n, 2), np.float32)
        self.bias = None


class Tree(Layer):
    def __init__(self):
        self.ln = Leaf(2)
        self.h = [Leaf(3), Leaf(4)]
        self._cache = np.ones(3)  # private: not a parameter


def test_names_follow_attribute_paths():
    assert list(Tree().state_dict()) == ["ln.weight", "h.0.weight", "h.1.weight"]


def test_train_and_eval_recurse():
    t = Tree()
    assert not t.training and not t.h[1].training
    t.train()
    assert t.training and t.ln.training and t.h[0].training and t.h[1].training
    t.eval()
    assert not any(layer.training for _, layer in t.named_layers())


def test_load_state_dict_reports_every_problem():
    t = Tree()
    state = {"ln.weight": np.ones((2, 2)), "h.0.weight": np.ones((5, 2)), "extra": np.ones(1)}
    with pytest.raises(ValueError) as info:
        t.load_state_dict(state)
    msg = str(info.value)
    assert "h.0.weight: checkpoint (5, 2), model (3, 2)" in msg
    assert "missing: h.1.weight" in msg and "unexpected: extra" in msg


def test_load_state_dict_copies_as_float32():
    t = Tree()
    src = {k: np.full(v.shape, 2.0) for k, v in t.state_dict().items()}
    t.load_state_dict(src)
    assert t.h[1].weight.dtype == np.float32 and np.all(t.h[1].weight == 2)
    src["h.1.weight"][:] = 5
    assert np.all(t.h[1].weight == 2), "loading must copy, not alias"


def test_load_state_dict_not_strict_still_checks_shapes():
    t = Tree()
    t.load_state_dict({"h.0.weight": np.ones((3, 2)), "extra": np.ones(1)}, strict=False)
    assert np.all(t.h[0].weight == 1)
    with pytest.raises(ValueError, match="mis-shaped"):
        t.load_state_dict({"h.0.weight": np.ones((5, 2))}, strict=False)


def test_state_diff_orders_by_block_and_cuts_long_lists():
    want = {f"h.{i}.w": (2,) for i in range(12)}
    diff = state_diff(want, {"h.0.w": np.zeros(3), "z": np.zeros(1)})
    assert diff.missing[:3] == ("h.1.w", "h.2.w", "h.3.w") and diff.missing[-1] == "h.11.w"
    assert diff.unexpected == ("z",) and diff.misshaped == (("h.0.w", (2,), (3,)),)
    text = diff.describe(expected="config", actual="file", limit=3)
    assert text == "mis-shaped: h.0.w: file (3,), config (2,) | missing: h.1.w, h.2.w, h.3.w, … 8 more | unexpected: z"
    assert not state_diff(["a", "b"], {"a": np.zeros(2), "b": np.zeros(9)}), "names alone: shapes are not compared"


def test_gpt2_names_and_shapes_agree():
    shapes = gpt2_parameter_shapes(vocab_size=50, d_model=8, num_layers=2, num_heads=2, d_ff=24, max_seq_len=16)
    assert list(shapes) == gpt2_parameter_names(2)
    assert len(shapes) == 4 + 2 * 12 and list(shapes)[:3] == ["wte.weight", "wpe.weight", "h.0.ln_1.weight"]
    assert shapes["h.1.attn.c_attn.weight"] == (8, 24) and shapes["h.1.mlp.c_proj.weight"] == (24, 8)
