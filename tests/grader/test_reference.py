"""No reference code of any lab reaches a process that runs student code: lab N runs on
the student's own earlier labs, so nothing of the reference is there to read, load or
carry out through the feedback (the measured attack: lab 02's code read lab 01's
reference bytecode from its own tree and spread it over its failure messages)."""

import json

import pytest

from gptkit.testing.layout import KIT_ROOT
from grader.release import solution_lines
from grader.sandbox import runner

ALICE = KIT_ROOT / "examples" / "submissions" / "alice" / "labs"

# Appended to an honest lab 02: it looks everywhere it can for the reference (any line of a
# solution block that the student's own files do not hold, or compiled Python outside the
# Python installation) and, if it finds any, breaks its own lab, which then loses points.
SEARCH = """
import os as _os, sys as _sys
_LINES = set(__import__("json").loads({lines!r}))
_MODULES = set(__import__("json").loads({modules!r}))


def _found():
    here = _os.path.dirname(_os.path.abspath(__file__))
    near = [here, _os.getcwd(), _os.path.expanduser("~"), _os.environ.get("TMPDIR", "/tmp")]
    near += [p for p in _sys.path if p and "site-packages" not in p and "python3" not in p and "runtime" not in p]
    far = [_os.path.dirname(p) for p in near] + [_os.path.dirname(_os.path.dirname(p)) for p in near]
    roots = []
    for r in near + far + ["/sandbox", "/tmp"]:
        if r and r != "/" and r not in roots:
            roots.append(r)
    seen = 0
    for root in roots:
        for d, dirs, files in _os.walk(root):
            dirs[:] = [x for x in dirs if x not in ("site-packages", "lib-dynload", "__pycache__")
                       and not x.startswith(("python3", "gptkit-runtimes"))]
            for f in files:
                seen += 1
                if seen > 5000:
                    return None
                path = _os.path.join(d, f)
                if _os.path.abspath(path) == _os.path.abspath(__file__):
                    continue  # this file holds the lines it looks for
                if f.endswith(".pyc") and f.split(".")[0] in _MODULES and "gptkit" not in path:
                    return path
                try:
                    with open(path, "rb") as fh:
                        data = fh.read(1 << 18)
                except Exception:
                    continue
                text = data.decode("utf-8", "replace")
                if any(line in text for line in _LINES):
                    return path
    for name, module in list(_sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", "") or ""
        if origin.endswith(".pyc") or "solutions" in origin:
            return origin
    return None


_where = _found()
if _where is not None:
    raise RuntimeError("the reference is readable here: " + str(_where))
"""


MODULES = json.dumps(sorted(p.stem for p in (KIT_ROOT / "solutions").glob("*/*.py")))


def _reference_only_lines() -> list[str]:
    own = "".join(p.read_text(encoding="utf-8") for p in ALICE.glob("*/src/*.py"))
    return sorted(line for line, where in solution_lines().items()
                  if where.startswith(("solutions/01_", "solutions/02_")) and line not in own)


@pytest.mark.parametrize("mode", ["default", "rlimits"])
def test_no_reference_code_reaches_a_lab_process(two_lab_grader, make_submission, mode):
    lines = _reference_only_lines()
    assert len(lines) >= 10, "too few reference-only lines to look for"
    sub = make_submission()
    f = sub / "labs" / "02_embeddings" / "src" / "embeddings.py"
    f.write_text(f.read_text() + SEARCH.format(lines=json.dumps(lines), modules=MODULES))
    g = two_lab_grader
    if mode == "rlimits":
        g.isolation = "rlimits"
    try:
        r = g.grade("searcher", sub)
    finally:
        g.isolation = runner.isolation_mode()
    lab2 = r.labs["02_embeddings"]
    lost = [t.message[:300] for t in lab2.tests if t.outcome != "passed"]
    assert lab2.points == g.rubric["02_embeddings"].points, f"the reference was found: {lost[:2]}"
    assert r.labs["01_causal_mask"].points == g.rubric["01_causal_mask"].points


def test_the_search_finds_the_reference_where_it_is(tmp_path):
    """The search above has teeth: pointed at a folder holding a reference module, it finds it."""
    import subprocess
    import sys

    lines = _reference_only_lines()
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "causal_mask.py").write_text((KIT_ROOT / "solutions" / "01_causal_mask" /
                                                       "causal_mask.py").read_text())
    code = SEARCH.format(lines=json.dumps(lines), modules=MODULES).replace("__file__", repr(str(tmp_path / "ref" / "x.py")))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode != 0 and "the reference is readable here" in out.stderr, out.stderr[-500:]
