"""pytest plugin used inside the sandbox as ``_grader_plugin``: per-test time limit,
and one result line per test, token first, on the grader's pipe."""

import json
import signal
import time

import pytest

_state = {"token": None, "out": None, "timeout": 10.0, "lab": "", "timeouts": 0}
MAX_TIMEOUTS = 3  # after this many tests hit the limit, the rest of the lab is not run


class TestTimeLimit(BaseException):
    """Raised in a test that runs past the per-test limit (a BaseException, so a
    student's ``except Exception`` cannot swallow it)."""


def configure(token, out, per_test_timeout, lab):
    _state.update(token=token, out=out, timeout=float(per_test_timeout), lab=lab)


def _emit(kind, **fields):
    out = _state["out"]
    if out is not None:
        out.write(_state["token"] + " " + json.dumps({"event": kind, **fields}) + "\n")
        out.flush()


def _on_alarm(signum, frame):
    raise TestTimeLimit(f"this test ran longer than the {_state['timeout']:g} s limit (an infinite loop, or far too slow)")


_reports = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _emit("test_start", nodeid=item.nodeid)
    _reports[item.nodeid] = {"outcome": "passed", "message": "", "duration": 0.0}
    start = time.monotonic()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, _state["timeout"])
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    rec = _reports.pop(item.nodeid)
    rec["duration"] = round(time.monotonic() - start, 4)
    _emit("test", nodeid=item.nodeid, **rec)
    if "TestTimeLimit" in rec["message"]:
        _state["timeouts"] += 1
        if _state["timeouts"] >= MAX_TIMEOUTS:
            _emit("lab_stopped", lab=_state["lab"], what=f"{MAX_TIMEOUTS} tests ran past the time limit")
            item.session.shouldstop = "too many tests ran past the time limit"


def pytest_runtest_logreport(report):
    rec = _reports.get(report.nodeid)
    if rec is None or rec["outcome"] != "passed":
        return  # keep the first problem
    if report.failed:
        rec["outcome"] = "failed" if report.when == "call" else "error"
        crash = getattr(report.longrepr, "reprcrash", None)
        rec["message"] = (crash.message if crash is not None else str(report.longrepr))[:2000]
    elif report.skipped:
        rec["outcome"] = "skipped"
        rec["message"] = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)[:500]
