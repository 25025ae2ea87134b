"""Run the kit's tests in a child process and read back what happened, test by test."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

from gptkit.testing.layout import KIT_ROOT


@dataclass
class TestResult:
    __test__ = False  # a record of a test, not a test for pytest to collect

    nodeid: str
    outcome: str  # "passed" | "failed" | "error" | "skipped"
    message: str
    duration: float
    live: bool = False  # marked `torch`: a live PyTorch/HuggingFace comparison

    def to_dict(self) -> dict:
        return asdict(self)


LIVE_PROPERTY = "kit_live"


def pytest_collection_modifyitems(items):
    """This module is also a pytest plugin (``-p grader.pytest_run``): it records in the
    JUnit report which tests are live comparisons (the ``torch`` marker)."""
    for item in items:
        if item.get_closest_marker("torch") is not None:
            item.user_properties.append((LIVE_PROPERTY, "1"))


def parse_junit(path: Path) -> list[TestResult]:
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        nodeid = f"{cls.replace('.', '/')}::{name}" if cls else name
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or el.text or "").strip()
                break
        live = any(p.get("name") == LIVE_PROPERTY for p in case.iter("property"))
        results.append(TestResult(nodeid, outcome, message, float(case.get("time", 0) or 0), live))
    return results


def run_pytest(impl: Path | str, marker: str | None = None, *, args: list[str] = (),
               cwd: Path = KIT_ROOT, timeout: float | None = 600, env: dict | None = None
               ) -> tuple[int, list[TestResult], str]:
    """pytest on ``impl`` (a tree of lab folders); returns (exit code, results, output)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", f"--impl={impl}", "-q", "-p", "no:randomly", "-p", "grader.pytest_run",
               f"--junitxml={junit}", "-o", "junit_family=xunit1", *args]
        if marker:
            cmd += ["-m", marker]
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        results = parse_junit(junit) if junit.is_file() else []
    return proc.returncode, results, proc.stdout + proc.stderr
