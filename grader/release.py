"""``grader release OUT``: the student copy of the kit.

It holds the stubs, the lab READMEs, the public tests with their fixtures, the concept
pages (``docs/NN_name.md`` and their index) and ``docs/grading.md``, the ``gptkit`` helpers, the ``grader``
package (in a copy without solutions it offers ``grader check`` alone: a student runs
their labs as the grader will) with the list of each lab's modules, a student README,
and pyproject/uv.lock. It holds no solutions, no hidden tests, no bug catalogue, and
none of the instructors' pages (grading, similarity thresholds, the trust model,
benchmarks, contributing) — and it is checked: no line of any solution block may appear
in any file of the release.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from gptkit.testing.layout import KIT_ROOT, LAB_DIR_RE, lab_dirs
from grader.stubs import BEGIN, END, expected_stubs
from grader.submission import MANIFEST, expected_files

TEMPLATE = Path(__file__).with_name("templates") / "STUDENT_README.md"
MIN_LEAK_CHARS = 20  # shorter lines ("return x") are too generic to call a leak
# The concept pages and how labs are graded; the other pages are the instructors'.
STUDENT_DOCS = re.compile(r"^(\d\d_[a-z0-9_]+|grading)\.md$")
INSTRUCTOR_SECTION = "## Other pages"  # where the docs index starts listing the instructors' pages


class ReleaseError(RuntimeError):
    pass


def solution_lines(solutions: Path = KIT_ROOT / "solutions") -> dict[str, str]:
    """Distinctive lines from inside every solution block → 'file:line' where they come from."""
    found: dict[str, str] = {}
    for lab in lab_dirs(solutions):
        for module in lab.modules():
            path = lab.code_dir / f"{module}.py"
            inside = False
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if BEGIN.match(line):
                    inside = True
                elif END.match(line):
                    inside = False
                elif inside:
                    text = line.strip()
                    if len(text) >= MIN_LEAK_CHARS and not text.startswith("#"):
                        found.setdefault(text, f"{path.relative_to(KIT_ROOT)}:{n}")
    # A line that also stands in the public part of any stub (e.g. `if mask is not None:`)
    # gives nothing away.
    public = {line.strip() for text in expected_stubs(solutions).values() for line in text.splitlines()}
    return {k: v for k, v in found.items() if k not in public}


def find_leaks(root: Path, solutions: Path = KIT_ROOT / "solutions") -> list[str]:
    lines = solution_lines(solutions)
    leaks = []
    for f in sorted(root.rglob("*")):
        if not f.is_file() or f.suffix in (".npz", ".lock") or ".venv" in f.parts:
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            src = lines.get(line.strip())
            if src:
                leaks.append(f"{f.relative_to(root)}:{n} repeats solution line {src}")
    return leaks


def stub_differences(stubs: dict[Path, str]) -> list[str]:
    """Each file under ``labs/`` that is not the stub its solution generates, and how it
    differs: YOUR CODE HERE blocks filled in (someone's work), or from which line."""
    out = []
    for path, text in stubs.items():
        rel = path.relative_to(KIT_ROOT)
        if not path.is_file():
            out.append(f"{rel}: missing")
            continue
        have = path.read_text(encoding="utf-8", errors="replace")
        if have == text:
            continue
        blocks = [line for line in text.splitlines() if line.strip().startswith("raise NotImplementedError(")]
        kept = set(have.splitlines())
        filled = sum(line not in kept for line in blocks)
        if filled:
            out.append(f"{rel}: {filled} of its {len(blocks)} YOUR CODE HERE block(s) filled in")
        else:
            a, b = have.splitlines(), text.splitlines()
            line = next((i for i, (x, y) in enumerate(zip(a, b), 1) if x != y), min(len(a), len(b)) + 1)
            out.append(f"{rel}: differs from the generated stub from line {line}")
    return out


def release(out: Path, *, force: bool = False, notes: list[str] | None = None) -> list[str]:
    """Write the student copy to ``out``; returns what was written (top-level entries).
    The stubs in it are those ``solutions/`` generates, whatever ``labs/*/src`` holds here:
    a file there that differs (work done in this copy, or a solution changed since) is
    left as it is and named in ``notes``."""
    out = Path(out).resolve()
    if out == KIT_ROOT or KIT_ROOT in out.parents and out.parent == KIT_ROOT and out.name in ("labs", "tests"):
        raise ReleaseError(f"refusing to release into {out}")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ReleaseError(f"{out} is not empty (use --force to replace it)")
        shutil.rmtree(out)
    stubs = expected_stubs()
    if notes is not None:
        notes += stub_differences(stubs)
    out.mkdir(parents=True, exist_ok=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints")
    for lab in lab_dirs(KIT_ROOT / "labs"):
        shutil.copytree(KIT_ROOT / "labs" / lab.name, out / "labs" / lab.name,
                        ignore=lambda d, names: skip(d, names) | ({"src"} if Path(d).parent.name == "labs" else set()))
    for path, text in stubs.items():
        dest = out / path.relative_to(KIT_ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
    (out / "tests").mkdir()
    shutil.copy2(KIT_ROOT / "tests" / "conftest.py", out / "tests" / "conftest.py")
    for d in sorted((KIT_ROOT / "tests").iterdir()):
        if d.is_dir() and LAB_DIR_RE.match(d.name):
            shutil.copytree(d, out / "tests" / d.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "make_fixtures.py"))
    shutil.copytree(KIT_ROOT / "gptkit", out / "gptkit", ignore=skip)
    shutil.copytree(KIT_ROOT / "grader", out / "grader", ignore=skip)
    (out / "grader" / MANIFEST.name).write_text(json.dumps(expected_files(), indent=1) + "\n", encoding="utf-8")
    write_student_docs(out / "docs")
    shutil.copy2(TEMPLATE, out / "README.md")
    shutil.copy2(KIT_ROOT / "pyproject.toml", out / "pyproject.toml")
    shutil.copy2(KIT_ROOT / "uv.lock", out / "uv.lock")
    (out / ".gitignore").write_text(".venv/\n__pycache__/\n*.pyc\n.pytest_cache/\n.hypothesis/\n.grader-check/\n.ipynb_checkpoints/\n")
    leaks = find_leaks(out)
    if leaks:
        shutil.rmtree(out)
        raise ReleaseError("solution text found in the release (nothing was written):\n  " + "\n  ".join(leaks[:20]))
    return sorted(p.name for p in out.iterdir())


def write_student_docs(out: Path, docs: Path = KIT_ROOT / "docs") -> list[str]:
    """The concept pages, how labs are graded, and the index, without the index's list of instructors' pages."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for page in sorted(docs.glob("*.md")):
        if STUDENT_DOCS.match(page.name):
            shutil.copy2(page, out / page.name)
            written.append(page.name)
    index = docs / "README.md"
    if index.is_file():
        text = index.read_text(encoding="utf-8")
        (out / "README.md").write_text(text.split(INSTRUCTOR_SECTION, 1)[0].rstrip() + "\n", encoding="utf-8")
        written.append("README.md")
    return written
