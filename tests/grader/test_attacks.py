"""Each attack on the grader gets the right score (0 for what it breaks or fakes, full
credit for what it honestly does), a flag the instructor sees, and no effect on other
labs, other students or the grader."""

import os
import zipfile

import pytest

from gptkit.testing.layout import KIT_ROOT

SOFTMAX_LINE = "    m = x.max(axis=axis, keepdims=True)\n"
IMPORT_LINE = "import numpy as np\n"
CM = "01_causal_mask/causal_mask.py"
STUB = (KIT_ROOT / "labs" / "01_causal_mask" / "src" / "causal_mask.py").read_text()


def lab_points(result, lab):
    return result.labs[lab].points


def all_flags_text(result):
    return " | ".join(result.flags + [f for lr in result.labs.values() for f in lr.flags])



L1, L2, L3 = "01_causal_mask", "02_embeddings", "03_layernorm_ffn"


def grade(grader, path, student="s"):
    return grader.grade(student, path)


def assert_only_lab1_broken(r, full_marks, flag_words):
    assert r.labs[L1].points == 0, f"lab 01 should score 0, got {r.labs[L1].points}"
    assert r.labs[L2].points == full_marks[L2] and r.labs[L3].points == full_marks[L3], (
        "the honest labs must keep full credit", {k: v.points for k, v in r.labs.items()})
    text = all_flags_text(r).lower()
    assert any(w in text for w in flag_words), f"expected a flag naming {flag_words}, got: {text}"


def test_honest_submission_gets_full_marks(grader, make_submission, full_marks):
    r = grade(grader, make_submission())
    assert {k: v.points for k, v in r.labs.items()} == full_marks
    assert not all_flags_text(r)


@pytest.mark.parametrize("code,flag", [
    ("    while True:\n        pass\n", "time limit"),
    ("    hog = [np.ones((1024, 1024)) for _ in range(100000)]\n", "memory"),
    ("    for _ in range(10**6):\n        print('x' * 10**4)\n", "output limit"),
], ids=["infinite_loop", "memory_bomb", "huge_output"])
def test_runaway_code_is_stopped(grader, make_submission, full_marks, code, flag):
    """A lab that never ends, eats the memory or floods the output loses its credit, gets the
    flag for the limit it hit, and leaves the other labs' full credit alone."""
    r = grade(grader, make_submission(edits={CM: [(SOFTMAX_LINE, code + SOFTMAX_LINE)]}))
    assert r.labs[L1].points < full_marks[L1] / 2
    assert r.labs[L2].points == full_marks[L2] and r.labs[L3].points == full_marks[L3]
    assert flag in all_flags_text(r)


@pytest.mark.parametrize("code,words", [
    ("import os\nwhile True:\n    os.fork()\n", ["os.fork"]),
    ("import sys\nsys.exit(0)\n", ["sys.exit"]),
    ("import torch\n", ["torch"]),
    ("np.allclose = lambda *a, **k: True\n", ["monkeypatching"]),
    ("import numpy.testing\nnumpy.testing.assert_allclose = print\n", ["numpy.testing"]),
    ("class Same:\n    def __eq__(self, other):\n        return True\n", ["__eq__"]),
    ("exec('import os')\n", ["exec"]),
    ("x = open('/etc/passwd').read()\n", ["/etc/passwd"]),
    ("np.load('../kit/tests/01_causal_mask/fixtures/softmax.npz')\n", ["path of the kit"]),
    ("f = ().__class__.__base__.__subclasses__()\n", ["__subclasses__"]),
    ("from gptkit.testing import fixtures\n", ["gptkit.testing"]),
    ("import gc as g\nLIVE = g.get_objects()\n", ["imports `gc`"]),
    ("G = getattr(np.ones, '__globals__', None)\n", ["__globals__"]),
    ("import importlib\nM = importlib.import_module('tests')\n", ["importlib"]),
], ids=["fork_bomb", "sys_exit", "torch", "patch_numpy", "patch_testing", "fake_eq", "exec", "read_host",
        "read_fixture", "subclasses", "kit_testing", "gc", "globals", "importlib"])
