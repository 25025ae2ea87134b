"""Where things live. One place answers "which folder holds lab NN's code?".

An *implementation tree* is a folder of lab folders named ``NN_name``. Each holds the
lab's modules either in ``src/`` (the student layout, ``labs/``) or directly (the
reference layout, ``solutions/``). The grader builds scratch trees of either shape.
"""

from __future__ import annotations

import re
import sys
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


def lab_of(path) -> str | None:
    """The lab (``"01_causal_mask"``) that a file path or a pytest node id lies in: its
    innermost ``NN_name`` folder; None when it lies in no lab folder.

    ``tests/hidden/01_causal_mask/test_x.py::test_y[3]`` → ``"01_causal_mask"``.
    """
    where = str(path).split("::", 1)[0]
    for part in reversed(re.split(r"[/\\]", where)):
        if LAB_DIR_RE.match(part):
            return part
    return None


def selected(lab: str, labs: list[str] | None) -> bool:
    """Whether the lab ``"01_causal_mask"`` is among ``labs`` (numbers ``"01"`` or full
    names, as ``--labs`` gives them); every lab is when ``labs`` is empty or None."""
    return not labs or lab in labs or lab[:2] in labs


def lab_test_paths(labs: list[str] | None = None, tests: Path = KIT_ROOT / "tests") -> list[str]:
    """The folders that hold the tests of ``labs`` (every lab when empty or None; numbers
    or full names), in the order pytest collects them: ``tests/NN_name``, then
    ``tests/hidden/NN_name``. ``pytest -m labNN`` over these collects the same tests in the
    same order as over the whole of ``tests/`` (tests/kit/test_catalogue.py checks it),
    without importing every other test module first: the catalogue runs one such pytest
    per bug."""
    out = []
    for folder in (tests, tests / "hidden"):
        if folder.is_dir():
            out += [str(p) for p in sorted(folder.iterdir()) if p.is_dir() and lab_of(p.name) and selected(p.name, labs)]
    return out


def bind_tree(root: Path) -> list[LabDir]:
    """Make an implementation tree's lab modules importable by name (``import gpt``): every
    lab folder goes to the front of ``sys.path``, in lab order, since later labs import
    earlier labs' modules. Returns the labs; ValueError when ``root`` holds none."""
    labs = lab_dirs(root)
    if not labs:
        raise ValueError(f"no lab folders (NN_name) in {root}")
    folders = [str(lab.code_dir) for lab in labs]
    sys.path[:] = folders + [p for p in sys.path if p not in folders]
    return labs


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


def concept_tests_first(items: list) -> list:
    """The run order: each lab's tests together (labs in the order they were collected,
    its hidden tests beside its public ones), and within a lab its own concept tests
    (fixtures and properties) before the live PyTorch/HuggingFace comparisons (the
    ``torch`` marker). Under ``-x`` the first failure a student reads is then the test
    that names the mistake, whatever is installed. Otherwise the collection order stays."""
    group_rank: dict = {}
    keys = []
    for index, item in enumerate(items):
        group = lab_of(item.nodeid) or Path(str(item.fspath)).parent.name  # kit, grader
        rank = group_rank.setdefault(group, len(group_rank))
        keys.append((rank, item.get_closest_marker("torch") is not None, index))
    order = sorted(range(len(items)), key=keys.__getitem__)
    return [items[i] for i in order]

