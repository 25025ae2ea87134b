"""``peak_memory``: how many bytes a call held at once, for lab 12's memory test.

It lives in the kit rather than in the lab's file because it reaches into the interpreter
(``tracemalloc``), which the grader's static review notes in student code.
"""

from __future__ import annotations

import tracemalloc


def peak_memory(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and the most bytes it held allocated at once beyond what
    existed when it started (Python's ``tracemalloc``, which counts NumPy's arrays).

    Returns:
        (the result, peak bytes as an int).
    """
    already = tracemalloc.is_tracing()
    if not already:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        if not already:
            tracemalloc.stop()
    return result, int(peak)
