"""``grader validate``: the kit checks itself.

- stubs are current with their solutions;
- stored fixtures are current (recipes that need torch are skipped without it);
- the solutions pass every test;
- the stubs fail every lab test, each with the stub's NotImplementedError naming its lab;
- the student copy (``grader release``) builds and holds no solution text;
- every bug in the catalogue is caught, and the first failure under ``-x`` names it,
  with the live tests and without them (``catalogue.check_bug``).
Hidden tests (``tests/hidden/``) are part of "every test".
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

from gptkit.testing.layout import KIT_ROOT, lab_of, lab_test_paths
from grader import catalogue, fixtures, stubs
from grader.pytest_run import TestResult, run_pytest


@dataclass
class Section:
    title: str
    ok: bool = True
    lines: list[str] = field(default_factory=list)


def stub_failure_problem(r: TestResult) -> str | None:
    """Why a test's outcome on the stubs is wrong (None when it failed as a stub should)."""
    if r.outcome == "skipped":
        return None
    if r.outcome == "passed":
        return f"{r.nodeid} passes on the stubs: it cannot fail, so it checks nothing"
    # A public test must fail with its own lab's stub: that message is what the student
    # reads. Hidden tests report pass/fail only, and may reach an earlier lab's stub first.
    lab = None if r.nodeid.startswith("tests/hidden/") else lab_of(r.nodeid)
    if "NotImplementedError" not in r.message or (lab and f"Lab {lab[:2]}" not in r.message):
        first = r.message.splitlines()[0][:160] if r.message else "(no message)"
        return f"{r.nodeid} fails on the stubs without the lab's NotImplementedError: {first}"
    return None


def check_stubs_fail(labs_marker: str | None = None) -> Section:
    sec = Section("stubs fail every lab test with their NotImplementedError")
    marker = labs_marker or "not kit"
    _, results, output = run_pytest(KIT_ROOT / "labs", marker, args=lab_test_paths())
    if not results:
        return Section(sec.title, False, ["the tests did not run: " + output[-1000:]])
    problems = [p for p in map(stub_failure_problem, results) if p]
    sec.ok = not problems
    sec.lines = problems or [f"{sum(r.outcome != 'skipped' for r in results)} tests fail on the stubs, "
                             f"{sum(r.outcome == 'skipped' for r in results)} skipped"]
    return sec


def check_solutions_pass(marker: str | None = None, results: list[TestResult] | None = None) -> Section:
    """Every lab test passes on the reference: run here, or ``results`` of a run already
    made (:func:`session_results`)."""
    sec = Section("solutions pass every test")
    origin = []
    if results is None:
        _, results, output = run_pytest(KIT_ROOT / "solutions", marker or "not kit", args=lab_test_paths())
    else:
        output, origin = "(no results)", ["(the lab tests as this pytest session ran them, before this check)"]
    if not results:
        return Section(sec.title, False, ["the tests did not run: " + output[-1000:]])
    bad = [r for r in results if r.outcome in ("failed", "error")]
    skipped = [r for r in results if r.outcome == "skipped"]
    sec.ok = not bad
    sec.lines = [f"{r.nodeid}: {r.message.splitlines()[0][:200] if r.message else r.outcome}" for r in bad]
    reasons = sorted({r.message.splitlines()[0] for r in skipped if r.message})
    sec.lines.append(f"{len(results) - len(bad) - len(skipped)} passed, {len(bad)} failed, {len(skipped)} skipped")
    sec.lines += [f"skipped: {reason}" for reason in reasons] + origin
    return sec


def _result(nodeid: str, reports: list) -> TestResult:
    """One test's outcome from its pytest reports, as the JUnit report gives it."""
    live = any(r.keywords.get("torch") for r in reports)
    for r in reports:
        if r.failed:
            crash = getattr(r.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(r.longrepr)
            if r.when != "call":
                return TestResult(nodeid, "error", f'failed on {r.when} with "{message}"', r.duration, live)
            return TestResult(nodeid, "failed", message, r.duration, live)
    for r in reports:
        if r.skipped:
            reason = r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr)
            return TestResult(nodeid, "skipped", reason.removeprefix("Skipped: "), r.duration, live)
    return TestResult(nodeid, "passed", "", sum(r.duration for r in reports), live)


def session_results(config) -> list[TestResult] | None:
    """The results of every lab test on the reference as the pytest session ``config``
    ran them (the conftest's ``LabRun``), or None unless it ran exactly the lab tests a
    run of its own would, each to its end: then :func:`check_solutions_pass` need not run
    them a second time."""
    run = getattr(config, "_kit_lab_run", None)
    if run is None or getattr(config, "_kit_impl_root", None) != KIT_ROOT / "solutions":
        return None
    finished = {nodeid for nodeid, reports in run.reports.items() if reports[-1].when == "teardown"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--impl=solutions", "--collect-only", "-q", "-p", "no:randomly",
                           "-m", "not kit", *lab_test_paths()], cwd=KIT_ROOT, capture_output=True, text=True, timeout=600)
    every = {line for line in proc.stdout.splitlines() if "::" in line}
    if proc.returncode != 0 or not every or finished != every or set(run.reports) != every:
        return None
    return [_result(nodeid, run.reports[nodeid]) for nodeid in sorted(every)]


def check_release() -> Section:
    """The student copy builds and holds no solution text."""
    import tempfile
    from pathlib import Path

    from grader.release import ReleaseError, release

    with tempfile.TemporaryDirectory() as tmp:
        try:
            entries = release(Path(tmp) / "release")
        except ReleaseError as exc:
            return Section("the student copy builds without solution text", False, str(exc).splitlines())
    return Section("the student copy builds without solution text", True, [", ".join(entries)])


def run(jobs: int = 2, labs: list[str] | None = None, solutions_results: list[TestResult] | None = None
        ) -> list[Section]:
    """Every check; ``solutions_results``: every lab test's result on the reference, from
    a run already made (:func:`session_results`), instead of running them here."""
    sections = []

    stale = stubs.stale_stubs()
    sections.append(Section("stubs are current with the solutions", not stale,
                            [f"stale: {p.relative_to(KIT_ROOT)} (run `uv run grader stubs`)" for p in stale]))

    rep = fixtures.generate(labs, check=True, log=lambda *_: None)
    sections.append(Section("fixtures are current", not rep.stale,
                            [f"stale: {p.relative_to(KIT_ROOT)} (run `uv run grader fixtures`)" for p in rep.stale]
                            + [f"not checked: {s}" for s in rep.skipped]))

    marker = " or ".join(f"lab{n}" for n in labs) if labs else None
    sections.append(check_solutions_pass(marker, None if labs else solutions_results))
    sections.append(check_stubs_fail(marker))

    sections.append(check_release())

    bugs = catalogue.load_catalogue(labs=labs)
    results = catalogue.check_catalogue(bugs, jobs=jobs)
    sections.append(Section(f"every catalogued bug is caught, the first failure naming it ({len(bugs)} bugs)",
                            all(r.ok for r in results),
                            [catalogue.mode_line()] + [catalogue.describe(r) for r in results]))
    return sections


def render(sections: list[Section]) -> str:
    out = []
    for s in sections:
        out.append(f"[{'ok' if s.ok else 'FAIL'}] {s.title}")
        out += [f"       {line}" for line in s.lines]
    return "\n".join(out)
