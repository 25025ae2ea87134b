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
on the GPT-2-small-shaped model); every other bug must be caught by the stored-fixture
and property tests alone, as a student without torch runs them.

An edit's ``file`` (default: the bug's) is a module of this lab, or ``NN_name/module.py``
for an earlier lab's module that this lab's tests reach (only this lab's tests run). An
edit must change code: a ``find`` that lies only in a comment or a docstring, or whose
change touches only those, is refused (comments and docstrings are rewritten freely).

``diagnose = ["case", …]`` names fixture cases of the lab's ``make_fixtures.py`` that
store what this bug outputs; ``grader fixtures`` makes them by importing the solution with
the bug applied (:func:`import_with_bug`), and a failing test whose result matches says
"Your result matches <concept>", so a diagnosed bug's ``concept`` is written for the
student.

Each bug is applied to a temporary copy of the solutions and the lab's tests are run on
it with ``-x``, in the order a student's run takes (each lab's own tests before its live
comparisons; only the lab's test folders are collected, ``lab_test_paths``, which hold
the same tests in the same order as the whole of ``tests/``): the bug is *caught* when a
test fails before the live tests (a student without torch sees it), and *explained* when
that first failure's message contains one of the ``expect`` words (the concept, in the
lab's terms) or names the first place that differs ("first differs at ..."): the first
message a student reads names the mistake.
"""

from __future__ import annotations

import importlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import tokenize
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from gptkit.testing import firstdiff
from gptkit.testing.layout import KIT_ROOT, lab_dirs, lab_test_paths
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
    diagnose: tuple[str, ...] = ()  # fixture cases that store this bug's output

    @property
    def name(self) -> str:
        return f"{self.lab}/{self.id}"


@dataclass
class BugResult:
    bug: Bug
    caught: bool = False
    explained: bool = False
    failures: list[TestResult] = field(default_factory=list)  # under -x: the first failure alone
    error: str = ""
    live_only: bool = False  # the first failure is a live PyTorch/HuggingFace test

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
                                bool(entry.get("live", False)), tuple(entry.get("diagnose", ()))))
            except KeyError as exc:
                raise CatalogueError(f"{path}: the bug {entry.get('id', '?')!r} lacks the field {exc}") from None
    return bugs


def _prose_and_code(text: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Character spans of ``text``'s comments and statement strings (docstrings), and of
    its code tokens (names, operators, other strings…); whitespace is in neither."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(pos):
        return starts[pos[0] - 1] + pos[1]

    prose, code, line = [], [], []
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        span = (offset(tok.start), offset(tok.end))
        if tok.type == tokenize.COMMENT:
            prose.append(span)
        elif tok.type == tokenize.NEWLINE:  # a logical line of strings alone is a docstring
            (prose if line and all(t == tokenize.STRING for t, _ in line) else code).extend(s for _, s in line)
            line = []
        elif tok.type not in skip:
            line.append((tok.type, span))
    code.extend(s for _, s in line)
    return prose, code


def _code_spans(bug: Bug, edit: Edit, text: str) -> list[tuple[int, int]]:
    try:
        return _prose_and_code(text)[1]
    except (tokenize.TokenError, SyntaxError) as exc:
        raise CatalogueError(f"{bug.name}: {edit.file} is not valid Python around the edit {edit.find!r}: {exc}") from None


def _touches(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    return any(s < hi and lo < e for s, e in spans)


def _check_edits_code(bug: Bug, edit: Edit, text: str) -> None:
    """Refuse an edit whose ``find`` lies only in comments or docstrings, or that changes
    only comments or docstrings: the edit must remove code or put code in."""
    start = text.index(edit.find)
    # the part the edit changes: what find and replace do not share at either end
    same_start = len(os.path.commonprefix([edit.find, edit.replace]))
    room = min(len(edit.find), len(edit.replace)) - same_start
    same_end = len(os.path.commonprefix([edit.find[::-1][:room], edit.replace[::-1][:room]]))
    old_code = _code_spans(bug, edit, text)
    if not _touches(old_code, start, start + len(edit.find)):
        where = "matches only inside a comment or docstring"
    elif _touches(old_code, start + same_start, start + len(edit.find) - same_end):
        return  # it removes or rewrites code
    elif _touches(_code_spans(bug, edit, text.replace(edit.find, edit.replace)),
                  start + same_start, start + len(edit.replace) - same_end):
        return  # it puts code in
    else:
        where = "changes only a comment or docstring"
    raise CatalogueError(f"{bug.name}: the find {edit.find!r} in {edit.file} {where}; an edit must change "
                         "code: match and change the code itself")


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
        _check_edits_code(bug, edit, text)
        target.write_text(text.replace(edit.find, edit.replace), encoding="utf-8")


@contextmanager
def bugged_tree(bug: Bug, solutions: Path = KIT_ROOT / "solutions") -> Iterator[Path]:
    """A temporary copy of the solutions with ``bug`` applied (removed on exit)."""
    with tempfile.TemporaryDirectory(prefix="kit-bug-") as tmp:
        tree = Path(tmp) / "impl"
        shutil.copytree(solutions, tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        apply_bug(bug, tree)
        yield tree


def import_with_bug(bug: Bug, module: str, solutions: Path = KIT_ROOT / "solutions") -> ModuleType:
    """The solution's ``module`` imported with ``bug`` applied, beside (not instead of) the
    reference: the kit modules it imports are the bugged copies too, and ``sys.modules``
    and ``sys.path`` are as they were afterwards. (A kit module imported inside a function
    body, at call time, is the reference's.)"""
    with bugged_tree(bug, solutions) as tree:
        labs = lab_dirs(tree)
        names = {name for lab in labs for name in lab.modules()}
        saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
        path, no_bytecode = sys.path[:], sys.dont_write_bytecode
        sys.path[:0] = [str(lab.code_dir) for lab in labs]
        sys.dont_write_bytecode = True
        importlib.invalidate_caches()
        try:
            return importlib.import_module(module)
        finally:
            for name in names:
                sys.modules.pop(name, None)
            sys.modules.update(saved)
            sys.path[:], sys.dont_write_bytecode = path, no_bytecode


BUG_SECONDS = 600  # one bug's run of its lab's tests


def check_bug(bug: Bug, solutions: Path = KIT_ROOT / "solutions", live: bool = True) -> BugResult:
    """Run the lab's tests on the solutions with ``bug`` in them, stopping at the first
    failure (``-x``), as a student runs them: the first failure must name the mistake (an
    ``expect`` word, or the first place that differs).

    ``live`` (the default) runs the live PyTorch/HuggingFace tests too where torch is
    installed: the lab's own tests run before them (``concept_tests_first``), so a first
    failure that is not a live test is also the first failure without torch, and one
    run answers both. A bug must be caught before the live tests (by the stored fixtures
    and properties a student without torch runs) unless it is marked ``live = true``.
    ``live=False`` leaves the live tests out altogether (``-m "labNN and not torch"``)."""
    result = BugResult(bug)
    marker = f"lab{bug.lab[:2]}" + ("" if live else " and not torch")
    try:
        with bugged_tree(bug, solutions) as tree:
            _, results, output = run_pytest(tree, marker, args=["-x", *lab_test_paths([bug.lab])],
                                            timeout=BUG_SECONDS)
    except CatalogueError as exc:
        result.error = str(exc)
        return result
    except subprocess.TimeoutExpired:  # one bug's hang is that bug's report, not the end of the catalogue
        result.error = (f"the tests ran past {BUG_SECONDS} s with this bug (a test hangs on it): make a test "
                        "fail on it before any test can loop")
        return result
    if not results:
        result.error = "the tests did not run:\n" + output[-2000:]
        return result
    result.failures = [r for r in results if r.outcome in ("failed", "error")]
    if not result.failures:
        return result
    first = result.failures[0]
    ran_live = [r.nodeid for r in results[:results.index(first)] if r.live and r.outcome != "skipped"]
    if ran_live:
        result.error = (f"the live test {ran_live[0]} ran before the lab's own test {first.nodeid}: "
                        "the concept tests must run first (tests/conftest.py)")
        return result
    result.caught = bug.live or not first.live
    result.live_only = first.live
    words = [w.lower() for w in (*bug.expect, firstdiff.FIRST)]  # the concept, or the first place that differs
    result.explained = any(w in first.message.lower() for w in words)
    return result


def check_catalogue(bugs: list[Bug], jobs: int = 2, solutions: Path = KIT_ROOT / "solutions",
                    live: bool = True) -> list[BugResult]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda b: check_bug(b, solutions, live), bugs))


