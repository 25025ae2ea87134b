"""The rubric: points per lab and per test, and the modules beyond the standard library
that each lab uses (importing them is not noted by the static review)."""

from __future__ import annotations

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
        )
    return labs
