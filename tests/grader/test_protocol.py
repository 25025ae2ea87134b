"""The grader's reading of the test process's events: one typed definition, anything
malformed dropped, a lab that reports a test twice or does not end cleanly gets nothing."""

from grader.sandbox import protocol
from grader.sandbox.runner import RawRun

TOKEN = "t0k"
LAB = "02_embeddings"


def test_round_trip_and_malformed_lines():
    event = protocol.TestResult(LAB, "tests/x.py::t", "passed", "", 0.5, 0.1)
    assert protocol.decode(protocol.encode(TOKEN, event).strip(), TOKEN) == event
    good = '{"event": "lab_start", "lab": "x"}'
    assert protocol.decode(f"{TOKEN} {good}", TOKEN) == protocol.LabStart("x")
    for bad in (f"other {good}", good, f"{TOKEN} not json", f"{TOKEN} [1]",
                f'{TOKEN} {{"event": "nope", "lab": "x"}}',
                f'{TOKEN} {{"event": "lab_start"}}',
                f'{TOKEN} {{"event": "lab_start", "lab": "x", "extra": 1}}',
                f'{TOKEN} {{"event": "lab_end", "lab": "x", "exit": "0", "signal": 0}}',
                f'{TOKEN} {{"event": "test", "lab": "x", "nodeid": "n", "outcome": "great", "message": "",'
                ' "duration": 0, "cpu": 0}'):
        assert protocol.decode(bad, TOKEN) is None, bad


def _run(grader, events):
    raw = RawRun(events=events)
    from grader.grade import StudentResult
    res = StudentResult("s", "src")
    grader._score(res, raw, {})
    return res.labs[LAB]


def _honest(grader):
    nodeids = grader.graded_tests[LAB]
    return [protocol.LabStart(LAB)] + [protocol.TestResult(LAB, n, "passed", "", 0.0, 0.0) for n in nodeids]


def test_clean_run_scores(grader):
    lr = _run(grader, _honest(grader) + [protocol.LabEnd(LAB, 0, 0)])
    assert lr.points == grader.rubric[LAB].points


def test_duplicate_result_voids_the_lab(grader):
    events = _honest(grader)
    events.insert(2, protocol.TestResult(LAB, events[1].nodeid, "passed", "", 0.0, 0.0))
    lr = _run(grader, events + [protocol.LabEnd(LAB, 0, 0)])
    assert lr.points == 0 and any("twice" in f or "inconsistent" in f for f in lr.flags)


def test_unclean_end_voids_the_lab(grader):
    for end in ([], [protocol.LabEnd(LAB, 3, 0)], [protocol.LabEnd(LAB, -1, 9)], [protocol.LabEnd(LAB, 2, 0)],
                [protocol.LabCrash(LAB, "boom"), protocol.LabEnd(LAB, 0, 0)],
                [protocol.LabTimeout(LAB, 60.0)]):
        lr = _run(grader, _honest(grader) + end)
        assert lr.points == 0 and all(t.outcome == "not run" for t in lr.tests), end
    stopped = _run(grader, _honest(grader) + [protocol.LabStopped(LAB, "3 tests ran past the time limit"),
                                               protocol.LabEnd(LAB, 2, 0)])
    assert stopped.points == grader.rubric[LAB].points  # the test process stopped itself: its results stand
