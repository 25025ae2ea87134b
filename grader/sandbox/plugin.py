"""pytest plugin of the grader's test process (``_grader_plugin``): per-test CPU budget of
the lab code, and one result event per test on the grader's pipe.

The lab code runs in another process (``gptkit.testing.remote``); this process runs only
the kit's tests, so what it reports is what the tests decided.
"""

import signal
import time

import _grader_protocol as protocol
import pytest

from gptkit.testing import remote

_state = {"emit": None, "budget": 10.0, "wall": 60.0, "lab": "", "timeouts": 0}
MAX_TIMEOUTS = 3  # after this many tests hit the limit, the rest of the lab is not run


def configure(emit, budget, wall, lab):
    _state.update(emit=emit, budget=float(budget), wall=float(wall), lab=lab)


def _on_alarm(signum, frame):
    raise remote.TestTimeLimit(f"this test ran longer than the {_state['wall']:g} s backstop")


_reports = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    emit, lab = _state["emit"], _state["lab"]
    r = remote.active()
    emit(protocol.TestStart(lab, item.nodeid))
    _reports[item.nodeid] = {"outcome": "passed", "message": ""}
    r.begin_test()
    start = time.monotonic()
    # A backstop only: the budget that decides is CPU time, counted in remote.py.
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, _state["wall"] * 3)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    rec = _reports.pop(item.nodeid)
    cpu = r.end_test()
    if cpu > _state["budget"] and "TestTimeLimit" not in rec["message"]:
        rec = {"outcome": "failed", "message": f"TestTimeLimit: this test used {cpu:.1f} s of CPU time in the lab "
                                               f"code, more than the {_state['budget']:g} s allowed"}
    for what in r.take_blocked():
        emit(protocol.Blocked(lab, what))
    emit(protocol.TestResult(lab, item.nodeid, rec["outcome"], rec["message"],
                             round(time.monotonic() - start, 4), round(cpu, 4)))
    if "TestTimeLimit" in rec["message"]:
        _state["timeouts"] += 1
        if _state["timeouts"] >= MAX_TIMEOUTS:
            emit(protocol.LabStopped(lab, f"{MAX_TIMEOUTS} tests ran past the time limit"))
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
