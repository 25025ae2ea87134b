"""`grader validate`, the kit's check of itself, as part of the kit's test suite: stubs and
fixtures current, solutions pass every test, stubs fail every lab test with their
NotImplementedError, the student copy holds no solution text, and every catalogued
student bug is caught with a message that names its concept (the proof that the tests
have teeth). One run checks every lab; its report is the failure message."""

from grader import validate


def test_grader_validate_passes(pytestconfig):
    # Run after every lab test on the reference in the same session (`uv run pytest
    # --impl=solutions`), it reads their results rather than running them all again.
    sections = validate.run(jobs=2, solutions_results=validate.session_results(pytestconfig))
    report = validate.render(sections)
    print(report)
    assert all(s.ok for s in sections), "grader validate found problems:\n" + report


PROBE = '''import pytest


@pytest.fixture
def broken():
    raise RuntimeError("the set-up breaks")


def test_passes():
    assert True


def test_fails():
    assert 1 == 2, "one is not two"


def test_skips():
    pytest.skip("no torch here")


def test_errors(broken):
    pass


@pytest.mark.torch
def test_live_fails():
    raise ValueError("live differs")
'''

RECORDER = '''import json, os
from grader.validate import _result

REPORTS = {}


def pytest_runtest_logreport(report):
    REPORTS.setdefault(report.nodeid, []).append(report)


def pytest_sessionfinish(session):
    with open(os.environ["KIT_RECORDED"], "w") as f:
        json.dump([_result(n, r).to_dict() for n, r in REPORTS.items()], f)
'''


def test_a_sessions_reports_read_as_the_junit_report_says(tmp_path):
    """What `grader validate` reads from this session's reports (`session_results`) is what
    it reads from a run's JUnit report: outcome, first line of the message, live or not."""
    import json
    import os
    import subprocess
    import sys

    from grader.pytest_run import parse_junit

    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "test_probe.py").write_text(PROBE, encoding="utf-8")
    (tmp_path / "kit_recorder.py").write_text(RECORDER, encoding="utf-8")
    env = {**os.environ, "KIT_RECORDED": str(tmp_path / "recorded.json"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "kit_recorder", "-p",
                    "grader.pytest_run", f"--junitxml={tmp_path / 'junit.xml'}", "-o", "junit_family=xunit1",
                    "-o", "markers=torch", "test_probe.py"], cwd=tmp_path / "probe", env=env, capture_output=True,
                   text=True, timeout=300)
    junit = {r.nodeid.split("::")[-1]: r for r in parse_junit(tmp_path / "junit.xml")}
    recorded = {r["nodeid"].split("::")[-1]: r for r in json.loads((tmp_path / "recorded.json").read_text())}
    assert set(junit) == set(recorded) == {"test_passes", "test_fails", "test_skips", "test_errors", "test_live_fails"}
    for name, j in junit.items():
        r = recorded[name]
        assert (r["outcome"], r["live"], r["message"].splitlines()[:1]) == (j.outcome, j.live, j.message.splitlines()[:1]), \
            f"{name}: from the session {r}, from JUnit {j}"
