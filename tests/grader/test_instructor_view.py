"""What an instructor reads while and after grading: a status line that moves lab by lab,
a lab not handed in said once (and never blamed for a later lab it does not feed), the
total at the end of `grader check`, a release that never asks to overwrite work, and a
class summary that says what its percentages are."""

import io
import shutil
import subprocess
import sys
import threading
import time

from gptkit.testing.layout import KIT_ROOT
from grader.check import render
from grader.grade import LabResult, StudentResult, TestRecord
from grader.outputs import class_stats, failure_kind, feedback_markdown, gradebook_csv, summary_table
from grader.submission import expected_files

L1, L2 = "01_causal_mask", "02_embeddings"
ALICE = KIT_ROOT / "examples" / "submissions" / "alice"


def _lab(lab, points, max_points, tests=None):
    return LabResult(lab, points, max_points, [], tests or [TestRecord(f"tests/{lab}/test_x.py::test_a", lab, False,
                                                                     "passed" if points else "failed", points,
                                                                     max_points, "", 0.0)])


def test_lab_progress_comes_from_the_logs_the_sandbox_opens(tmp_path):
    """A lab starts when its log appears in slogs/ and is over once a later lab's does, and
    every lab once the run ends; the status line counts labs, so it moves inside one
    student's run, and names the lab running and for how long."""
    from grader.progress import Progress, watch_labs

    done, started, seen = [], [], threading.Event()

    def on_lab(lab, over):
        (done if over else started).append(lab)
        seen.set()

    labs = ["01_a", "02_b", "03_c"]
    with watch_labs(tmp_path, labs, on_lab, poll=0.01):
        (tmp_path / ".zygote.txt").write_text("")
        (tmp_path / "01_a.txt").write_text("")
        (tmp_path / "03_c.txt").write_text("")  # lab 02 never started a lab process
        deadline = time.monotonic() + 30
        while "03_c" not in started and time.monotonic() < deadline:
            seen.wait(0.05)
        assert done == ["01_a", "02_b"] and started[-1] == "03_c", (done, started)
    assert done == labs

    out, now = io.StringIO(), [0.0]
    p = Progress(2, 3, stream=out, clock=lambda: now[0])
    p.lab("alice", "01_a", over=False)
    now[0] = 151
    p.tick()
    p.lab("alice", "01_a")
    r = StudentResult("alice", "x", total=5, max_total=30)
    p.update(r, reused=False)
    p.lab("bob", "01_a")
    lines = out.getvalue().splitlines()
    assert "0/2 students, 0/6 labs" in lines[0] and "running alice: 01_a 2:31" in lines[0], lines
    assert "0/2 students, 1/6 labs" in lines[1] and "alice: 01_a done" in lines[1]
    assert "1/2 students, 3/6 labs" in lines[2] and "alice: 5.00/30" in lines[2]
    assert "1/2 students, 4/6 labs" in lines[3], lines


def test_a_lab_not_handed_in_is_said_once_and_blames_no_lab_it_does_not_feed():
    """Lab 08 (Llama) uses labs 01-06, never lab 07; lab 11 uses lab 07. A student without
    lab 07 reads "not handed in" once, lab 08's note names lab 06 only, and lab 11's names
    what it uses."""
    from grader import handin

    wanted = expected_files()
    labs = sorted(wanted)
    kit = handin.kit_uses(KIT_ROOT / "solutions", KIT_ROOT / "tests", KIT_ROOT / "tests" / "hidden", labs)
    deps = handin.depends_on(kit, {m: lab for lab, mods in wanted.items() for m in mods}, {})
    by_number = {lab[:2]: lab for lab in labs}
    l06, l07, l08, l11 = (by_number[n] for n in ("06", "07", "08", "11"))
    assert l07 not in deps[l08] and l06 in deps[l08] and l07 in deps[l11]

    r = StudentResult("sam", "x", flags=[f"{handin.NOT_HANDED_IN} (files missing): {l07}"])
    r.labs = {l06: _lab(l06, 5, 20), l07: _lab(l07, 0, 20), l08: _lab(l08, 10, 20), l11: _lab(l11, 3, 20)}
    handin.dependency_notes(r, deps, {l07})
    assert not r.labs[l07].flags
    assert len(r.labs[l08].flags) == 1 and l06 in r.labs[l08].flags[0] and l07 not in r.labs[l08].flags[0]
    assert any(l07 in f and "lost points" not in f for f in r.labs[l11].flags)
    assert not any(l07 in f and "lost points" in f for lr in r.labs.values() for f in lr.flags)
    row = gradebook_csv(labs, [r]).splitlines()[1]
    assert row.count(handin.NOT_HANDED_IN) == 1, row

    # Its own student's files import an earlier lab: that counts too.
    own = handin.depends_on(kit, {m: lab for lab, mods in wanted.items() for m in mods},
                            {l08: {"llama.py": b"import numpy\nfrom training import train_step\n"}})
    assert l07 in own[l08]


