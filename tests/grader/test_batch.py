"""A batch: one result per student, written as each finishes; a killed batch resumes
without regrading anyone; the same submission always gets the same result; the class
outputs (CSV, stats, HTML) cover everyone."""

import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gptkit.testing.layout import KIT_ROOT

EXAMPLES = KIT_ROOT / "examples" / "submissions"


def _class_folder(tmp_path, n_copies=0):
    folder = tmp_path / "class"
    folder.mkdir()
    shutil.copytree(EXAMPLES / "alice", folder / "alice")
    for name in ("bob.zip", "carol.zip", "grace_typos.zip"):
        shutil.copy2(EXAMPLES / name, folder / name)
    (folder / "README.md").write_text("notes beside the submissions are not a submission")
    for i in range(n_copies):
        shutil.copytree(EXAMPLES / "alice", folder / f"alice{i}")
    (folder / "broken.zip").write_bytes(b"not a zip")
    return folder


def _grade_cmd(folder, out, *extra):
    return [sys.executable, "-m", "grader.cli", "grade", str(folder), "-o", str(out), "--labs", "01,02,03",
            "--jobs", "2", "--test-timeout", "5", *extra]


def test_batch_outputs_cover_every_student(tmp_path):
    folder = _class_folder(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(_grade_cmd(folder, out), cwd=KIT_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    assert [r["student"] for r in rows] == ["alice", "bob", "broken", "carol", "grace_typos"]
    by = {r["student"]: r for r in rows}
    assert by["alice"]["total"] == "30" and by["broken"]["total"] == "0"
    assert "not graded" in by["broken"]["flags"] and "missing" in by["bob"]["flags"].lower() + proc.stdout
    # Bob's lab 03 is not handed in: said once, and no lab of his is told another lost points.
    assert by["bob"]["flags"].count("not handed in") == 1 and "lost points" not in by["bob"]["flags"], by["bob"]
    # The status line moves as each lab ends, not only as each student does.
    assert all(f"alice: {lab} done" in proc.stderr for lab in ("01_causal_mask", "02_embeddings", "03_layernorm_ffn"))
    for student in by:
        d = out / "students" / student
        assert {"result.json", "feedback.md", "results.json"} <= {p.name for p in d.iterdir()}
        gs = json.loads((d / "results.json").read_text())
        assert isinstance(gs["score"], (int, float)) and isinstance(gs["tests"], list)
    html = (out / "report.html").read_text()
    assert "<svg" in html and "carol" in html and "<script" not in html
    stats = json.loads((out / "stats.json").read_text())
    assert stats["students"] == 5 and stats["graded"] == 4
    assert "not graded: broken" in proc.stdout and "student" in proc.stdout  # the summary table


def test_killed_batch_resumes_without_regrading(tmp_path):
    folder = _class_folder(tmp_path, n_copies=4)
    out = tmp_path / "out"
    proc = subprocess.Popen(_grade_cmd(folder, out), cwd=KIT_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    done = []
    while time.monotonic() < deadline and len(done) < 2:
        done = list((out / "students").glob("*/result.json")) if (out / "students").is_dir() else []
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9, mid-batch
    proc.wait()
    assert done, "no student finished before the kill"
    before = {p.parent.name: p.stat().st_mtime_ns for p in (out / "students").glob("*/result.json")}
    assert len(before) < 9, "the batch finished before it could be killed; the test proves nothing"
    for p in (out / "students").glob("*/result.json"):  # every written result is whole JSON
        json.loads(p.read_text())
    again = subprocess.run(_grade_cmd(folder, out), cwd=KIT_ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    after = {p.parent.name: p.stat().st_mtime_ns for p in (out / "students").glob("*/result.json")}
    assert len(after) == 9
    regraded = [s for s, t in before.items() if after[s] != t and s != "broken"]
    assert not regraded, f"students graded twice: {regraded}"


def test_the_kit_cache_holds_hypothesis_constants(grader):
    """Hypothesis draws with constants read from the kit's sources and caches them by the
    source's hash; the grader makes that cache once per kit and copies it into every
    submission's run. Should Hypothesis move it, grading stays right but slower: this
    test says so."""
    from grader.grade import HYPOTHESIS_CONSTANTS

    kit = grader.cache / "kit"
    cached = {p.name for p in (kit / HYPOTHESIS_CONSTANTS / "constants").glob("*")}
    sources = sorted(kit.glob("tests/**/*.py"))
    assert sources, "the cached kit holds no tests"
    missing = [str(p.relative_to(kit)) for p in sources
               if hashlib.sha1(p.read_bytes()).hexdigest()[:16] not in cached]
    assert not missing, (f"no Hypothesis constants cached for {missing[:3]} (of {len(sources)}): has Hypothesis "
                         f"changed where it keeps them? Grading re-reads the kit's sources for every submission")


def _verdicts(r):
    return {lab: [(t.nodeid, t.outcome, t.points, t.message) for t in lr.tests] for lab, lr in r.labs.items()}


@pytest.fixture(scope="module")
def carol(grader):
    """carol.zip graded on labs 01–03 by the shared grader (once for the module)."""
    return grader.grade("carol", EXAMPLES / "carol.zip")


def test_same_submission_same_result(grader, carol):
    a = carol
    b = grader.grade("b", EXAMPLES / "carol.zip")
    assert _verdicts(a) == _verdicts(b) and a.total == b.total
    assert 0 < a.total < 30


# Lab 01 that is slow everywhere (a fixed amount of pure-Python work in every softmax) and
# never finishes its self-attention: its verdicts sit near the time limit on purpose.
SLOW = "    _burn = sum(i * i for i in range(200_000))\n"
LOOP = "        while x is not None:\n            pass\n"
DOC = '        """x (B, T, D) → (out (B, T, D), weights (B, T, T)); token t sees tokens ≤ t."""\n'


def test_same_result_idle_and_under_load(grader, make_submission):
    """The per-test limit counts the lab code's CPU time, so three CPU-bound processes on this
    machine's cores change no verdict (a wall-clock limit would turn slow tests into timeouts)."""
    sub = make_submission(edits={"01_causal_mask/causal_mask.py": [
        ("    m = x.max(axis=axis, keepdims=True)\n", SLOW + "    m = x.max(axis=axis, keepdims=True)\n"),
        (DOC, DOC + LOOP)]})
    idle = grader.grade("idle", sub)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        loaded = grader.grade("loaded", sub)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert _verdicts(idle) == _verdicts(loaded)
    tests = idle.labs["01_causal_mask"].tests
    slow_passed = [t for t in tests if t.outcome == "passed" and "softmax" in t.nodeid]
    timed_out = [t for t in tests if "TestTimeLimit" in t.message]
    assert slow_passed and timed_out, "the submission must have both slow passing tests and timeouts"
    assert loaded.seconds > 0 and idle.labs["02_embeddings"].points == grader.rubric["02_embeddings"].points


def test_a_lab_past_its_time_limit_leaves_the_next_labs_their_points(reachable_tmp, make_submission):
    """One test process runs the labs in turn, each with its own wall-clock backstop. Lab 01
    waits 4 s in every causal_mask call (no CPU time: only the backstop sees it), so it runs
    past its 20 s: it gets nothing, and a new test process grades labs 02 and 03, which keep
    every point."""
    from grader.grade import Grader
    from grader.sandbox.runner import Limits

    from .conftest import reachable_dir

    g = Grader(reachable_dir(reachable_tmp, "out"), ["01", "02", "03"], log=lambda *_: None,
               limits=Limits(wall_seconds=300, lab_seconds=20, test_seconds=2, memory_mb=1024,
                             test_wall_backstop=60, lab_wall_backstop=20))
    (g.out_dir / ".scratch").mkdir(parents=True)
    g.prepare()
    sub = make_submission(edits={"01_causal_mask/causal_mask.py": [
        ("import math\n", "import math\nimport time\n")]})
    text = (sub / "labs" / "01_causal_mask" / "src" / "causal_mask.py").read_text()
    head, sep, body = text.partition('    """Which keys each query may attend to.\n')
    end = body.index('    """\n') + len('    """\n')
    (sub / "labs" / "01_causal_mask" / "src" / "causal_mask.py").write_text(
        head + sep + body[:end] + "    time.sleep(4)\n" + body[end:])
    r = g.grade("sleepy", sub)
    lab01 = r.labs["01_causal_mask"]
    assert lab01.points == 0 and all(t.outcome == "not run" for t in lab01.tests), \
        [(t.nodeid, t.outcome, t.message) for t in lab01.tests][:3]
    assert any("ran past 20 s" in f for f in lab01.flags), (lab01.flags, [(t.nodeid, t.outcome, t.message) for t in lab01.tests][:3])
    for lab in ("02_embeddings", "03_layernorm_ffn"):
        assert r.labs[lab].points == g.rubric[lab].points, [(t.nodeid, t.message) for t in r.labs[lab].tests
                                                           if t.outcome != "passed"][:3]


BURN = "    _burn = sum(i * i for i in range(1_000_000))\n"


def test_a_lab_past_its_cpu_budget_is_stopped(reachable_tmp, make_submission):
    """A lab's budget is CPU time, its lab code's and its tests' together, as the kernel
    counts it (load cannot change it). Every softmax of this lab 01 burns about 0.1 s, no
    test comes near its own limit, yet the lab's 3 s run out: the tests past that point are
    not run, the flag says why, and lab 02 keeps every point."""
    from grader.grade import Grader
    from grader.sandbox.runner import Limits

    from .conftest import reachable_dir

    g = Grader(reachable_dir(reachable_tmp, "cpu"), ["01", "02"], log=lambda *_: None,
               limits=Limits(wall_seconds=300, lab_seconds=3, test_seconds=60, memory_mb=1024))
    (g.out_dir / ".scratch").mkdir(parents=True)
    g.prepare()
    sub = make_submission(edits={"01_causal_mask/causal_mask.py": [
        ("    m = x.max(axis=axis, keepdims=True)\n", BURN + "    m = x.max(axis=axis, keepdims=True)\n")]})
    r = g.grade("burner", sub)
    lab01 = r.labs["01_causal_mask"]
    outcomes = [(t.nodeid, t.outcome, t.message) for t in lab01.tests]
    ran = [t for t in lab01.tests if t.outcome == "passed"]
    skipped = [t for t in lab01.tests if t.outcome == "not run"]
    assert ran and skipped, outcomes
    assert all("more than the lab's 3 s of CPU time" in t.message for t in skipped), outcomes
    assert not any("TestTimeLimit" in t.message for t in lab01.tests), outcomes
    assert any("stopped once they had used more than the lab's 3 s of CPU time" in f for f in lab01.flags), lab01.flags
    assert r.labs["02_embeddings"].points == g.rubric["02_embeddings"].points


def test_a_looping_function_costs_only_the_tests_that_call_it(reachable_tmp, make_submission):
    """softmax never returns. Each test that calls it fails on its own CPU-time limit, and
    no more: the lab is not stopped however many tests the loop costs, and the hidden mask
    tests, which run last and never call softmax, still run and pass (issue 37). The
    limits are CPU time: the verdicts do not depend on the load."""
    from grader.grade import Grader
    from grader.sandbox.runner import Limits

    from .conftest import reachable_dir

    g = Grader(reachable_dir(reachable_tmp, "loop"), ["01"], log=lambda *_: None,
               limits=Limits(wall_seconds=300, lab_seconds=5, test_seconds=1, memory_mb=1024))
    (g.out_dir / ".scratch").mkdir(parents=True)
    g.prepare()
    sub = make_submission(edits={"01_causal_mask/causal_mask.py": [
        ("    m = x.max(axis=axis, keepdims=True)\n", "    while True:\n        pass\n")]})
    lab01 = g.grade("looper", sub).labs["01_causal_mask"]
    outcomes = [(t.nodeid, t.outcome, t.message[:80]) for t in lab01.tests]
    assert not any(t.outcome == "not run" for t in lab01.tests), outcomes
    failed = [t for t in lab01.tests if t.outcome != "passed" and not t.hidden]  # (hidden: a concept, no message)
    assert len(failed) > 3 and all("TestTimeLimit" in t.message for t in failed), outcomes
    hidden_masks = [t for t in lab01.tests if "hidden" in t.nodeid and "test_mask_" in t.nodeid]
    assert len(hidden_masks) == 3 and all(t.outcome == "passed" for t in hidden_masks), outcomes
    assert not any("stopped" in f for f in lab01.flags) and any("time limit" in f for f in lab01.flags), lab01.flags


def test_submissions_side_by_side_get_cores_of_their_own():
    """With --jobs N and at least N cores, each slot's processes are pinned to their own
    cores (a test process and its lab process take turns, so one core each suffices and a
    request's answer never waits for a core the other submission holds); otherwise none."""
    from grader.grade import _share_cores

    cores = sorted(os.sched_getaffinity(0))
    assert _share_cores(1) == {}
    assert _share_cores(len(cores) + 1) == {}
    if len(cores) >= 2:
        shares = _share_cores(2)
        assert sorted(shares) == [0, 1] and all(shares.values())
        assert not shares[0] & shares[1] and shares[0] | shares[1] <= set(cores)


def test_carol_s_feedback_says_what_the_examples_readme_promises(carol, reachable_tmp):
    """examples/submissions/README.md quotes carol's feedback: each quoted phrase of her row
    is in what the grader writes for her (labs 01–03 with the shared grader, labs 04–05 with
    one of their own), and lab 05's feedback names lab 04 as an earlier lab to fix first."""
    from grader.grade import Grader
    from grader.outputs import feedback_markdown

    from .conftest import FAST, reachable_dir

    row = next(line for line in (EXAMPLES / "README.md").read_text().splitlines() if line.startswith("| `carol.zip`"))
    promised = [p for p in re.findall(r'"([^"]+)"', row.split("|")[3]) if p != "not handed in"]
    assert len(promised) >= 4, row
    later = Grader(reachable_dir(reachable_tmp, "grading-carol"), ["04", "05"], limits=FAST, log=lambda *_: None)
    (later.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
    later.prepare()
    early_result, later_result = carol, later.grade("carol", EXAMPLES / "carol.zip")
    feedback = feedback_markdown(early_result) + feedback_markdown(later_result)
    unsaid = [p for p in promised if p not in feedback]
    assert not unsaid, f"examples/submissions/README.md promises {unsaid} for carol; her feedback:\n{feedback[-4000:]}"
    lab05 = feedback_markdown(later_result).split("## 05_gpt2_weights", 1)[1]
    assert "your own 04_gpt_model, which lost points" in lab05, lab05[:1000]
    assert all(0 < lr.points < lr.max_points for lab, lr in {**early_result.labs, **later_result.labs}.items()
               if lab != "02_embeddings"), {lab: lr.points for lab, lr in later_result.labs.items()}