def test_attacks_run_score_nothing_and_are_noted_for_review(grader, make_submission, full_marks, code, words):
    """The configuration instructors get: lab 01 left as the stub, plus an attack. The
    static review notes the attack for the instructor but stops nothing; the attack runs,
    and the sandbox alone keeps it from a point. Labs 02–03, honest, keep full credit."""
    sub = make_submission(extra={f"labs/{CM.replace('/', '/src/')}": STUB.replace(IMPORT_LINE, IMPORT_LINE + code, 1)})
    r = grade(grader, sub)
    assert_only_lab1_broken(r, full_marks, words)
    assert any(t.outcome != "not run" for t in r.labs[L1].tests) or "SystemExit" in r.labs[L1].tests[0].message, \
        "the review must not stop a file from running"
    assert any(f.startswith("for review: ") for f in r.labs[L1].flags), r.labs[L1].flags


def test_exit_at_import_without_imports(grader, make_submission, full_marks):
    sub = make_submission(edits={CM: [(IMPORT_LINE, IMPORT_LINE + "raise SystemExit(0)\n")]})
    r = grade(grader, sub)
    assert r.labs[L1].points == 0
    assert r.labs[L2].points == full_marks[L2] and r.labs[L3].points == full_marks[L3]
    assert "SystemExit" in r.labs[L1].tests[0].message


def test_submission_conftest_pytest_ini_and_edited_tests_are_ignored(grader, make_submission):
    stub = (grader.cache.parent.parent.parent / "x").parent  # noqa: F841 - placeholder for readability
    everything_passes = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                         "    out = yield\n    out.get_result().outcome = 'passed'\n")
    sub = make_submission(
        edits={CM: [(SOFTMAX_LINE, "    raise NotImplementedError\n" + SOFTMAX_LINE)]},
        extra={"conftest.py": everything_passes, "tests/conftest.py": everything_passes,
               "pytest.ini": "[pytest]\naddopts = -p no:terminal\n",
               "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-k nothing'\n",
               "tests/01_causal_mask/test_causal_mask.py": "def test_ok():\n    assert True\n"})
    r = grade(grader, sub)
    failing = [t for t in r.labs[L1].tests if t.outcome != "passed"]
    assert failing and all("NotImplementedError" in t.message or "softmax" in t.message or t.outcome != "passed"
                           for t in failing)
    assert r.labs[L1].points < 10


def test_generated_code_is_graded_normally(grader, make_submission, full_marks):
    """A helper of 5,000 generated terms (past the default recursion limit of both the static
    review and the compiler) is graded as any other code: every point, no grader error, no
    note of a failed review (issue 37). Its values are right: softmax uses it."""
    terms = " + ".join(f"x * {i % 7}" for i in range(5000))
    helper = f"def _generated(x):\n    return {terms}\n\n\n"
    check = "    assert _generated(1) == sum(i % 7 for i in range(5000))\n"
    r = grade(grader, make_submission(edits={CM: [(SOFTMAX_LINE, check + SOFTMAX_LINE),
                                                  ("def softmax(", helper + "def softmax(")]}))
    assert not r.error, r.error
    assert {k: v.points for k, v in r.labs.items()} == full_marks, [
        t.message[:200] for t in r.labs[L1].tests if t.outcome != "passed"][:2]
    assert "review could not" not in all_flags_text(r), all_flags_text(r)


def test_renamed_function_and_missing_file(grader, make_submission, full_marks):
    sub = make_submission(edits={"03_layernorm_ffn/layers.py": [("def gelu_exact(", "def gelu_erf(")]},
                          drop=["02_embeddings/embeddings.py"])
    r = grade(grader, sub)
    assert r.labs[L2].points == 0 and "missing" in all_flags_text(r) + r.labs[L2].tests[0].message
    renamed = [t for t in r.labs[L3].tests if "gelu_exact" in t.message]
    assert renamed and "renamed" in renamed[0].message
    assert 0 < r.labs[L3].points < full_marks[L3]
    assert r.labs[L1].points == full_marks[L1]


