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


def _recipes_of(tests_dir: Path, labs: list[str] | None):
    """``(lab, recipe, module, skip)`` for each recipe of ``labs`` (all when None):
    ``skip`` says why it cannot run here (it needs torch), else it is None."""
    for recipe in recipes(tests_dir):
        lab = recipe.parent.name
        if labs and lab[:2] not in labs and lab not in labs:
            continue
        module = load_recipe(recipe)
        needs = getattr(module, "NEEDS_TORCH", False) and not torch_available()
        yield lab, recipe, module, "needs torch and transformers (`uv sync --extra torch`)" if needs else None


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
        with np.errstate(all="ignore"):  # a mistake may well make inf or nan: that is its output, not a warning
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
# that cancels) can be off by far more than its own magnitude allows, and rounding adds up
# through a chain (two AdamW steps after a backward pass moved moments by 2e-5 of their
# largest value when OpenBLAS picked another kernel). So the absolute part scales with
# the array: 1e-4 of its largest finite magnitude, plus 1e-4 relative. The bound is
# certified on a panel (NOISE_JSON below): every honest rebuild stays within half of it,
# while an edited recipe (another seed, input or formula, even a formula changed by 0.1%)
# moves values at least ten times as far. This check asks only "was the recipe or the
# reference edited without regenerating?": whether the stored values are close enough for
# the tests' own tolerances is the tolerance certificate's question (docs/tolerances.md),
# measured on the same kernels and threads. Integers, booleans, strings and bytes must be
# exact.
FLOAT_RTOL, FLOAT_ATOL_OF_MAX = 1e-4, 1e-4


def deviation(old, new) -> float:
    """How far ``new`` is from the stored array ``old``, as a share of the staleness bound
    (``same_values`` holds at ≤ 1): ``max |new − old| / (atol + rtol·|old|)`` for floats;
    0 or inf for integers, bools, strings and bytes (exact or not), and inf for another
    shape or dtype."""
    old, new = np.asarray(old), np.asarray(new)
    if old.shape != new.shape or old.dtype != new.dtype:
        return float("inf")
    if old.dtype.kind not in "fc":
        return 0.0 if np.array_equal(old, new) else float("inf")
    if not np.array_equal(np.isnan(old), np.isnan(new)) or not np.array_equal(old[np.isinf(old)], new[np.isinf(old)]):
        return float("inf")
    finite = np.isfinite(old) & np.isfinite(new)
    if not finite.any():
        return 0.0 if np.array_equal(np.isfinite(old), np.isfinite(new)) else float("inf")
    if not np.array_equal(np.isfinite(old), np.isfinite(new)):
        return float("inf")
    o, n = old[finite].astype(np.float64), new[finite].astype(np.float64)
    atol = FLOAT_ATOL_OF_MAX * float(np.abs(o).max())
    bound = atol + FLOAT_RTOL * np.abs(o)
    diff = np.abs(n - o)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / bound)
    return float(ratio.max())


def same_values(old, new) -> bool:
    """True when ``new`` holds the stored array ``old``'s values: exactly for integers,
    bools, strings and bytes; to float32 rounding noise for floats."""
    return deviation(old, new) <= 1.0


def _same_fixture(path: Path, arrays: dict) -> bool:
    with np.load(path, allow_pickle=False) as old:
        return sorted(old.files) == sorted(arrays) and all(same_values(old[k], arrays[k]) for k in old.files)


def generate(labs: list[str] | None = None, *, check: bool = False,
             tests_dir: Path = KIT_ROOT / "tests", solutions: Path = KIT_ROOT / "solutions",
             log=print) -> FixtureReport:
    """Build every recipe's fixtures; write them, or with ``check`` only compare."""
    use_solutions(solutions)
    report = FixtureReport()
    for lab, recipe, module, skip in _recipes_of(tests_dir, labs):
        if skip:
            report.skipped.append(f"{lab}: {skip}")
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


# -- how far honest rebuilds land from the stored fixtures ----------------------------------
# The staleness bound above is certified the way the tests' tolerances are
# (grader/tolerances.py): every fixture is rebuilt by a panel of honest builds (the
# reference here, under each OpenBLAS kernel this CPU runs, with 1 and several BLAS
# threads, and the reference computed in float64), and each float array's deviation is
# measured as a share of the bound. A rebuild must stay within NOISE_MARGIN of it; an
# edited recipe (tests/kit/test_fixtures.py) lands far beyond it.

NOISE_MARGIN = 0.5
NOISE_JSON = KIT_ROOT / "docs" / "fixture_noise.json"


