"""Which labs a student handed in, which earlier labs each lab runs on, and the notes that
follow from both.

A lab is *not handed in* when one of its modules is absent, or when every file of it is
the kit's stub as ``grader stubs`` writes it (line endings aside): a student who hands in
their whole copy hands in the untouched stubs of the labs they did not do. Such a lab is
not run (the stubs fail every test: ``grader validate`` checks it), and the student's
flags say "not handed in" once for it.

Lab N runs on the student's own earlier labs, but only on those its code and its tests
use: lab 08 (Llama) imports labs 01-06 and never lab 07. A lab that lost points names the
earlier labs it uses that lost points of their own, and those it uses that were not
handed in; no other.
"""

from __future__ import annotations

import re
from pathlib import Path

NOT_HANDED_IN = "not handed in"
MISSING = "missing"
AS_GIVEN = "is the stub as given, unchanged"
_LAB_MODULE = re.compile(rb"\blab\(\s*[\"']([A-Za-z_]\w*)[\"']")  # the tests' lab("gpt")


def _normal(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n")


def stub_texts(stubs: dict[Path, str]) -> dict[str, dict[str, bytes]]:
    """lab → module file → the stub's bytes, from ``grader.stubs.expected_stubs()``."""
    out: dict[str, dict[str, bytes]] = {}
    for path, text in stubs.items():
        out.setdefault(path.parent.parent.name, {})[path.name] = _normal(text.encode("utf-8"))
    return out


def not_handed_in(lab: str, missing: list[str], files: dict[str, bytes],
                  stubs: dict[str, bytes] | None) -> str:
    """Why ``lab`` counts as not handed in ("" when it was): its modules ``missing``, or
    ``files`` (path under src/ → bytes) exactly the kit's ``stubs`` of that lab."""
    if missing:
        return f"{NOT_HANDED_IN}: " + ", ".join(f"labs/{lab}/src/{m}.py" for m in missing) + f" {MISSING}"
    if stubs and files and set(files) <= set(stubs) and all(_normal(d) == stubs[rel] for rel, d in files.items()):
        return f"{NOT_HANDED_IN}: labs/{lab}/src {AS_GIVEN}"
    return ""


def flags(not_run: dict[str, str]) -> list[str]:
    """The student's flags for the labs ``not_handed_in`` gave a reason for: each lab once."""
    out = []
    for how, what in ((MISSING, "files missing"), (AS_GIVEN, "left as the stub")):
        labs = [lab for lab, why in not_run.items() if why.endswith(how)]
        if labs:
            out.append(f"{NOT_HANDED_IN} ({what}): " + ", ".join(labs))
    return out


def imported(sources) -> set[str]:
    """Top-level module names that Python ``sources`` (bytes) import, and that the kit's
    tests load with ``lab("name")``. Read line by line, without a parse (a file too deep or
    broken to parse still names its imports) and without a backtracking pattern (a
    student's file is read here, outside the sandbox, in time linear in its size)."""
    names: set[str] = set()
    for data in sources:
        for line in data.splitlines():
            words = line.split()
            if len(words) < 2 or words[0] not in (b"from", b"import"):
                continue
            targets = [words[1]] if words[0] == b"from" else line.split(b"import", 1)[1].split(b",")
            for target in targets:
                first = target.split()[0].split(b".")[0].decode("utf-8", "replace") if target.split() else ""
                if first.isidentifier():
                    names.add(first)
        if b"lab(" in data:
            names |= {m.decode() for m in _LAB_MODULE.findall(data)}
    return names


def _py(folder: Path) -> list[bytes]:
    """The Python files under ``folder`` that grading uses (fixture recipes are not)."""
    return [p.read_bytes() for p in sorted(folder.rglob("*.py")) if p.name != "make_fixtures.py"] \
        if folder.is_dir() else []


def kit_uses(source: Path, tests: Path, hidden: Path, labs: list[str]) -> dict[str, set[str]]:
    """lab → module names its kit code (``source``: solutions/ or labs/) and its tests use."""
    out = {}
    for lab in labs:
        code = source / lab / "src" if (source / lab / "src").is_dir() else source / lab
        out[lab] = imported(_py(code) + _py(tests / lab) + _py(hidden / lab))
    return out


def depends_on(kit: dict[str, set[str]], module_labs: dict[str, str],
               student: dict[str, dict[str, bytes]]) -> dict[str, list[str]]:
    """lab → the earlier labs it runs on, directly or through another: what the kit's code
    and tests of each lab import, and what the student's own files of it import."""
    direct = {}
    for lab, names in kit.items():
        own = imported(d for rel, d in student.get(lab, {}).items() if rel.endswith(".py"))
        direct[lab] = {module_labs[n] for n in names | own if n in module_labs and module_labs[n] < lab}
    out = {}
    for lab in sorted(direct):
        seen, todo = set(), list(direct[lab])
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo += direct.get(d, ())
        out[lab] = sorted(seen)
    return out


def _names(labs: list[str]) -> str:
    return labs[0] if len(labs) == 1 else ", ".join(labs[:-1]) + " and " + labs[-1]


def dependency_notes(res, deps: dict[str, list[str]], absent: set[str]) -> None:
    """Add to each lab of ``res`` that ran and lost points a note naming the earlier labs it
    runs on that lost points of their own, or that were not handed in (``absent``)."""
    for lab, lr in res.labs.items():
        if lab in absent or lr.points >= lr.max_points:
            continue
        uses = [d for d in deps.get(lab, []) if d in res.labs]
        lost = [d for d in uses if d not in absent and res.labs[d].points < res.labs[d].max_points]
        gone = [d for d in uses if d in absent]
        if lost:
            one = len(lost) == 1
            lr.flags.append(f"this lab runs on your own {_names(lost)}, which lost points of "
                            f"{'its' if one else 'their'} own: fix {'it' if one else 'them'} first, since "
                            f"{'its' if one else 'their'} mistakes can fail tests here too")
        if gone:
            lr.flags.append(f"this lab uses the code of {_names(gone)}: tests here that reach it cannot pass "
                            "without it")
