"""The bug catalogue's edit machinery: every catalogued edit applies and changes code (not a
comment or docstring), a bugged module imports beside the reference without replacing it, and
the folders each bug's run collects hold every lab test."""

import subprocess
import sys

import numpy as np
import pytest

from gptkit.testing.layout import KIT_ROOT, lab_of, lab_test_paths
from grader.catalogue import Bug, CatalogueError, Edit, apply_bug, bugged_tree, import_with_bug, load_catalogue

SOURCE = '''"""A module."""


def f(x):
    """Return x plus one."""
    return x + 1  # add one
'''


def _bug(find, replace):
    return Bug("01_demo", "demo-bug", "a demo bug", (Edit("m.py", find, replace),), ("demo",))


def _apply(tmp_path, find, replace):
    (tmp_path / "01_demo").mkdir(exist_ok=True)
    (tmp_path / "01_demo" / "m.py").write_text(SOURCE, encoding="utf-8")
    apply_bug(_bug(find, replace), tmp_path)
    return (tmp_path / "01_demo" / "m.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("find, replace", [
    ("plus one", "minus one"),  # only in a docstring
    ("# add one", "# take one"),  # only in a comment
    ("    return x + 1  # add one\n", "    return x + 1  # take one\n"),  # the code is found, but only its comment changes
])
def test_an_edit_of_a_comment_or_docstring_is_refused(tmp_path, find, replace):
    with pytest.raises(CatalogueError) as err:
        _apply(tmp_path, find, replace)
    assert "01_demo/demo-bug" in str(err.value) and repr(find) in str(err.value)


@pytest.mark.parametrize("find, replace", [
    ("    return x + 1  # add one\n", "    return x - 1\n"),
    ("return x + 1", "return x + 2"),
    ("    return x + 1  # add one\n", "    return x + 1  # add one\n    x = 0\n"),  # code put in after a line
])
def test_an_edit_of_code_applies(tmp_path, find, replace):
    assert replace in _apply(tmp_path, find, replace)


def test_every_catalogued_bug_applies_and_edits_code():
    bugs = load_catalogue()
    assert bugs
    for bug in bugs:
        with bugged_tree(bug):  # raises CatalogueError naming the bug otherwise
            pass


def test_a_bugged_module_imports_beside_the_reference():
    (bug,) = [b for b in load_catalogue(labs=["04"]) if b.id == "post-norm"]
    before = dict(sys.modules)
    gpt = import_with_bug(bug, "gpt")
    block = gpt.TransformerBlock(12, 3, 20, rng=np.random.default_rng(1))
    x = np.random.default_rng(0).normal(size=(2, 5, 12)).astype(np.float32)
    h = block.ln_1(x + block.attn(x))
    np.testing.assert_allclose(block(x), block.ln_2(h + block.mlp(h)), rtol=1e-5, atol=1e-6)  # post-norm
    assert all(sys.modules.get(name) is before.get(name) for name in ("gpt", "layers", "causal_mask")), (
        "importing a bugged module must leave the reference modules in place")


def _collected(*paths: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--impl=solutions", "--collect-only", "-q", "-p", "no:randomly",
                           "-m", "not kit", *paths], cwd=KIT_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_the_lab_test_folders_hold_every_lab_test_in_the_students_order():
    """The catalogue runs each bug's `pytest -m labNN -x` over lab_test_paths only (as do
    `grader validate` and `grader tolerances`): that must select the same tests, in the same
    order, as a student's run over the whole of tests/."""
    whole = _collected()
    assert whole and all(lab_of(nodeid) for nodeid in whole)
    within = _collected(*lab_test_paths())
    assert within == whole, ("collecting lab_test_paths() is not collecting tests/: only in tests/ "
                             f"{sorted(set(whole) - set(within))[:5]}, only in the folders {sorted(set(within) - set(whole))[:5]}"
                             ", or another order")
    labs = sorted({lab_of(nodeid) for nodeid in whole})
    assert sorted(p for lab in labs for p in lab_test_paths([lab])) == sorted(lab_test_paths())
