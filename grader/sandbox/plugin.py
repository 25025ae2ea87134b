"""pytest plugin of the grader's test process (``_grader_plugin``): per-test CPU budget of
the lab code, one result event per test on the grader's pipe, and the labs in turn.

The lab code runs in another process (``gptkit.testing.remote``); this process runs only
the kit's tests, so what it reports is what the tests decided. One session runs the tests
of several labs, lab after lab: at a lab's first test the plugin ends the lab before
(its lab process too) and makes the new lab's process the one ``lab()`` reaches.

Each lab's hidden tests run after all its public tests, in a fresh lab process with a
fresh scratch folder: nothing a hidden test passed to lab code can reach a public test's
message. What the plugin reports about time comes from its own measures (the kernel's
CPU count of the lab process and of this one, its own clock), never from a message's text.
The limits that decide are CPU time, so a verdict is the same on an idle machine and a busy
one; the wall-clock limits are backstops for code that waits.

Each test has a CPU-time limit of its own inside its lab's budget: ``budget`` seconds
until a test of the lab runs past its limit; from then on, each test may use at most its
equal share of what is left of the lab's budget (what is left over the tests not yet run),
so that what is left never runs out before the lab's last test. A function that loops
costs each test that calls it its limit, and no more: the tests that never call it still
run, the hidden ones included. Honest code, which never reaches a limit, meets the same
limits as before.
"""

import os
import signal
import time
from pathlib import Path

import _grader_protocol as protocol
import pytest

from gptkit.testing import remote
from gptkit.testing.layout import lab_of

_state = {"emit": None, "budget": 10.0, "wall": 60.0, "labs": [], "note": None, "enter": None,
          "lab_budget": 120.0, "lab": None, "timeouts": 0, "lab_cpu": 0.0, "failed": False, "stopped": set(),
          "done": set(), "hidden": False, "alarm": False, "counts": {}, "left": 0, "squeezed": False}
HIDDEN = "tests/hidden/"
# A failed test that used this much of its limit ran into it: the lab process stops its
# code at the limit by its own clock, and the kernel's count that this process reads can
# show less (ticks, and the moment it is read); the message must not depend on which.
CPU_NEAR = 0.9
TIME_LIMIT_RAISED = f"{remote.TestTimeLimit.__module__}.TestTimeLimit: "  # how pytest shows the lab's stop
MIN_TEST_SECONDS = 0.05  # no test's limit is below this


def configure(emit, budget, wall, labs, note, enter, lab_budget=120.0):
    """``labs`` in the order their tests run; ``note(what, lab)`` tells the parent process
    that a lab starts or ends; ``enter(lab)`` makes the lab's process the active one.
    ``budget``: CPU seconds of lab code per test; ``lab_budget``: CPU seconds of a lab's
    tests in all (its lab code's and this process's own), past which the rest of the lab is
    not run; ``wall``: a test's backstop in seconds for lab code that waits."""
    _state.update(emit=emit, budget=float(budget), wall=float(wall), labs=list(labs), note=note, enter=enter,
                  lab_budget=float(lab_budget))


def current_lab():
    return _state["lab"]


def _handoff(config, lab, phase):
    """pytest's ``tmp_path`` from here on: the lab's hand-off folder for this phase, which
    its lab process sees at the same path (a checkpoint a test writes for lab code to load,
    one lab code writes for the test to read), and no other lab process sees."""
    root = os.environ.get("GRADER_HANDOFF")
    factory = getattr(config, "_tmp_path_factory", None)
    if root and factory is not None and lab:
        factory._basetemp = Path(root) / lab / phase


def _passable_tmp_paths():
    """pytest makes each ``tmp_path`` mode 0700; the lab process is another user, and must
    read what the test put there and write what the test reads back."""
    from _pytest.tmpdir import TempPathFactory

    made = TempPathFactory.mktemp
    if getattr(made, "_grader", False):
        return

    def mktemp(self, basename, numbered=True):
        path = made(self, basename, numbered)
        if os.environ.get("GRADER_HANDOFF"):
            path.chmod(0o777)
        return path

    mktemp._grader = True
    TempPathFactory.mktemp = mktemp


_passable_tmp_paths()


def _switch(lab):
    if lab == _state["lab"]:
        return
    _finish()
    _state.update(lab=lab, timeouts=0, lab_cpu=0.0, failed=False, hidden=False,
                  left=max(1, _state["counts"].get(lab, 1)), squeezed=False)
    _handoff(_state.get("config"), lab, "public")
    _state["note"]("start", lab)
    _state["emit"](protocol.LabStart(lab))
    _state["enter"](lab)


def _finish():
    """The current lab is over: its lab process ends, its end is reported."""
    lab = _state["lab"]
    if lab is None:
        return
    r = remote.active()
    if r is not None:
        r.close()
    # pytest's own codes: 0 all passed, 1 some failed, 2 stopped early.
    code = 2 if lab in _state["stopped"] else 1 if _state["failed"] else 0
    _state["emit"](protocol.LabEnd(lab, code, 0))
    _state["note"]("end", lab)
    _state["done"].add(lab)
    _state["lab"] = None


def _on_alarm(signum, frame):
    _state["alarm"] = True
    raise remote.TestTimeLimit(f"this test ran longer than the {_state['wall']:g} s backstop")


_reports = {}


