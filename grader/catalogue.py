"""The bug catalogue: realistic student mistakes, kept as data, that the tests must catch.

``solutions/NN_name/bugs.toml`` lists the lab's bugs:

    [[bug]]
    id = "mask-wrong-triangle"
    concept = "causal mask on the wrong triangle"
    file = "causal_mask.py"
    find = "    return key_pos <= query_pos\n"      # must occur exactly once
    replace = "    return key_pos >= query_pos\n"
    expect = ["future"]   # a failing test's message must name one of these

Each bug is applied to a temporary copy of the solutions and the lab's tests are run
on it: the bug is *caught* when a test fails, and *explained* when a failure message
contains one of the ``expect`` words (the concept, in the lab's terms).
"""

from __future__ import annotations

import shutil
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gptkit.testing.layout import KIT_ROOT, lab_dirs
from grader.pytest_run import TestResult, run_pytest


class CatalogueError(ValueError):
    pass


@dataclass(frozen=True)
class Bug:
    lab: str
    id: str
    concept: str
    file: str
    find: str
    replace: str
    expect: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.lab}/{self.id}"


@dataclass
class BugResult:
    bug: Bug
    caught: bool = False
    explained: bool = False
    failures: list[TestResult] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.caught and self.explained and not self.error


def load_catalogue(solutions: Path = KIT_ROOT / "solutions", labs: list[str] | None = None) -> list[Bug]:
    bugs = []
    for lab in lab_dirs(solutions):
        if labs and lab.number not in labs and lab.name not in labs:
            continue
        path = lab.code_dir / "bugs.toml"
        if not path.is_file():
            continue
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        for entry in data.get("bug", []):
            try:
                bugs.append(Bug(lab.name, entry["id"], entry["concept"], entry["file"],
                                entry["find"], entry["replace"], tuple(entry["expect"])))
            except KeyError as exc:
                raise CatalogueError(f"{path}: a bug lacks the field {exc}") from None
    return bugs


def apply_bug(bug: Bug, tree: Path) -> None:
    """Edit the copy in ``tree`` (an implementation tree) to contain ``bug``."""
    target = tree / bug.lab / bug.file
    text = target.read_text(encoding="utf-8")
    count = text.count(bug.find)
    if count != 1:
        raise CatalogueError(
            f"{bug.name}: the text to replace occurs {count} times in {bug.file} (must be exactly once): "
            "update the catalogue entry after editing the solution"
        )
    target.write_text(text.replace(bug.find, bug.replace), encoding="utf-8")


def check_bug(bug: Bug, solutions: Path = KIT_ROOT / "solutions") -> BugResult:
    result = BugResult(bug)
    with tempfile.TemporaryDirectory(prefix="kit-bug-") as tmp:
        tree = Path(tmp) / "impl"
        shutil.copytree(solutions, tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        try:
            apply_bug(bug, tree)
        except CatalogueError as exc:
            result.error = str(exc)
            return result
        _, results, output = run_pytest(tree, f"lab{bug.lab[:2]}")
    if not results:
        result.error = "the tests did not run:\n" + output[-2000:]
        return result
    result.failures = [r for r in results if r.outcome in ("failed", "error")]
    result.caught = bool(result.failures)
    words = [w.lower() for w in bug.expect]
    result.explained = any(w in f.message.lower() for f in result.failures for w in words)
    return result


def check_catalogue(bugs: list[Bug], jobs: int = 2, solutions: Path = KIT_ROOT / "solutions") -> list[BugResult]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda b: check_bug(b, solutions), bugs))


def describe(result: BugResult) -> str:
    """One line per bug for reports."""
    b = result.bug
    if result.error:
        return f"ERROR   {b.name}: {result.error.splitlines()[0]}"
    if not result.caught:
        return f"MISSED  {b.name}: no test fails with '{b.concept}'"
    first = result.failures[0]
    if not result.explained:
        return (f"VAGUE   {b.name}: caught, but no message names {list(b.expect)}; "
                f"first: {first.message.splitlines()[0][:160] if first.message else first.nodeid}")
    hit = next(f for f in result.failures if any(w.lower() in f.message.lower() for w in b.expect))
    return f"caught  {b.name}: {len(result.failures)} failing; e.g. {hit.message.splitlines()[0][:160]}"