def deviations(tests_dir: Path = KIT_ROOT / "tests", solutions: Path = KIT_ROOT / "solutions",
               labs: list[str] | None = None, promoted: bool = False) -> dict[str, dict[str, float]]:
    """For each stored fixture (``NN_name/case``), each array's :func:`deviation` between
    the stored value and a fresh build from ``solutions``. ``promoted``: the tree computes
    in float64 (``grader.tolerances.float64_tree``), so a float32 array recorded inside
    its computation (a trace of every sub-layer) comes out float64; it is compared as the
    float32 the variant stands for."""
    use_solutions(solutions)
    out: dict[str, dict[str, float]] = {}
    for lab, recipe, module, skip in _recipes_of(tests_dir, labs):
        if skip:
            continue
        for case, arrays in sorted(module.build().items()):
            path = recipe.parent / "fixtures" / f"{case}.npz"
            if not path.is_file():
                continue
            with np.load(path, allow_pickle=False) as old:
                out[f"{lab}/{case}"] = {k: (deviation(old[k], _as_stored(old[k], arrays[k], promoted))
                                            if k in arrays else float("inf")) for k in old.files}
    return out


def _as_stored(old: np.ndarray, new, promoted: bool):
    new = np.asarray(new)
    if promoted and old.dtype == np.float32 and new.dtype == np.float64:
        return new.astype(np.float32)
    return new


def _deviations_main(solutions: str, labs: str, promoted: bool = False) -> None:  # a child of noise_panel
    import json
    import sys

    found = deviations(solutions=Path(solutions), labs=labs.split(",") if labs else None, promoted=promoted)
    sys.stdout.write("\n@@deviations@@" + json.dumps(found) + "\n")


def noise_panel(labs: list[str] | None = None, only: list[str] | None = None, jobs: int = 2, log=print) -> dict:
    """Rebuild every fixture under each honest variant, each in a fresh process (``jobs``
    at a time), and keep the worst deviation of every array, with the variant that gave it."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from grader import tolerances

    def rebuild(variant):
        name, tree, env = variant
        log(f"rebuilding the fixtures: {name} …")
        code = (f"from grader.fixtures import _deviations_main; "
                f"_deviations_main({tree!r}, {','.join(labs or [])!r}, {name == 'float64'})")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=KIT_ROOT,
                              env={**os.environ, **env})
        if proc.returncode != 0 or "@@deviations@@" not in proc.stdout:
            raise RuntimeError(f"{name}: the rebuild failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.rsplit("@@deviations@@", 1)[1])

    worst: dict[str, dict] = {}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        variants = [("reference", str(KIT_ROOT / "solutions"), {}),
                    ("float64", str(tolerances.float64_tree(Path(tmp))), {})]
        variants += [(v.id, str(KIT_ROOT / "solutions"), v.env) for v in tolerances.kernel_variants()]
        variants += [(f"threads-{n}", str(KIT_ROOT / "solutions"), {"OPENBLAS_NUM_THREADS": str(n)})
                     for n in (1, 7)]  # this machine's own count is the reference's
        variants = [v for v in variants if not only or any(v[0].startswith(o) for o in only)]
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            for (name, _, env), found in zip(variants, pool.map(rebuild, variants)):
                runs.append({"id": name, "env": env, "kernel": tolerances.blas_kernel(env), "fixtures": len(found)})
                for fixture, arrays in found.items():
                    for array, dev in arrays.items():
                        key = f"{fixture}:{array}"
                        if key not in worst or dev > worst[key]["deviation"]:
                            worst[key] = {"deviation": dev, "by": name}
    return {"bound": {"rtol": FLOAT_RTOL, "atol_of_max": FLOAT_ATOL_OF_MAX}, "margin": NOISE_MARGIN,
            "machine": tolerances.machine(), "panel": runs, "arrays": dict(sorted(worst.items()))}


def merge_noise(old: dict, new: dict, labs: list[str] | None, variants: list[str] | None) -> dict:
    """``new``, a run on some labs or some variants, merged into the stored report ``old``:
    a run of the whole panel on some labs replaces those labs' rows; a run of some
    variants keeps, for each array, the worst of the stored rows (made by the other
    variants) and its own, and those variants' panel lines replace theirs."""
    def in_labs(key: str) -> bool:
        return not labs or any(key.startswith(lab) or key[:2] == lab for lab in labs)

    if variants:
        arrays = dict(old["arrays"])
        for key, row in new["arrays"].items():
            mine = arrays.get(key)
            if mine is None or mine["by"] in {run["id"] for run in new["panel"]} or row["deviation"] > mine["deviation"]:
                arrays[key] = row  # (a row of a re-run variant is replaced even when it falls)
        panel = [run for run in old["panel"] if run["id"] not in {r["id"] for r in new["panel"]}] + new["panel"]
    else:
        arrays = {**{k: v for k, v in old["arrays"].items() if not in_labs(k)}, **new["arrays"]}
        panel = new["panel"] if not labs else old["panel"]
    return {**new, "panel": sorted(panel, key=lambda r: r["id"]), "arrays": dict(sorted(arrays.items()))}