def pytest_collection_modifyitems(session, config, items):
    """Lab after lab, in the order given; in each lab its public tests, then its hidden ones."""
    _state["config"] = config
    order = {lab: i for i, lab in enumerate(_state["labs"])}
    items.sort(key=lambda item: (order.get(lab_of(item.nodeid), len(order)), item.nodeid.startswith(HIDDEN)))


def pytest_collection_finish(session):
    """How many tests each lab runs (after deselection): see ``_test_limit``."""
    counts = {}
    for item in session.items:
        lab = lab_of(item.nodeid)
        counts[lab] = counts.get(lab, 0) + 1
    _state["counts"] = counts


def _test_limit() -> float:
    """The current test's limit, in CPU seconds of lab code: the per-test budget; once a
    test of the lab has run past its limit, at most an equal share of what is left of the
    lab's budget among the tests not yet run (this one included). A tenth of the lab's
    budget is kept back for what the shares do not count: this process's own CPU time, and
    how far past its limit a test gets before it is stopped."""
    if not _state["squeezed"]:
        return _state["budget"]
    left = _state["lab_budget"] * CPU_NEAR - _state["lab_cpu"]
    return max(MIN_TEST_SECONDS, min(_state["budget"], left / max(1, _state["left"])))


def _enter_hidden(lab):
    """The lab's first hidden test: its lab process so far (and its scratch folder) ends;
    the hidden tests get a fresh one, which no public test reaches afterwards."""
    _state["hidden"] = True
    _handoff(_state.get("config"), lab, "hidden")
    r = remote.active()
    if r is not None:
        r.fresh()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if lab_of(item.nodeid) in _state["stopped"]:
        pytest.skip("the lab's tests were stopped")  # not run, and not reported


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    lab = lab_of(item.nodeid)
    _switch(lab)
    if lab in _state["stopped"]:
        yield
        return
    if item.nodeid.startswith(HIDDEN) and not _state["hidden"]:
        _enter_hidden(lab)
    emit = _state["emit"]
    r = remote.active()
    budget = _test_limit()
    r.budget = budget
    emit(protocol.TestStart(lab, item.nodeid))
    _reports[item.nodeid] = {"outcome": "passed", "message": ""}
    r.begin_test()
    _state["alarm"] = False
    start, own = time.monotonic(), _own_cpu()
    # A backstop only: the budget that decides is CPU time, counted in remote.py.
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, _state["wall"] * 3)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    rec = _reports.pop(item.nodeid)
    cpu = r.end_test()
    seconds = time.monotonic() - start
    _state["lab_cpu"] += cpu + (_own_cpu() - own)
    # Past the limit by this process's own measures (whatever the lab code's messages say):
    # the lab process's CPU time as the kernel counts it, or no answer for the backstop.
    _state["left"] -= 1
    over_cpu = cpu > budget or (rec["outcome"] != "passed" and cpu >= budget * CPU_NEAR)
    # The lab process stopped its code at the limit by its own clock (which the kernel's
    # count read here may show a little below it): the same verdict and message either way.
    # (Lab code that raises this itself only fails its own test with a time-limit message;
    # the flags count the kernel's measure alone.)
    stopped_itself = rec["outcome"] != "passed" and rec["message"].startswith(TIME_LIMIT_RAISED)
    timed_out = over_cpu or stopped_itself or r.late or _state["alarm"]
    over_cpu = over_cpu or stopped_itself
    if timed_out:
        # The message names the limit, not the measure: how far past it a process got before
        # it was stopped depends on the load, and the verdict must not.
        # (A limit cut below the per-test budget is not given in seconds: it follows from
        # the tests before, and the text must be the same whatever the load.)
        what = (f"waited longer than the {_state['wall']:g} s backstop for the lab code" if not over_cpu else
                f"used more than the {budget:g} s of CPU time allowed in the lab code" if budget >= _state["budget"]
                else f"used more than its share of what was left of the lab's {_state['lab_budget']:g} s of "
                     "CPU time (a test before it ran past its limit)")
        rec = {"outcome": "failed", "message": f"TestTimeLimit: this test {what}"}
    emit(protocol.TestResult(lab, item.nodeid, rec["outcome"], rec["message"], round(seconds, 4), round(cpu, 4),
                             round(budget, 4)))
    _state["failed"] = _state["failed"] or rec["outcome"] != "passed"
    if timed_out:
        _state["timeouts"] += 1
        _state["squeezed"] = True
    if lab in _state["stopped"]:
        return
    if _state["lab_cpu"] > _state["lab_budget"] and _state["left"] > 0:
        emit(protocol.LabStopped(lab, f"they had used more than the lab's {_state['lab_budget']:g} s of CPU time"))
        _state["stopped"].add(lab)


def _own_cpu() -> float:
    """This process's CPU seconds (user and system), as the kernel counts them."""
    t = os.times()
    return t.user + t.system


def pytest_sessionfinish(session, exitstatus):
    _finish()
    if exitstatus not in (0, 1, 5):
        return  # pytest itself stopped: the parent process runs the labs not done again
    for lab in _state["labs"]:  # a lab none of whose tests ran (none collected): pytest's code 5
        if lab not in _state["done"]:
            _state["emit"](protocol.LabStart(lab))
            _state["emit"](protocol.LabEnd(lab, 5, 0))
            _state["note"]("end", lab)
            _state["done"].add(lab)


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
