"""The kit's Layer base class: modes recurse, state dicts name and check parameters."""

import numpy as np
import pytest

from gptkit import Layer


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
