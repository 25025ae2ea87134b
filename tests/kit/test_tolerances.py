"""The tolerance certificate (docs/tolerances.md, ``grader tolerances``) still holds.

The stored report (docs/tolerances.json) gives, for every comparison the lab tests make,
the worst error of the correct variants and the smallest error of a catalogued bug that
fails it, each measured against the comparison's bound. These tests fail when a margin
is broken, when a comparison has no certificate, and when a cheap re-measurement (the
reference and its float64 variant on labs 01–03) no longer agrees with the report.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from gptkit.testing.layout import KIT_ROOT, lab_of
from grader import tolerances

REPORT = tolerances.load_report()
ROWS = REPORT["comparisons"]
RECHECK_LABS = ["01", "02", "03"]


def test_every_margin_holds_or_is_explained():
    broken = [f"{key}: {row['status']} (worst correct {row['correct']['ratio']:.2g} of the bound by "
              f"{row['correct']['by']}; smallest bug {(row['bug'] or {}).get('ratio', float('nan')):.2g}× by "
              f"{(row['bug'] or {}).get('by')})"
              for key, row in ROWS.items() if row["status"] != "certified" and not row.get("accepted")]
    assert not broken, ("these comparisons' tolerances are not certified (a correct variant within "
                        f"{tolerances.CORRECT_MARGIN:g} of the bound, every bug beyond {tolerances.BUG_MARGIN:g}×): "
                        "fix the tolerance, or explain in solutions/tolerances.toml why it cannot be:\n"
                        + "\n".join(broken))


def test_every_explained_exception_is_still_needed():
    stale = [key for key in tolerances.uncertified() if key in ROWS and ROWS[key]["status"] == "certified"]
    missing = [key for key in tolerances.uncertified() if key not in ROWS]
    assert not stale, f"certified after all: remove from solutions/tolerances.toml: {stale}"
    assert not missing, f"solutions/tolerances.toml explains comparisons the tests no longer make: {missing}"


def test_the_margins_are_the_documented_ones():
    assert REPORT["margins"] == {"correct_at_most": tolerances.CORRECT_MARGIN, "bug_at_least": tolerances.BUG_MARGIN}
    assert {"reference", "float64"} <= {p["id"] for p in REPORT["panel"]}
    assert all(not p["failed_tests"] for p in REPORT["panel"]), "a correct variant failed a test when measured"
    assert all(b["failed_tests"] for b in REPORT["bugs"]), "a catalogued bug made no test fail when measured"


def _comparing_tests(path: Path) -> dict[str, bool]:
    """The test functions in ``path`` that call assert_close or assert_causal, directly or
    through a helper defined in the same module, each with whether it is a live test
    (marked ``torch``, itself or by the module's ``pytestmark``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_live = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                      and "torch" in ast.unparse(n.value) for n in tree.body)
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def calls(node) -> set[str]:
        out = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                f = sub.func
                out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
        return out

    comparing = {"assert_close", "assert_causal"}
    for _ in range(3):  # helpers of helpers
        comparing |= {name for name, f in funcs.items() if not name.startswith("test") and calls(f) & comparing}
    return {name: module_live or any("torch" in ast.unparse(d) for d in f.decorator_list)
            for name, f in funcs.items() if name.startswith("test") and calls(f) & comparing}


def test_the_report_covers_every_comparing_test():
    """A test that compares with a tolerance but has no certificate fails here: run
    `uv run grader tolerances --write` after adding one."""
    measured = {row["test"].split("[", 1)[0] for row in ROWS.values()}
    missing = []
    for folder in (KIT_ROOT / "tests", KIT_ROOT / "tests" / "hidden"):
        for path in sorted(folder.glob("[0-9][0-9]_*/test_*.py")):
            rel = path.relative_to(KIT_ROOT).as_posix()
            for name, live in sorted(_comparing_tests(path).items()):
                if f"{rel}::{name}" not in measured and (REPORT["live"] or not live):
                    missing.append(f"{rel}::{name}")
    assert not missing, "no certificate for these tests' comparisons (run `uv run grader tolerances --write`):\n" + \
        "\n".join(missing)


@pytest.fixture(scope="module")
def remeasured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tolerances")
    return {"reference": tolerances.measure(KIT_ROOT / "solutions", RECHECK_LABS, live=False),
            "float64": tolerances.measure(tolerances.float64_tree(tmp), RECHECK_LABS, live=False)}


@pytest.mark.parametrize("variant", ["reference", "float64"])
def test_the_stored_numbers_still_hold(remeasured, variant):
    m = remeasured[variant]
    assert not m.failed, f"the {variant} variant fails {m.failed}"
    assert m.worst, "nothing was recorded: is the hook in assert_close still called?"
    problems = []
    for key, w in m.worst.items():
        row = ROWS.get(key)
        if row is None:
            problems.append(f"{key}: not in the report")
        elif (w["atol"], w["rtol"]) != (row["atol"], row["rtol"]):
            problems.append(f"{key}: the test now uses atol={w['atol']:g}, rtol={w['rtol']:g}; the report has "
                            f"atol={row['atol']:g}, rtol={row['rtol']:g}")
        elif w["ratio"] > max(row["correct"]["ratio"], tolerances.CORRECT_MARGIN):
            problems.append(f"{key}: {variant} now uses {w['ratio']:.2g} of its bound (the report: "
                            f"{row['correct']['ratio']:.2g})")
    stored = {k for k, r in ROWS.items() if lab_of(r["test"])[:2] in RECHECK_LABS}
    gone = sorted(stored - set(m.worst))
    assert not problems, "\n".join(problems)
    assert not gone, "the report certifies comparisons the tests no longer make:\n" + "\n".join(gone)


def test_the_recorder_measures_against_the_bound():
    from gptkit.testing.tolerance_log import measure

    got = measure(np.array([1.0, 2.1, -np.inf]), np.array([1.0, 2.0, -np.inf]), atol=0.1, rtol=0.05)
    assert got["max_abs"] == pytest.approx(0.1) and got["ratio"] == pytest.approx(0.1 / (0.1 + 0.05 * 2.0))
    assert measure(np.array([0.0]), np.array([-np.inf]), atol=1, rtol=0)["ratio"] == float("inf")
    assert measure(np.array([3]), np.array([3]), atol=0, rtol=0)["ratio"] == 0


def test_a_partial_run_replaces_its_own_earlier_runs_in_the_panel():
    """Re-certifying one lab replaces that lab's earlier runs of the same variants in the
    panel (they made none of the rows left) and keeps the runs that still made some."""
    def report(date, panel, labs):
        return {"machine": {"date": date}, "labs": labs, "live": False, "panel": panel, "bugs": [],
                "catalogued": {}, "comparisons": {f"{lab}::t": {"lab": lab} for lab in labs}}

    old = report("day 1", [{"id": "reference", "labs": "all"}, {"id": "reference", "labs": ["11", "12"]},
                           {"id": "reference", "labs": ["12"]}, {"id": "threads-2", "labs": ["12"]}],
                 ["11_assistant", "12_inference"])
    new = report("day 2", [{"id": "reference", "labs": ["12"]}], ["12_inference"])
    merged = tolerances.merge_reports(old, new)
    assert [(p["id"], p["labs"], p["date"]) for p in merged["panel"]] == [
        ("reference", "all", "day 1"), ("reference", ["11", "12"], "day 1"), ("threads-2", ["12"], "day 1"),
        ("reference", ["12"], "day 2")], merged["panel"]
    again = tolerances.merge_reports(merged, new)
    assert again["panel"] == merged["panel"], "a second identical partial run must not add its lines again"
