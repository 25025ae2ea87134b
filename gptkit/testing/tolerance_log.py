"""The tolerance certificate's recorder (``grader tolerances``, docs/tolerances.md).

When the environment variable ``GPTKIT_TOLERANCE_LOG`` names a file, every comparison
made through :func:`gptkit.testing.assert_close` appends one JSON line to it: the test
(pytest's node id), what was compared, the tolerances, and the worst error measured::

    {"test": "tests/01_causal_mask/test_x.py::test_y", "what": "softmax rows",
     "atol": 1e-06, "rtol": 0.0001, "max_abs": 3e-08, "max_rel": 2e-07,
     "ratio": 0.03, "size": 48}

``ratio`` is the worst error measured against the allowed bound,
max |actual − expected| / (atol + rtol·|expected|): the comparison passes when it is at
most 1. Positions where the expected value is not finite count as 0 when the result
equals it there and as infinite otherwise. Without the variable nothing is recorded and
nothing is imported.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

ENV = "GPTKIT_TOLERANCE_LOG"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def current_test() -> str:
    """The running test's node id (pytest sets PYTEST_CURRENT_TEST during each phase)."""
    now = os.environ.get("PYTEST_CURRENT_TEST", "")
    return re.sub(r" \((setup|call|teardown)\)$", "", now) or "(outside a test)"


def measure(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> dict:
    """The worst absolute and relative error and the worst error against the bound."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    finite = np.isfinite(e)
    same = (a == e) | (np.isnan(a) & np.isnan(e))
    if (~finite & ~same).any():
        return {"max_abs": float("inf"), "max_rel": float("inf"), "ratio": float("inf")}
    if not finite.any():
        return {"max_abs": 0.0, "max_rel": 0.0, "ratio": 0.0}
    a, e = a[finite], e[finite]
    diff = np.abs(a - e)
    diff = np.where(np.isnan(diff), np.inf, diff)
    mag = np.abs(e)
    bound = atol + rtol * mag
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / bound)
        rel = np.where(diff == 0, 0.0, diff / mag)
    return {"max_abs": float(diff.max()), "max_rel": float(rel.max()), "ratio": float(ratio.max())}


def record(what: str, actual, expected, atol: float, rtol: float) -> None:
    """Append one comparison to the log (called by ``assert_close`` when enabled)."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        row = {"test": current_test(), "what": what, "atol": float(atol), "rtol": float(rtol),
               **measure(actual, expected, atol, rtol), "size": int(np.size(expected))}
    except Exception as exc:  # noqa: BLE001 - the recorder must never change a test's outcome
        row = {"test": current_test(), "what": what, "atol": float(atol), "rtol": float(rtol),
               "error": f"{type(exc).__name__}: {exc}"}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
