"""What the test process tells the grader: one event per line, ``<token> <JSON>``.

The one definition of those events, used by the writers inside the sandbox (``boot.py``
and ``plugin.py``, where this file is ``_grader_protocol.py``) and by the reader
(``runner.py``, then ``grade.py`` scores them). Only the test process writes them, on a
pipe that lab code never holds. The reader keeps an event only if it carries the
token, is well-formed JSON, names a known kind and has every field of that kind with
the right type; anything else is dropped and counted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclass(frozen=True)
class LabStart:
    lab: str


@dataclass(frozen=True)
class TestStart:
    __test__ = False
    lab: str
    nodeid: str


@dataclass(frozen=True)
class TestResult:
    """A test's verdict. ``cpu``: seconds of CPU the lab code used in it (the kernel's count);
    ``limit``: the CPU seconds it was allowed (0: the per-test budget)."""

    __test__ = False
    lab: str
    nodeid: str
    outcome: str
    message: str
    duration: float
    cpu: float
    limit: float = 0.0


@dataclass(frozen=True)
class _LabNote:
    lab: str
    what: str


@dataclass(frozen=True)
class Blocked(_LabNote):
    """Something lab code tried and the sandbox refused (as the lab process reported it:
    a flag for the instructor, never a score)."""


@dataclass(frozen=True)
class LabStopped(_LabNote):
    """The test process stopped the lab early, by its own rule (e.g. too many timeouts)."""


@dataclass(frozen=True)
class LabCrash(_LabNote):
    """The test process itself failed (not a test: the machinery)."""


@dataclass(frozen=True)
class LabTimeout:
    lab: str
    seconds: float


@dataclass(frozen=True)
class LabEnd:
    """The lab's test process ended: ``exit`` its exit code (-1 if killed), ``signal`` or 0."""

    lab: str
    exit: int
    signal: int


KINDS = {"lab_start": LabStart, "test_start": TestStart, "test": TestResult, "blocked": Blocked,
         "lab_stopped": LabStopped, "lab_crash": LabCrash, "lab_timeout": LabTimeout, "lab_end": LabEnd}
NAMES = {cls: name for name, cls in KINDS.items()}
Event = LabStart | TestStart | TestResult | Blocked | LabStopped | LabCrash | LabTimeout | LabEnd


def encode(token: str, event: Event) -> str:
    """One line for the results pipe."""
    return f"{token} {json.dumps({'event': NAMES[type(event)], **asdict(event)})}\n"


def decode(line: str, token: str) -> Event | None:
    """The event on one line, or None if it is not a well-formed event with the token."""
    if not line.startswith(token + " "):
        return None
    try:
        data = json.loads(line[len(token) + 1:])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    cls = KINDS.get(data.pop("event", None))
    if cls is None or set(data) != {f.name for f in fields(cls)}:
        return None
    for f in fields(cls):
        value, want = data[f.name], f.type
        ok = (isinstance(value, str) if want == "str" else
              type(value) is int if want == "int" else
              type(value) in (int, float) if want == "float" else False)
        if not ok:
            return None
        if want == "float":
            data[f.name] = float(value)
    if cls is TestResult and data["outcome"] not in OUTCOMES:
        return None
    return cls(**data)