def test_syntax_error(grader, make_submission, full_marks):
    sub = make_submission(edits={CM: [(SOFTMAX_LINE, "    m = x.max(axis=axis, keepdims=True))\n")]})
    r = grade(grader, sub)
    assert r.labs[L1].points == 0 and "syntax error" in all_flags_text(r)
    assert "SyntaxError" in r.labs[L1].tests[0].message
    assert r.labs[L2].points == full_marks[L2]


# --- what the sandbox refuses, on honest code around it ------------------------------------

def test_sandbox_blocks_reading_the_kit_and_host(grader, make_submission):
    """Lab code that reads the solutions, the kit's tests or the host's files gets nothing
    (it would refuse to import if it did), and is otherwise honest: it keeps its points.
    What it was refused is its own error, not a flag (flags are the grader's own)."""
    code = ("def _peek(p):\n    try:\n        return open(p).read()\n    except Exception:\n        return None\n"
            f"LEAK = [_peek(p) for p in ('{os.path.abspath('solutions/01_causal_mask/causal_mask.py')}',"
            " '../kit/tests/01_causal_mask/test_causal_mask.py', '/etc/hostname')]\n"
            "if any(x is not None for x in LEAK):\n    raise RuntimeError(f'read {LEAK}')\n")
    sub = make_submission(edits={CM: [(IMPORT_LINE, IMPORT_LINE + code)]})
    r = grader.grade("s", sub)
    assert r.labs[L1].points == grader.rubric[L1].points, [t.message[:300] for t in r.labs[L1].tests][:2]
    assert "blocked" not in all_flags_text(r)


def test_sandbox_blocks_torch_processes_and_writing_outside(grader, make_submission, tmp_path):
    target = tmp_path / "gradebook.csv"
    code = ("def _try(f):\n    try:\n        f()\n    except BaseException as e:\n        return repr(e)\n"
            "import os, subprocess\n"
            "R = [_try(lambda: __import__('torch')), _try(lambda: os.fork()),\n"
            "     _try(lambda: subprocess.run(['true'])),\n"
            f"     _try(lambda: open({str(target)!r}, 'w').write('evil,100'))]\n")
    sub = make_submission(edits={CM: [(IMPORT_LINE, IMPORT_LINE + code)]})
    r = grader.grade("s", sub)
    text = all_flags_text(r)
    assert not target.exists(), "the sandbox let lab code write outside its scratch folder"
    assert "torch" in text and ("os.fork" in text or "subprocess" in text), text


def test_sandbox_os_exit_in_a_test_only_costs_that_lab(grader, make_submission, full_marks):
    sub = make_submission(edits={CM: [(IMPORT_LINE, IMPORT_LINE + "import os\n"),
                                      (SOFTMAX_LINE, "    os._exit(0)\n" + SOFTMAX_LINE)]})
    r = grader.grade("s", sub)
    assert r.labs[L1].points < full_marks[L1] / 2
    assert r.labs[L2].points == full_marks[L2] and r.labs[L3].points == full_marks[L3]
    assert "process ended" in all_flags_text(r), all_flags_text(r)


def test_sandbox_fake_equal_objects_score_nothing(grader, make_submission):
    code = ("class Same:\n    def __eq__(self, o):\n        return True\n    __array_priority__ = 1000\n")
    sub = make_submission(edits={CM: [(IMPORT_LINE, IMPORT_LINE + code),
                                      (SOFTMAX_LINE, "    return Same()\n" + SOFTMAX_LINE)]})
    r = grader.grade("s", sub)
    softmax_tests = [t for t in r.labs[L1].tests if "softmax" in t.nodeid]
    assert softmax_tests and all(t.outcome != "passed" for t in softmax_tests)


