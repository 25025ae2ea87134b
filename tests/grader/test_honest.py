"""Honest code never loses a point: the corpus in tests/grader/honest/ (independent
submissions of every lab, written in different everyday styles: functions or classes,
helpers, the standard library, getattr and hasattr, comprehensions and generators,
dataclasses, enum) is graded in the configuration instructors get, at full marks, with no
note of the static review and no flag."""

import ast
import re
from pathlib import Path

import pytest

from grader.grade import Grader

from .conftest import reachable_dir

HONEST = Path(__file__).with_name("honest")
STYLES = sorted(p.name for p in HONEST.iterdir() if (p / "labs").is_dir()) if HONEST.is_dir() else []

# What the corpus is for: each of these appears in it (a module imported, a builtin called).
IDIOMS = {"modules": {"collections", "itertools", "functools", "copy", "re", "dataclasses", "enum", "warnings",
                      "numbers", "struct", "os"},
          "builtins": {"getattr", "hasattr", "setattr", "vars", "open"}}


def _sources():
    return {p: p.read_text(encoding="utf-8") for p in sorted(HONEST.glob("*/labs/*/src/*.py"))}


def test_the_corpus_holds_every_lab_in_several_styles_and_the_everyday_idioms():
    from grader.submission import expected_files

    assert len(STYLES) >= 2, f"expected at least two styles in {HONEST}"
    for style in STYLES:
        for lab, modules in expected_files().items():
            for m in modules:
                assert (HONEST / style / "labs" / lab / "src" / f"{m}.py").is_file(), f"{style}: {lab}/{m}.py"
    imported, called, generators, comprehensions = set(), set(), 0, 0
    for source in _sources().values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.add(node.func.id)
            generators += isinstance(node, (ast.GeneratorExp, ast.Yield, ast.YieldFrom))
            comprehensions += isinstance(node, (ast.ListComp, ast.DictComp, ast.SetComp))
    assert not IDIOMS["modules"] - imported, f"the corpus lacks {sorted(IDIOMS['modules'] - imported)}"
    assert not IDIOMS["builtins"] - called, f"the corpus lacks {sorted(IDIOMS['builtins'] - called)}"
    assert generators and comprehensions


@pytest.fixture(scope="module")
def default_grader(reachable_tmp):
    """Every lab, the limits and options an instructor gets from `grader grade`."""
    g = Grader(reachable_dir(reachable_tmp, "honest"), None, log=lambda *_: None)
    (g.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
    g.prepare()
    return g


@pytest.mark.parametrize("style", STYLES)
def test_honest_style_gets_full_marks_and_no_note(default_grader, style):
    r = default_grader.grade(style, HONEST / style)
    lost = {lab: [(t.nodeid.split("::")[-1], t.message[:300]) for t in lr.tests if t.outcome != "passed"][:3]
            for lab, lr in r.labs.items() if lr.points < lr.max_points}
    assert not lost, f"{style} lost points: {lost}"
    assert r.total == r.max_total and not r.error
    flags = [f for f in r.flags + [f"{lab}: {f}" for lab, lr in r.labs.items() for f in lr.flags]
             if not OWN_CHAIN_NOTE.search(f)]
    assert not flags, f"{style}: an honest submission must get no note or flag: {flags}"


OWN_CHAIN_NOTE = re.compile(r"^\d\d_[a-z0-9_]+ ran on your own earlier labs: it imports ")


def test_a_lab_that_imports_its_own_helper_from_an_earlier_lab_runs_on_the_students_own(grader, make_submission,
                                                                                       full_marks):
    """Students share helpers between labs: lab 02 importing a function that only the
    student's lab 01 defines would fail to import on the reference lab 01, so that lab runs
    on the student's own earlier labs, with a neutral note saying so."""
    sub = make_submission(edits={
        "01_causal_mask/causal_mask.py": [("def causal_mask(", "def as_int_array(x):\n    return np.asarray(x)\n\n\n"
                                                            "def causal_mask(")],
        "02_embeddings/embeddings.py": [("from gptkit import", "from causal_mask import as_int_array\nfrom gptkit import"),
                                        ("""        token_ids = np.asarray(token_ids)
        if token_ids.dtype.kind not in "iu":""", """        token_ids = as_int_array(token_ids)
        if token_ids.dtype.kind not in "iu":""")]})
    r = grader.grade("helper", sub)
    assert {k: v.points for k, v in r.labs.items()} == full_marks
    notes = [f for f in r.flags if OWN_CHAIN_NOTE.search(f)]
    assert len(notes) == 1 and notes[0].startswith("02_embeddings") and "as_int_array from causal_mask" in notes[0], r.flags


def test_without_the_kernel_walls_an_honest_gc_collect_still_runs():
    """Where the kernel lacks seccomp or Landlock, the audit hook stands alone: it still
    refuses gc's walks over the lab process's objects, but `import gc; gc.collect()` is
    honest code and runs."""
    import subprocess
    import sys

    code = ("import sys, tempfile\n"
            "from grader.sandbox.labserver import _guard\n"
            "root = tempfile.mkdtemp()\n"
            "_guard([sys.prefix, sys.base_prefix, root] + sys.path, [root], lambda what: None, walled=False)\n"
            "sys.modules.pop('gc', None)  # imported for real, as in a fresh interpreter\n"
            "import gc\n"
            "gc.collect()\n"
            "try:\n"
            "    gc.get_objects()\n"
            "except PermissionError:\n"
            "    print('walk refused')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "walk refused", out.stdout + out.stderr