def test_an_unchanged_stub_is_not_handed_in_and_not_run(two_lab_grader, tmp_path):
    """A whole copy handed in with lab 01 left as the stub and lab 02 absent: nothing runs,
    the flags say "not handed in" once per lab, and no lab is said to lose points of another."""
    not_handed_in = "not handed in"
    stub = (KIT_ROOT / "labs" / L1 / "src" / "causal_mask.py").read_bytes()
    sub = tmp_path / "sam" / "labs" / L1 / "src"
    sub.mkdir(parents=True)
    (sub / "causal_mask.py").write_bytes(stub.replace(b"\n", b"\r\n"))  # as a Windows checkout writes it
    r = two_lab_grader.grade("sam", tmp_path / "sam")
    assert r.total == 0 and not r.error
    assert [t.outcome for lr in r.labs.values() for t in lr.tests] == ["not run"] * sum(
        len(lr.tests) for lr in r.labs.values())
    assert "is the stub as given, unchanged" in r.labs[L1].tests[0].message
    assert "missing" in r.labs[L2].tests[0].message
    flags = [*r.flags, *(f for lr in r.labs.values() for f in lr.flags)]
    assert sum(not_handed_in in f for f in flags) == 2 and not any("lost points" in f for f in flags), flags
    feedback = feedback_markdown(r)
    for lr in r.labs.values():
        assert f"None of its {len(lr.tests)} tests ran: not handed in" in feedback, feedback


def test_grader_check_ends_with_the_points_per_lab_and_the_total():
    r = StudentResult("you", "x", total=10, max_total=25.5)
    r.labs = {L1: _lab(L1, 10, 10), L2: _lab(L2, 0, 15.5)}
    last = render(r, isolation="bwrap", hidden=False).splitlines()[-1]
    assert last == "points: 01 10/10, 02 0/15.5; total 10 / 25.5", last


def test_the_class_summary_says_what_its_percentages_are():
    bad = TestRecord(f"tests/{L1}/test_x.py::test_b", L1, False, "failed", 0, 5,
                     "AssertionError: softmax sums: expected 1.0, got 0.73125 (atol=1e-05, rtol=0.0001)", 0.0)
    good = TestRecord(f"tests/{L1}/test_x.py::test_b", L1, False, "passed", 5, 5, "", 0.0)
    a, b = StudentResult("a", "x"), StudentResult("b", "x")
    a.labs = {L1: LabResult(L1, 0, 5, [], [bad])}
    b.labs = {L1: LabResult(L1, 5, 5, [], [good])}
    text = summary_table([L1], [a, b], class_stats([L1], [a, b]))
    assert "share of those students who passed each: test_b 50%" in text, text
    assert "(atol=1e-05, rtol=0.0001)" in text and "#" not in text, text
    assert failure_kind(bad.message) == "softmax sums: expected …, got … (atol=1e-05, rtol=0.0001)"
    carol = ("AssertionError: LayerNorm(x): Your result matches the unbiased variance (divided by D-1). 80 of 80 "
             "elements differ (atol=1e-05, rtol=0.0001); largest difference 0.0123 at index (1, 2)")
    assert failure_kind(carol) == "LayerNorm(x): wrong values (matches the unbiased variance (divided by D-1))"


def test_release_in_a_copy_with_work_in_a_lab_leaves_it_and_says_so(tmp_path):
    """A kit copy where someone filled in lab 01: the release holds the stub that
    solutions/ generates, names the file and how it differs, and leaves the work alone
    (it used to refuse and advise `grader stubs`, which overwrites that work)."""
    copy = tmp_path / "kit"
    shutil.copytree(KIT_ROOT, copy, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", ".pytest_cache", ".hypothesis", ".grader-check", "grading"))
    work = (ALICE / "labs" / L1 / "src" / "causal_mask.py").read_text()
    (copy / "labs" / L1 / "src" / "causal_mask.py").write_text(work)
    proc = subprocess.run([sys.executable, "-m", "grader.cli", "release", str(tmp_path / "out")], cwd=copy,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"labs/{L1}/src/causal_mask.py:" in out and "filled in" in out, out
    assert "grader stubs" not in out, out
    assert (copy / "labs" / L1 / "src" / "causal_mask.py").read_text() == work
    released = (tmp_path / "out" / "labs" / L1 / "src" / "causal_mask.py").read_text()
    assert released == (KIT_ROOT / "labs" / L1 / "src" / "causal_mask.py").read_text()