# --- zips ------------------------------------------------------------------------------------

def _zip(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            if mode:
                info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


def test_zip_with_traversal_absolute_paths_and_symlinks(grader, make_submission, tmp_path, full_marks):
    src = make_submission()
    members = [(f"kit/{p.relative_to(src)}", p.read_bytes(), 0) for p in sorted(src.rglob("*.py"))]
    members += [("../../evil.py", b"x = 1", 0), ("/tmp/abs_evil.py", b"x = 1", 0),
                ("kit/labs/03_layernorm_ffn/src/link.py", b"/etc/passwd", 0o120777)]
    z = _zip(tmp_path / "zipper.zip", members)
    r = grader.grade("zipper", z)
    assert not (tmp_path.parent / "evil.py").exists() and not os.path.exists("/tmp/abs_evil.py")
    assert {k: v.points for k, v in r.labs.items()} == full_marks
    text = all_flags_text(r)
    assert "unsafe path" in text and "symbolic link" in text


@pytest.mark.parametrize("kind", ["empty", "corrupt", "huge", "no lab files"])
def test_bad_zips_are_reported_not_graded(grader, tmp_path, kind):
    z = tmp_path / f"{kind}.zip"
    if kind == "empty":
        z.write_bytes(b"")
    elif kind == "corrupt":
        z.write_bytes(b"PK\x03\x04 this is not really a zip")
    elif kind == "huge":
        with open(z, "wb") as fh:
            fh.truncate(60 * 1024 * 1024)
    else:
        _zip(z, [("README.md", b"hello", 0)])
    r = grader.grade(kind, z)
    assert r.error and r.total == 0
    assert all(t.points == 0 for lr in r.labs.values() for t in lr.tests)


WORDED = ("\x1b[3A\x1b[2K\x1b]0;graded\x07\x1b]52;c;Y2F0IC9ldGMvcGFzc3dk\x07\u202e01 :latot\u202c "
          "<img src=x onerror=alert(1)> ![seen](http://example.invalid/pixel.png) [your grade](http://example.invalid)")


def test_a_message_lab_code_words_reaches_no_output_as_markup_or_escapes(grader, make_submission):
    """Lab code raises an error whose message holds terminal escape sequences (cursor
    moves over the score table, a window title, a clipboard write), a bidi override and
    markup (a tag, an image that a markdown viewer would load, a link): the printed
    summary, feedback.md, Gradescope's results and the class page carry none of the
    characters as they are, and the two pages none of the markup, only written out (the
    escape as \\u001b, the tag as &lt;img)."""
    from grader.outputs import class_stats, feedback_markdown, gradescope_json, report_html, summary_table

    raise_it = f"    raise ValueError({WORDED!r})\n"
    r = grade(grader, make_submission("worder", edits={CM: [(SOFTMAX_LINE, raise_it + SOFTMAX_LINE)]}))
    assert any("\\u001b[3A" in t.message or "\x1b[3A" in t.message for t in r.labs[L1].tests), (
        "the lab's message did not reach a test's record: the attack did not run as meant")
    stats = class_stats(list(r.labs), [r])
    outputs = {"summary": summary_table(list(r.labs), [r], stats), "feedback.md": feedback_markdown(r),
               "results.json": str(gradescope_json(r)), "report.html": report_html(list(r.labs), [r], stats)}
    for name, text in outputs.items():
        assert not any(c in text for c in "\x1b\x07\u202e\u202c"), f"{name} passes on a control or bidi character"
        if name in ("feedback.md", "report.html"):  # pages a viewer renders (the others are plain text)
            assert "<img src=x" not in text, f"{name} passes on the lab's tag"
        if name == "feedback.md":
            assert "](http" not in text, "feedback.md passes on the lab's link and image"
    assert "\\u001b[3A" in outputs["feedback.md"] and "&lt;img" in outputs["feedback.md"], (
        "feedback.md should still show what the message said, written out")
