"""The bug catalogue: realistic student mistakes, kept as data, that the tests must catch.

``solutions/NN_name/bugs.toml`` lists the lab's bugs:

    [[bug]]
    id = "mask-wrong-triangle"
    concept = "causal mask on the wrong triangle"
    file = "causal_mask.py"
    find = "    return key_pos <= query_pos\n"      # must occur exactly once
    replace = "    return key_pos >= query_pos\n"
    expect = ["future"]   # a failing test's message must name one of these

A bug that needs several edits lists them instead of ``find``/``replace``:

    edits = [{find = "...", replace = "..."}, {file = "03_layernorm_ffn/layers.py", find = "...", replace = "..."}]

``live = true`` marks a bug that only the live PyTorch/HuggingFace tests can catch (e.g.
on the GPT-2-small-shaped model): its check runs those tests too; every other bug must
be caught by the stored-fixture tests alone, as a student without torch runs them.

An edit's ``file`` (default: the bug's) is a module of this lab, or ``NN_name/module.py``
for an earlier lab's module that this lab's tests reach (only this lab's tests run).

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
class Edit:
    file: str  # "module.py" (this lab) or "NN_name/module.py"
    find: str
    replace: str


@dataclass(frozen=True)
class Bug:
    lab: str
    id: str
    concept: str
    edits: tuple[Edit, ...]
    expect: tuple[str, ...]
    live: bool = False  # caught by the live PyTorch/HuggingFace tests (run only for such bugs)

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
                raw_edits = entry.get("edits") or [{"find": entry["find"], "replace": entry["replace"]}]
                edits = tuple(Edit(e.get("file", entry.get("file", "")), e["find"], e["replace"]) for e in raw_edits)
                if not all(e.file for e in edits):
                    raise KeyError("file")
                bugs.append(Bug(lab.name, entry["id"], entry["concept"], edits, tuple(entry["expect"]),
                                bool(entry.get("live", False))))
            except KeyError as exc:
                raise CatalogueError(f"{path}: the bug {entry.get('id', '?')!r} lacks the field {exc}") from None
    return bugs


def apply_bug(bug: Bug, tree: Path) -> None:
    """Edit the copy in ``tree`` (an implementation tree) to contain ``bug``."""
    for edit in bug.edits:
        target = tree / (edit.file if "/" in edit.file else f"{bug.lab}/{edit.file}")
        if not target.is_file():
            raise CatalogueError(f"{bug.name}: no file {edit.file} to edit")
        text = target.read_text(encoding="utf-8")
        count = text.count(edit.find)
        if count != 1:
            raise CatalogueError(
                f"{bug.name}: the text to replace occurs {count} times in {edit.file} (must be exactly once): "
                "update the catalogue entry after editing the solution"
            )
        target.write_text(text.replace(edit.find, edit.replace), encoding="utf-8")


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
        # The stored-fixture tests must catch a bug on their own (students run them without
        # torch); only a bug marked `live = true` is also run against the live references.
        marker = f"lab{bug.lab[:2]}" + ("" if bug.live else " and not torch")
        _, results, output = run_pytest(tree, marker)
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
