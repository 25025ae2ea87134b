"""``grader fixtures``: regenerate the stored expected values every lab's tests read.

Each lab that stores fixtures has ``tests/NN_name/make_fixtures.py`` defining

    NEEDS_TORCH = False          # True when the recipe calls PyTorch/HuggingFace
    def build() -> dict[str, dict[str, np.ndarray]]:   # case name → arrays

The recipe runs with the reference solutions importable by module name. Output goes to
``tests/NN_name/fixtures/<case>.npz`` through a deterministic writer, so running the
command twice changes nothing.

What a catalogued student mistake outputs is stored beside the right answer, so a failing
test can say "Your result matches <the bug's concept>" without holding a second, wrong
implementation: a recipe calls :func:`diagnoses` for a case with a function computing the
case's outputs from a module, and every bug of the lab whose ``diagnose`` (in
``bugs.toml``) lists that case is applied to the solution and run through it. Adding such
a bug is one ``bugs.toml`` entry and ``uv run grader fixtures``.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

from gptkit.testing.fixtures import diagnosis_key, label_key, write_npz
from gptkit.testing.layout import KIT_ROOT, LAB_DIR_RE, bind_tree
from grader.catalogue import CatalogueError, import_with_bug, load_catalogue


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


_BUILT: dict[tuple, dict] = {}


def built_once(recipe: Path, module, solutions: Path = KIT_ROOT / "solutions") -> dict:
    """``module.build()`` of ``recipe`` (loaded by :func:`load_recipe`) on ``solutions``,
    made once per process for the same recipe text and tree: the kit's own checks compare
    the same build with the stored fixtures more than once in a test session
    (tests/kit/test_fixtures.py, ``grader validate``), and a recipe that builds HuggingFace
    models is slow. The arrays are shared, so they are read-only; writing fixtures always
    builds anew."""
    key = (str(Path(recipe).resolve()), Path(recipe).read_bytes(), str(Path(solutions).resolve()))
    if key not in _BUILT:
        cases = module.build()
        for arrays in cases.values():
            for value in arrays.values():
                if isinstance(value, np.ndarray):
                    value.flags.writeable = False
        _BUILT[key] = cases
    return _BUILT[key]


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def npz_bytes(arrays) -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "x.npz"
        write_npz(p, arrays)
        return p.read_bytes()


# -- diagnoses: the outputs of catalogued mistakes ------------------------------------------

@functools.cache
def bugged(lab: str, bug_id: str, module: str) -> ModuleType:
    """The solution's ``module`` with the catalogued bug ``lab``/``bug_id`` applied."""
    found = [b for b in load_catalogue(labs=[lab]) if b.id == bug_id]
    if not found:
        raise CatalogueError(f"{lab}: no bug {bug_id!r} in its bugs.toml")
    return import_with_bug(found[0], module)


def differs(expected, wrong, tol: float = 1e-4) -> bool:
    """Can a test tell ``wrong`` from ``expected``? Floats must differ beyond ``tol``
    (absolute and relative: beyond the tests' own tolerances), anything else at all."""
    expected, wrong = np.asarray(expected), np.asarray(wrong)
    if expected.shape != wrong.shape:
        return True
    if expected.dtype.kind in "fc" or wrong.dtype.kind in "fc":
        return not np.allclose(expected, wrong, rtol=tol, atol=tol, equal_nan=True)
    return not np.array_equal(expected, wrong)


def diagnoses(lab: str, case: str, expected: dict, outputs: Callable[[ModuleType], dict], module: str) -> dict:
    """What each bug of ``lab`` that lists ``case`` in its ``diagnose`` outputs there.

    ``outputs(m)`` computes the case's outputs (name → array) with ``m`` in place of the
    solution's ``module``; each output a bug changes is stored as ``<output>@<bug id>``,
    with the bug's concept as ``label@<bug id>`` (read by ``stored_diagnoses``). A bug that
    changes none of them cannot be told apart on this case: that is an error.
    """
    stored = {}
    for bug in load_catalogue(labs=[lab]):
        if case not in bug.diagnose:
            continue
        got = outputs(bugged(lab, bug.id, module))
        changed = {name: np.asarray(value) for name, value in got.items() if differs(expected[name], value)}
        if not changed:
            raise CatalogueError(f"{bug.name}: on the fixture case {case!r} it gives the right answer "
                                 f"({', '.join(got)}): change the case or drop {case!r} from its diagnose")
        stored.update({diagnosis_key(name, bug.id): value for name, value in changed.items()})
        stored[label_key(bug.id)] = np.array(bug.concept)
    return stored


def _check_diagnosed(lab: str, cases: dict) -> None:
    """Every case a bug's ``diagnose`` names holds that bug's diagnosis."""
    for bug in load_catalogue(labs=[lab]):
        missing = [c for c in bug.diagnose if label_key(bug.id) not in cases.get(c, {})]
        if missing:
            raise CatalogueError(f"{bug.name}: diagnose names {missing}, but tests/{lab}/make_fixtures.py stores no "
                                 f"diagnosis there (its cases: {sorted(cases)}; a case diagnoses bugs only where "
                                 "its recipe calls grader.fixtures.diagnoses)")


# -- is a stored fixture current? ---------------------------------------------------------

# Regenerated on another CPU or BLAS, float32 results differ by rounding: a dot product's
# error grows with the size of its terms, not of its result, so an element near zero (a sum
# that cancels) can be off by far more than its own magnitude allows, e.g. 3.5e-6 on logits
# of size ~1 (float32's eps is 1.2e-7). So the absolute part scales with the array: 1e-5 of
# its largest finite magnitude (about 100 float32 ulps of it), plus 1e-5 relative. An edited
# recipe (another seed, input or formula) moves values by a sizeable fraction of that
# magnitude, thousands of times more. Looser would let a stale fixture shift values by more
# than the tests' own default atol (1e-5, on arrays of magnitude ~1) and change a verdict.
# Integers, booleans, strings and bytes must be exact.
FLOAT_RTOL, FLOAT_ATOL_OF_MAX = 1e-5, 1e-5


def same_values(old, new) -> bool:
    """True when ``new`` holds the stored array ``old``'s values: exactly for integers,
    bools, strings and bytes; to float32 rounding noise for floats."""
    old, new = np.asarray(old), np.asarray(new)
    if old.shape != new.shape or old.dtype != new.dtype:
        return False
    if old.dtype.kind not in "fc":
        return bool(np.array_equal(old, new))
    finite = np.abs(old[np.isfinite(old)])
    atol = FLOAT_ATOL_OF_MAX * float(finite.max()) if finite.size else 0.0
    return bool(np.allclose(new, old, rtol=FLOAT_RTOL, atol=atol, equal_nan=True))


def _same_fixture(path: Path, arrays: dict) -> bool:
    with np.load(path, allow_pickle=False) as old:
        return sorted(old.files) == sorted(arrays) and all(same_values(old[k], arrays[k]) for k in old.files)


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
        cases = built_once(recipe, module, solutions) if check else module.build()
        _check_diagnosed(lab, cases)
        out_dir = recipe.parent / "fixtures"
        for case, arrays in sorted(cases.items()):
            path = out_dir / f"{case}.npz"
            new = npz_bytes(arrays)
            if path.is_file() and (path.read_bytes() == new or _same_fixture(path, arrays)):
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
