"""Where things live. One place answers "which folder holds lab NN's code?".

An *implementation tree* is a folder of lab folders named ``NN_name``. Each holds the
lab's modules either in ``src/`` (the student layout, ``labs/``) or directly (the
reference layout, ``solutions/``). The grader builds scratch trees of either shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parents[2]
LAB_DIR_RE = re.compile(r"^(\d\d)_[a-z0-9_]+$")


@dataclass(frozen=True)
class LabDir:
    """One lab folder of an implementation tree."""

    name: str  # "01_causal_mask"
    code_dir: Path  # the folder that holds its modules

    @property
    def number(self) -> str:
        return self.name[:2]

    @property
    def marker(self) -> str:
        return f"lab{self.number}"

    def modules(self) -> list[str]:
        return sorted(p.stem for p in self.code_dir.glob("*.py") if not p.name.startswith("_"))


def lab_dirs(root: Path) -> list[LabDir]:
    """The lab folders of an implementation tree, in lab order."""
    root = Path(root)
    out = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.is_dir() and LAB_DIR_RE.match(d.name):
            out.append(LabDir(d.name, d / "src" if (d / "src").is_dir() else d))
    return out


def resolve_impl(impl: str, base: Path = KIT_ROOT) -> Path:
    """``labs`` / ``solutions`` / a path → the implementation tree's folder."""
    if impl in ("labs", "solutions"):
        return base / impl
    path = Path(impl).expanduser()
    return (path if path.is_absolute() else Path.cwd() / path).resolve()


def module_lab(module: str, root: Path) -> LabDir | None:
    """The lab that owns ``module`` in the tree (None if no lab has it)."""
    for lab in lab_dirs(root):
        if (lab.code_dir / f"{module}.py").is_file():
            return lab
    return None
