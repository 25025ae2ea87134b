"""The rubric: points per lab and per test, and the modules beyond the standard library
that each lab uses (importing them is not noted by the static review)."""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

RUBRIC_PATH = Path(__file__).with_name("rubric.toml")


@dataclass
class LabRubric:
    name: str
    points: float
    allowed_imports: list[str]
    weights: dict[str, float] = field(default_factory=dict)
    # 'file.py::test_pattern' → the value tests ('file.py::pattern', …) it earns points with
    requires: dict[str, list[str]] = field(default_factory=dict)

    def weight(self, nodeid: str) -> float:
        """A test's relative weight: by 'file.py::test' (any parametrisation) or full id."""
        short = nodeid.split("/")[-1]
        if short in self.weights:
            return float(self.weights[short])
        base = short.split("[")[0]
        return float(self.weights.get(base, 1.0))

    def split(self, nodeids: list[str]) -> dict[str, float]:
        """Points per test: the lab's points shared in proportion to the weights."""
        total = sum(self.weight(n) for n in nodeids)
        return {n: (self.points * self.weight(n) / total if total else 0.0) for n in nodeids}


    def required(self, nodeid: str, nodeids: list[str]) -> list[str]:
        """The graded tests that ``nodeid`` earns its points only together with: those of
        ``nodeids`` that a ``requires`` entry matching it names (patterns match
        'file.py::test_name' with or without its "[param]" part)."""
        short = nodeid.split("/")[-1]
        wanted = [req for pattern, reqs in self.requires.items()
                  if fnmatch.fnmatchcase(short, pattern) or fnmatch.fnmatchcase(short.split("[")[0], pattern)
                  for req in reqs]
        return [n for n in nodeids if n != nodeid and any(
            fnmatch.fnmatchcase(n.split("/")[-1], req) or fnmatch.fnmatchcase(n.split("/")[-1].split("[")[0], req)
            for req in wanted)]

    def unmet(self, passed: dict[str, bool]) -> dict[str, str]:
        """``{test: the first test it requires that did not pass}`` for each test that passed
        but earns nothing: a shape, dtype or property test earns its points only when the
        values of the same task are right (a lab of zeros of the right shapes scores 0)."""
        nodeids = list(passed)
        out = {}
        for n, ok in passed.items():
            if ok:
                missing = [r for r in self.required(n, nodeids) if not passed[r]]
                if missing:
                    out[n] = missing[0]
        return out

    def withhold(self, records) -> None:
        """Applies :meth:`unmet` to a lab's test records (``nodeid``, ``outcome``,
        ``points``, ``message``): a passed test whose value tests failed gets 0 points."""
        unmet = self.unmet({r.nodeid: r.outcome == "passed" for r in records})
        for r in records:
            if r.nodeid in unmet:
                r.points = 0.0
                r.message = (f"passed, but earns its points only with {unmet[r.nodeid].split('/')[-1]}, "
                             "which did not pass: the values of this task must be right too")


def load_rubric(path: Path = RUBRIC_PATH) -> dict[str, LabRubric]:
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    defaults = data.get("defaults", {})
    base_imports = list(defaults.get("allowed_imports", []))
    labs = {}
    for name, entry in data.get("labs", {}).items():
        labs[name] = LabRubric(
            name=name,
            points=float(entry.get("points", defaults.get("points", 10))),
            allowed_imports=base_imports + list(entry.get("allowed_imports", [])),
            weights=dict(entry.get("weights", {})),
            requires={k: list(v) for k, v in entry.get("requires", {}).items()},
        )
    return labs
