"""``grader fixtures``: regenerate the stored expected values every lab's tests read.

Each lab that stores fixtures has ``tests/NN_name/make_fixtures.py`` defining

    NEEDS_TORCH = False          # True when the recipe calls PyTorch/HuggingFace
    def build() -> dict[str, dict[str, np.ndarray]]:   # case name → arrays

The recipe runs with the reference solutions importable by module name. Output goes to
``tests/NN_name/fixtures/<case>.npz`` through a deterministic writer, so running the
command twice changes nothing.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from gptkit.testing.fixtures import write_npz
from gptkit.testing.layout import KIT_ROOT, LAB_DIR_RE, bind_tree


@dataclass
class FixtureReport:
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    stale: list[Path] = field(default_factory=list)  # check mode: would change
    removed: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "NN_name: reason"


def recipes(tests_dir: Path = KIT_ROOT / "tests") -> list[Path]:
    return sorted(p for p in tests_dir.glob("*/make_fixtures.py") if LAB_DIR_RE.match(p.parent.name))


def use_solutions(solutions: Path) -> None:
    bind_tree(solutions)


def load_recipe(path: Path):
    spec = importlib.util.spec_from_file_location(f"_fixture_recipe_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def npz_bytes(arrays) -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "x.npz"
        write_npz(p, arrays)
        return p.read_bytes()


# Floats regenerated on another machine (another BLAS kernel, another CPU) may differ in
# their last bits; within these tolerances a stored fixture counts as current.
FLOAT_RTOL, FLOAT_ATOL = 1e-5, 1e-6


def _same_values(path: Path, arrays: dict) -> bool:
    """True when the stored fixture holds the same arrays: exactly for integers, bools and
    bytes, to float noise for floats."""
    import numpy as np

    with np.load(path, allow_pickle=False) as old:
        if sorted(old.files) != sorted(arrays):
            return False
        for key in old.files:
            a, b = old[key], np.asarray(arrays[key])
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            if a.dtype.kind == "f":
                if not np.allclose(a, b, rtol=FLOAT_RTOL, atol=FLOAT_ATOL, equal_nan=True):
                    return False
            elif not np.array_equal(a, b):
                return False
    return True


def generate(labs: list[str] | None = None, *, check: bool = False,
             tests_dir: Path = KIT_ROOT / "tests", solutions: Path = KIT_ROOT / "solutions",
             log=print) -> FixtureReport:
    """Build every recipe's fixtures; write them, or with ``check`` only compare."""
    use_solutions(solutions)
    report = FixtureReport()
    for recipe in recipes(tests_dir):
        lab = recipe.parent.name
        if labs and lab[:2] not in labs and lab not in labs:
            continue
        module = load_recipe(recipe)
        if getattr(module, "NEEDS_TORCH", False) and not torch_available():
            report.skipped.append(f"{lab}: needs torch and transformers (`uv sync --extra torch`)")
            continue
        log(f"building fixtures for {lab} …")
        cases = module.build()
        out_dir = recipe.parent / "fixtures"
        for case, arrays in sorted(cases.items()):
            path = out_dir / f"{case}.npz"
            new = npz_bytes(arrays)
            if path.is_file() and (path.read_bytes() == new or _same_values(path, arrays)):
                report.unchanged.append(path)  # float noise of another CPU or BLAS is not a change
            elif check:
                report.stale.append(path)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(new)
                report.written.append(path)
        for old in sorted(out_dir.glob("*.npz")) if out_dir.is_dir() else []:
            if old.stem not in cases:
                (report.stale if check else report.removed).append(old)
                if not check:
                    old.unlink()
    return report
