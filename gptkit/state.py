"""Comparing state dicts: which parameters are missing, unexpected or of the wrong shape.

``Layer.load_state_dict``, lab 05's checkpoint checks and the tests that put parameters
into a student's model all ask the same question; ``state_diff`` answers it once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


def parameter_order(name: str) -> tuple[int, str]:
    """A sort key that lists parameters as a model holds them: top-level names first,
    then block by block in number order (``h.2.…`` before ``h.10.…``)."""
    parts = name.split(".")
    return (int(parts[1]), name) if len(parts) > 1 and parts[1].isdigit() else (-1, name)


def name_list(names: Iterable[str], limit: int = 8) -> str:
    """``"a, b, c"``, cut to ``limit`` names with the count of the rest."""
    names = list(names)
    more = f", … {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


@dataclass(frozen=True)
class StateDiff:
    """How a state dict differs from the one expected (each list in ``parameter_order``)."""

    missing: tuple[str, ...] = ()  # expected but absent
    unexpected: tuple[str, ...] = ()  # present but not expected
    misshaped: tuple[tuple[str, tuple, tuple], ...] = ()  # (name, expected shape, actual shape)

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.misshaped)

    def describe(self, *, expected: str = "expected", actual: str = "actual",
                 unexpected: str = "unexpected", limit: int = 8) -> str:
        """Every difference in one line, e.g. ``mis-shaped: h.0.ln_1.weight: checkpoint
        (8,), model (16,) | missing: ln_f.bias | unexpected: lm_head.weight``; ``expected``
        and ``actual`` name the two sides, ``unexpected`` titles the extra names."""
        parts = []
        if self.misshaped:
            shown = [f"{n}: {actual} {a}, {expected} {e}" for n, e, a in self.misshaped[:limit]]
            more = [f"… {len(self.misshaped) - limit} more"] if len(self.misshaped) > limit else []
            parts.append("mis-shaped: " + "; ".join(shown + more))
        if self.missing:
            parts.append("missing: " + name_list(self.missing, limit))
        if self.unexpected:
            parts.append(f"{unexpected}: " + name_list(self.unexpected, limit))
        return " | ".join(parts)


def _shape(value) -> tuple[int, ...] | None:
    if value is None or isinstance(value, tuple):
        return value
    return tuple(np.shape(value))


def state_diff(expected: Mapping | Iterable[str], actual: Mapping) -> StateDiff:
    """How ``actual`` differs from ``expected``, by parameter name and shape.

    Args:
        expected: names → arrays or shape tuples; or just the names, when only the names
            matter (a shape of None is not compared either).
        actual: names → arrays or shape tuples.
    """
    if not isinstance(expected, Mapping):
        expected = dict.fromkeys(expected)
    want = {k: _shape(v) for k, v in expected.items()}
    have = {k: _shape(v) for k, v in actual.items()}
    both = sorted(set(want) & set(have), key=parameter_order)
    return StateDiff(
        missing=tuple(sorted(set(want) - set(have), key=parameter_order)),
        unexpected=tuple(sorted(set(have) - set(want), key=parameter_order)),
        misshaped=tuple((k, want[k], have[k]) for k in both if want[k] is not None and want[k] != have[k]),
    )
