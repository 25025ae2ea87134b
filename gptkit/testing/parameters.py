"""Putting parameters into the code under test by GPT-2's names, so a student's own
initialisation never affects a grade."""

from __future__ import annotations

import numpy as np

from gptkit.state import state_diff


def set_parameters(layer, params: dict[str, np.ndarray], what: str):
    """Load ``params`` into ``layer`` by GPT-2's names; returns the layer in eval mode.

    A mismatch fails the test with the names in question (the student's own parameter
    names, shapes or an extra untied head), not with a traceback from ``Layer``.
    """
    __tracebackhide__ = True
    diff = state_diff(params, layer.state_dict())
    if diff:
        tied = (" (GPT-2 has no separate output head: the logits reuse wte.weight, the head is tied)"
                if any("head" in k for k in diff.unexpected) else "")
        raise AssertionError(f"{what}: its parameters must be GPT-2's, by name and shape: "
                             + diff.describe(expected="GPT-2's", actual="yours",
                                             unexpected="parameters GPT-2 does not have") + tied)
    layer.load_state_dict(params)
    return layer.eval()
