"""The one switch between the student's code and the reference code.

    uv run pytest                       # tests labs/*/src   (the student's code)
    uv run pytest --impl=solutions      # tests solutions/*  (the reference)
    uv run pytest --impl=PATH           # tests any tree laid out like either

Each test folder ``tests/NN_name/`` belongs to lab NN and gets the marker ``labNN``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from _pytest._code.code import ReprFileLocation
from _pytest.reports import CollectReport, TestReport
from hypothesis import HealthCheck, Phase, settings

from gptkit.testing import loader, remote
from gptkit.testing.layout import LAB_DIR_RE, bind_tree, concept_tests_first, lab_of, resolve_impl

# Same examples every run: a grade must not depend on the day's random draw. No
# shrinking: a failing property reports the first failing example at once, so a stub's
# NotImplementedError (or a wrong result) costs one example, not hundreds of shrink
# steps, and a failing test cannot spend its time limit shrinking.
settings.register_profile(
    "kit", derandomize=True, deadline=None, max_examples=25,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("kit")


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        default="labs",
        help="code under test: 'labs' (student code, default), 'solutions', or a path to a tree of NN_name folders",
    )


class LabRun:
    """The reports of this session's lab tests, node id → [setup, call, teardown]:
    tests/kit/test_validate.py runs after them and, where they are every lab test on the
    reference, gives them to `grader validate` instead of running them all a second time."""

    def __init__(self):
        self.reports: dict[str, list[TestReport]] = {}

    def pytest_runtest_logreport(self, report):
        if lab_of(report.nodeid):
            self.reports.setdefault(report.nodeid, []).append(report)


def pytest_configure(config):
    if remote.active() is not None:  # graded: the lab code lives in another process
        config._kit_impl_root = "the grader's lab process"
        return
    root = resolve_impl(config.getoption("--impl"))
    try:
        bind_tree(root)
    except ValueError as exc:
        raise pytest.UsageError(f"--impl={config.getoption('--impl')}: {exc}") from None
    loader.set_root(root)
    config._kit_impl_root = root
    config._kit_lab_run = LabRun()
    config.pluginmanager.register(config._kit_lab_run, "kit-lab-run")


def pytest_report_header(config):
    return f"code under test: {config._kit_impl_root}"


def _only_labs(markexpr: str) -> set[str] | None:
    """The labs (``"01"``, …) whose test folders alone can hold tests that ``-m markexpr``
    selects, or None when a test of another folder could match: the expression is False
    for every test without one of these labs' markers, whatever its other markers. Only
    those folders are collected (``-m lab01`` collects 31 tests, not all of them)."""
    import itertools

    from _pytest.mark.expression import Expression

    names = set(re.findall(r"[A-Za-z_][\w.:+-]*", markexpr)) - {"and", "or", "not"}
    labs = {n[3:] for n in names if re.fullmatch(r"lab\d\d", n)}
    if not labs:
        return None
    try:
        expr = Expression.compile(markexpr)
    except Exception:  # malformed: pytest itself says so
        return None
    free = sorted(n for n in names if n[3:] not in labs or not n.startswith("lab"))
    for values in itertools.product((False, True), repeat=len(free)):
        truth = dict(zip(free, values))
        if expr.evaluate(lambda name, **_: truth.get(name, False)):
            return None  # a test of another lab's folder (or of the kit) could match
    return labs


def pytest_ignore_collect(collection_path, config):
    if not hasattr(config, "_kit_only_labs"):
        config._kit_only_labs = _only_labs(config.getoption("markexpr") or "")
    labs = config._kit_only_labs
    if labs is None or collection_path.is_file() and collection_path.name == "conftest.py":
        return None
    tests = Path(__file__).parent
    try:
        rel = collection_path.relative_to(tests).parts
    except ValueError:
        return None
    if rel[:1] == ("hidden",):
        rel = rel[1:]
    if not rel or rel[0] == "hidden" and len(rel) == 1:
        return None
    top = rel[0]
    if LAB_DIR_RE.match(top):
        return None if top[:2] in labs else True
    return True if collection_path.is_dir() or collection_path.suffix == ".py" else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if LAB_DIR_RE.match(folder):
            item.add_marker(getattr(pytest.mark, f"lab{folder[:2]}"))
        elif folder in ("kit", "grader"):
            item.add_marker(pytest.mark.kit)
    items[:] = concept_tests_first(items)  # under -x, the test that names the mistake fails first


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Under ``-m labNN`` (no ``kit``), a module outside the lab folders that skips itself
    while collected (the similarity tests without their extra) is dropped quietly: its tests
    are deselected anyway, and a SKIPPED line about it says nothing to a student."""
    outcome = yield
    report = outcome.get_result()
    expr = collector.config.getoption("markexpr", "") or ""
    if report.skipped and re.search(r"\blab\d\d\b", expr) and "kit" not in expr and not lab_of(report.nodeid):
        outcome.force_result(CollectReport(report.nodeid, "passed", None, [], sections=report.sections))


class _TaskNotDone:
    """The report of a test that met a stub's NotImplementedError: one line, the task's
    message and the line that raised it, instead of a traceback through the test."""

    def __init__(self, path: str, lineno: int, message: str):
        self.reprcrash = ReprFileLocation(path, lineno, message)

    def toterminal(self, tw) -> None:
        tw.line(str(self), red=True)

    def __str__(self) -> str:
        return f"{self.reprcrash.path}:{self.reprcrash.lineno}: {self.reprcrash.message}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    """An unfinished task is not a bug to trace: a first run on the stubs fails every
    test, and formatting each traceback cost more than running the tests (lab 06: 3 s
    of 6). Other failures keep pytest's own report."""
    exc = call.excinfo
    if exc is None or call.when != "call" or not exc.errisinstance(NotImplementedError):
        return None
    last = exc.traceback[-1]
    path, lineno = str(last.path), last.lineno + 1
    try:
        path = os.path.relpath(path)
    except ValueError:
        pass
    for note in getattr(exc.value, "__notes__", []):  # graded: raised in the lab process
        where = re.fullmatch(r"raised in (\S+) line (\d+)", note)
        if where:
            path, lineno = where[1], int(where[2])
    sections = [(f"Captured {key} {when}", content) for when, key, content in item._report_sections]
    return TestReport(item.nodeid, item.location, dict.fromkeys(item.keywords, 1), "failed",
                      _TaskNotDone(path, lineno, f"NotImplementedError: {exc.value}"), call.when,
                      sections, call.duration, start=call.start, stop=call.stop,
                      user_properties=item.user_properties)


if remote.active() is not None:
    @pytest.fixture
    def tmp_path(tmp_path, tmp_path_factory):
        """Graded: the lab process (another user) reads and writes the test's folder too."""
        tmp_path.chmod(0o777)
        base = tmp_path_factory.getbasetemp()
        for parent in tmp_path.parents:
            parent.chmod(0o711)
            if parent == base:
                break
        return tmp_path
