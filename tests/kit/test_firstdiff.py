"""gptkit.testing.firstdiff: a failing model comparison names the first place that differs."""

import numpy as np

from gptkit.layer import Layer
from gptkit.testing.firstdiff import first_difference, first_in_order, record_trace, trace_arrays


class Scale(Layer):
    def __init__(self, factor):
        self.weight = np.full(3, factor, np.float32)

    def forward(self, x):
        return x * self.weight


class Block(Layer):
    def __init__(self, wrong_join=False):
        self.inner, self.outer = Scale(2.0), Scale(3.0)
        self.wrong_join = wrong_join

    def forward(self, x):
        return self.outer(self.inner(x)) + (0 if self.wrong_join else x)


class Model(Layer):
    def __init__(self, **kw):
        self.blocks = [Block(**kw), Block(**kw)]
        self.shift = np.float32(0)

    def forward(self, x, offset=0):
        for block in self.blocks:
            x = block(x + offset)
        return x


def _trace(model, x):
    with record_trace(model) as calls:
        model(x, offset=1)
    return trace_arrays(calls)


def test_the_innermost_sub_layer_that_differs_is_named_with_its_parts_that_agree():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    trace = _trace(Model(), x)

    wrong_leaf = Model()
    wrong_leaf.blocks[1].outer.weight[:] = 5
    said = first_difference(wrong_leaf, trace)
    assert said.startswith("first differs at `blocks.1.outer`"), said

    wrong_join = Model(wrong_join=True)
    said = first_difference(wrong_join, trace)
    assert said.startswith("first differs at `blocks.0`") and "`inner`, `outer` agree" in said, said


def test_when_every_sub_layer_agrees_the_call_that_differs_is_named():
    class Forgetful(Model):
        def forward(self, x, offset=0):
            return super().forward(x, offset=0)  # ignores what it is given

    x = np.ones((2, 3), np.float32)
    said = first_difference(Forgetful(), _trace(Model(), x))
    assert "the whole model" in said and "`blocks.0` is called with argument 1" in said, said


def test_a_sub_layer_that_raises_is_named():
    class Broken(Scale):
        def forward(self, x):
            raise ValueError("bad shape")

    model = Model()
    model.blocks[0].inner = Broken(2.0)
    said = first_difference(model, _trace(Model(), np.ones((1, 3), np.float32)))
    assert "`blocks.0.inner`" in said and "ValueError: bad shape" in said, said


def test_first_in_order_names_the_first_that_differs_and_what_agreed_before():
    expected = {"c": np.ones(2), "b": np.zeros(2), "a": np.ones(3)}
    actual = {"c": np.ones(2), "b": np.array([0.0, 1.0]), "a": np.zeros(3)}
    said = first_in_order(["c", "b", "a"], actual, expected, what="in backward order")
    assert said.startswith("first differs at `b` (in backward order: 1 of 2 elements differ)"), said
    assert "`c` before it agrees" in said
    assert first_in_order(["c"], actual, expected) is None
