"""The stubs are generated from the solutions and must never drift from them."""

import pytest

from gptkit.testing.layout import KIT_ROOT
from grader.stubs import StubError, make_stub, stale_stubs


def test_stubs_are_current():
    stale = [str(p.relative_to(KIT_ROOT)) for p in stale_stubs()]
    assert not stale, f"stubs out of date with their solutions: {stale}; run `uv run grader stubs`"


def test_stub_replaces_marked_block_with_named_error():
    src = (
        "def f(x):\n"
        "    \"\"\"Doc.\"\"\"\n"
        "    x = check(x)\n"
        "    ### BEGIN SOLUTION add one\n"
        "    return x + 1\n"
        "    ### END SOLUTION\n"
    )
    stub = make_stub(src, "07")
    assert "return x + 1" not in stub
    assert "x = check(x)" in stub and '"""Doc."""' in stub
    assert "    # YOUR CODE HERE\n    raise NotImplementedError('Lab 07 · f: add one')\n" in stub


def test_stub_tells_the_student_what_to_do_first():
    """A stub's first line says one thing: fill in the blocks here. It names no solution
    file (the student copy has none) and no other file to edit."""
    stub = make_stub("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n", "02",
                     "solutions/02_x/x.py")
    first = stub.splitlines()[0]
    assert first == "# Lab 02: fill in each `# YOUR CODE HERE` block in this file, then run `uv run pytest -m lab02`."
    assert stub.splitlines()[1] == "def f():"


def test_no_stub_sends_the_student_elsewhere():
    for path in sorted((KIT_ROOT / "labs").glob("*/src/*.py")):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert "solutions" not in first and "YOUR CODE HERE" in first and "this file" in first, (
            f"{path.relative_to(KIT_ROOT)} starts {first!r}: regenerate with `uv run grader stubs`")


def test_stub_names_method_and_default_task():
    src = "class A:\n    def g(self):\n        ### BEGIN SOLUTION\n        return 1\n        ### END SOLUTION\n"
    assert "raise NotImplementedError('Lab 03 · A.g: implement A.g')" in make_stub(src, "03")


@pytest.mark.parametrize("src", [
    "def f():\n    ### BEGIN SOLUTION\n    return 1\n",
    "def f():\n    return 1\n    ### END SOLUTION\n",
    "def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    ### END SOLUTION\n",
])
def test_unbalanced_markers_are_errors(src):
    with pytest.raises(StubError):
        make_stub(src, "01")


def test_a_stub_failure_is_one_line_naming_the_task_and_its_place():
    """The first red run: each test that meets an unfinished task reports the task's
    message and the stub line that raised it, not a traceback through the test."""
    import re
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "pytest", "--impl=labs", "-m", "lab01", "-q", "-p", "no:randomly",
                          "tests/01_causal_mask/test_causal_mask.py", "-k", "softmax"],
                         cwd=KIT_ROOT, capture_output=True, text=True, timeout=300)
    out = run.stdout
    assert run.returncode == 1 and " failed" in out, out[-2000:]
    body = out.split("= FAILURES =", 1)[1].split("short test summary", 1)[0]
    lines = [line for line in body.splitlines() if line.strip() and not line.startswith(("_", "="))]
    assert lines, out[-2000:]
    for line in lines:
        assert re.fullmatch(r"labs/01_causal_mask/src/causal_mask\.py:\d+: NotImplementedError: Lab 01 · \w+: .+",
                            line), f"not a one-line task report: {line!r}"


def test_a_lab_run_does_not_report_the_kit_s_own_skips(tmp_path):
    """`uv run pytest -m lab01` without the similarity extra: the similarity tests skip
    themselves while collected, and a student doing lab 01 sees no line about it (with no
    lab marker, the skip is reported as usual)."""
    import os
    import subprocess
    import sys

    (tmp_path / "copydetect").mkdir()
    (tmp_path / "copydetect" / "__init__.py").write_text(
        'raise ModuleNotFoundError("not installed, for this test", name="copydetect")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def collect(*marker):
        run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *marker,
                              "tests/01_causal_mask", "tests/grader/test_similarity.py"],
                             cwd=KIT_ROOT, capture_output=True, text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        return run.stdout

    assert "similarity" in collect(), "without a marker the similarity module's skip should be reported"
    out = collect("-m", "lab01")
    assert "SKIPPED" not in out and "similarity" not in out, out[-2000:]