def torch_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def mode_line(live: bool = True) -> str:
    """How the catalogue runs the tests, for reports."""
    if not live:
        return "each bug under `pytest -m 'labNN and not torch' -x` (stored fixtures and properties only)"
    if not torch_installed():
        return ("each bug under `pytest -m labNN -x`; torch is not installed, so the live tests skip: "
                "this checks the run without torch only")
    return ("each bug under `pytest -m labNN -x` with the live tests: the first failure must come before "
            "them (as without torch) and name the mistake")


def describe(result: BugResult) -> str:
    """One line per bug for reports: what the first failure (under ``-x``) says."""
    b = result.bug
    if result.error:
        return f"ERROR   {b.name}: {result.error.splitlines()[0]}"
    if not result.failures:
        return f"MISSED  {b.name}: no test fails with '{b.concept}'"
    first = result.failures[0]
    said = first.message.splitlines()[0][:160] if first.message else first.nodeid
    if not result.caught:
        return (f"LIVE    {b.name}: only a live PyTorch/HuggingFace test catches it ({first.nodeid}); the "
                f"stored-fixture and property tests must (or mark it `live = true`)")
    if not result.explained:
        return f"VAGUE   {b.name}: the first failure names none of {list(b.expect)}: {said}"
    named = next(w for w in (*b.expect, firstdiff.FIRST) if w.lower() in first.message.lower())
    return f"caught  {b.name}: names {named!r}: {said}"
