"""How much memory lab code holds at its peak, measured where lab code cannot change the
measurement (lab 12's tiled attention).

Python's ``tracemalloc`` runs inside the process it measures: lab code can stop it, allocate
where it does not look (an anonymous ``mmap``), or replace the helper that reads it. The
kernel's count of a process's peak resident memory has none of these holes when it is read
from another process. Graded, the lab code runs in a lab process of its own, and the grader
reads that count (``VmHWM``) from outside it. In plain pytest (the student's own run, where
the student could change the tests anyway) a child interpreter runs the calls and reports
its own peak (``getrusage``).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gptkit.testing import remote
from gptkit.testing.loader import lab

_CHILD = """
import importlib, pickle, resource, sys
folder = sys.argv[1]
with open(folder + "/in.pkl", "rb") as fh:
    path, module, function, calls = pickle.load(fh)
sys.path[:0] = path
fn = getattr(importlib.import_module(module), function)

def peak():
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb if sys.platform == "darwin" else kb * 1024  # bytes on macOS, KiB on Linux

peaks, results = [peak()], []
for args, kwargs in calls:
    results.append(fn(*args, **kwargs))
    peaks.append(peak())
with open(folder + "/out.pkl", "wb") as fh:
    pickle.dump((results, peaks), fh)
"""


def peak_growth(module: str, function: str, calls: list[tuple[tuple, dict]]) -> tuple[list, list[int]]:
    """``module.function(*args, **kwargs)`` for each ``(args, kwargs)`` of ``calls`` in turn, in
    a process that has done nothing else since it imported the lab code: (the results, by how
    many bytes the process's peak resident memory grew during each call). A first small call
    makes the later ones' growth their own (NumPy's and BLAS's one-time buffers are then in
    place)."""
    r = remote.active()
    if r is not None:
        r.restart()
        fn = getattr(lab(module), function)  # imported now, before the first reading
        peaks, results = [r.peak_resident()], []
        for args, kwargs in calls:
            results.append(fn(*args, **kwargs))
            peaks.append(r.peak_resident())
        if any(p is None for p in peaks):
            pytest.skip("the grader cannot read the lab process's peak memory on this system")
        r.restart()  # the next test starts from a process of ordinary size
    else:
        try:
            import resource  # noqa: F401 - Linux and macOS only
        except ImportError:
            pytest.skip("peak memory is read with getrusage, which this system lacks")
        with tempfile.TemporaryDirectory() as folder:
            with open(Path(folder) / "in.pkl", "wb") as fh:
                pickle.dump((list(sys.path), module, function, calls), fh)
            done = subprocess.run([sys.executable, "-c", _CHILD, folder], capture_output=True, text=True,
                                  timeout=600)
            if done.returncode != 0:
                lines = (done.stderr.strip() or "no output").splitlines()
                raise AssertionError(f"{module}.{function} failed in the process that measures its memory: "
                                     + "\n".join(lines[-12:]))
            with open(Path(folder) / "out.pkl", "rb") as fh:
                results, peaks = pickle.load(fh)
    return results, [b - a for a, b in zip(peaks, peaks[1:])]
