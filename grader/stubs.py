"""Student stubs from reference solutions: the single source of truth.

In ``solutions/NN_name/<module>.py`` the student's part of each function sits between

    ### BEGIN SOLUTION <what to implement>
    ...
    ### END SOLUTION

In ``labs/NN_name/src/<module>.py`` that part becomes ``# YOUR CODE HERE`` and a
``NotImplementedError`` naming the lab and the task; everything else is copied as is,
under a first line that tells the student what to do with the file (see ``header``). The
stub does not name its solution: the student copy has none, and in the full kit
``tests/kit/test_stubs.py`` catches a stub edited by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

from gptkit.testing.layout import KIT_ROOT, lab_dirs

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION(?P<task>.*)$")
END = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")
DEF = re.compile(r"^[ \t]*(?:async\s+)?def\s+(?P<name>\w+)|^[ \t]*class\s+(?P<cls>\w+)")


class StubError(ValueError):
    pass


def header(lab_number: str) -> str:
    """A stub's first line, for the student who opens it: this is the file to fill in."""
    return (f"# Lab {lab_number}: fill in each `# YOUR CODE HERE` block in this file, "
            f"then run `uv run pytest -m lab{lab_number}`.\n")


def make_stub(source: str, lab_number: str, filename: str = "<solution>") -> str:
    """The stub text for one solution module's text (``filename``: where it is, for errors)."""
    out: list[str] = [header(lab_number)]
    scope: list[tuple[int, str]] = []  # (indent, name) of enclosing defs/classes
    inside = False
    begin_line = 0
    for lineno, line in enumerate(source.splitlines(keepends=True), 1):
        text = line.rstrip("\n")
        if inside:
            if BEGIN.match(text):
                raise StubError(f"{filename}:{lineno}: BEGIN SOLUTION inside another (opened at line {begin_line})")
            if END.match(text):
                inside = False
            continue
        m = BEGIN.match(text)
        if m:
            inside, begin_line = True, lineno
            indent = m["indent"]
            task = m["task"].strip() or f"implement {'.'.join(n for _, n in scope) or 'this'}"
            where = ".".join(n for _, n in scope)
            message = f"Lab {lab_number} · {where}: {task}" if where else f"Lab {lab_number} · {task}"
            out.append(f"{indent}# YOUR CODE HERE\n")
            out.append(f"{indent}raise NotImplementedError({message!r})\n")
            continue
        if END.match(text):
            raise StubError(f"{filename}:{lineno}: END SOLUTION without BEGIN SOLUTION")
        d = DEF.match(text)
        if d:
            indent = len(text) - len(text.lstrip())
            while scope and scope[-1][0] >= indent:
                scope.pop()
            scope.append((indent, d["name"] or d["cls"]))
        out.append(line)
    if inside:
        raise StubError(f"{filename}:{begin_line}: BEGIN SOLUTION is never closed")
    return "".join(out)


def expected_stubs(solutions: Path = KIT_ROOT / "solutions", labs: Path = KIT_ROOT / "labs") -> dict[Path, str]:
    """Every stub file's path under ``labs`` and the text it must have."""
    stubs: dict[Path, str] = {}
    for lab in lab_dirs(solutions):
        for module in lab.modules():
            src = lab.code_dir / f"{module}.py"
            stubs[labs / lab.name / "src" / f"{module}.py"] = make_stub(
                src.read_text(encoding="utf-8"), lab.number, src.relative_to(solutions.parent).as_posix()
            )
    return stubs


def stale_stubs(solutions: Path = KIT_ROOT / "solutions", labs: Path = KIT_ROOT / "labs") -> list[Path]:
    """Stub files that are missing or differ from what their solutions generate."""
    return [p for p, text in expected_stubs(solutions, labs).items()
            if not p.is_file() or p.read_text(encoding="utf-8") != text]


def write_stubs(solutions: Path = KIT_ROOT / "solutions", labs: Path = KIT_ROOT / "labs") -> list[Path]:
    """Regenerate the stubs; returns the files that changed."""
    changed = []
    for path, text in expected_stubs(solutions, labs).items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed
