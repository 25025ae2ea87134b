"""How far a batch is, lab by lab: ``grader grade``'s status line.

A submission's labs run one after another in one sandboxed test process, which reports
its results only when it ends. What the grader sees sooner is in the scratch folder's
``slogs/``, which only the grader writes in: the sandbox opens ``slogs/<lab>.txt`` when
it starts that lab's first lab process, so a lab has finished once a later lab's log
appears (and every lab once the run is over). Lab code can neither add nor hide such a
file. It feeds the status line only, never a score.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

POLL_SECONDS = 0.5


@contextmanager
def watch_labs(slogs: Path, labs: list[str], on_lab, poll: float = POLL_SECONDS):
    """While the block runs, call ``on_lab(lab, False)`` as each of ``labs`` (in run order)
    starts and ``on_lab(lab, True)`` once the sandbox has moved past it; the rest are over
    when the block ends."""
    if on_lab is None:
        yield
        return
    told, running = 0, -1
    lock = threading.Lock()
    stop = threading.Event()

    def say(lab: str, over: bool) -> None:
        try:
            on_lab(lab, over)
        except Exception:  # noqa: BLE001 - a status line never costs a submission its grade
            pass

    def tell(upto: int) -> None:
        nonlocal told
        with lock:
            while told < upto:
                say(labs[told], True)
                told += 1

    def poll_logs() -> None:
        nonlocal running
        while not stop.wait(poll):
            try:
                started = set(os.listdir(slogs))
            except OSError:
                continue
            last = max((i for i, lab in enumerate(labs) if f"{lab}.txt" in started), default=-1)
            tell(last)  # the labs before the latest one to start are over
            if last > running:
                running = last
                with lock:
                    say(labs[last], False)

    thread = threading.Thread(target=poll_logs, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        tell(len(labs))


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """One status line on stderr: students and labs done of the batch, a bar, an estimate of
    the time left, and the latest lab or student to finish. The bar counts labs, so it
    moves while one student's labs run; on a terminal the line also ticks each second with
    the labs running and for how long, so a lab that runs for minutes is seen to."""

    WIDTH = 24
    TICK_SECONDS = 1.0

    def __init__(self, students: int, labs: int, stream=sys.stderr, clock=time.monotonic):
        self.students, self.labs_each = students, labs
        self.done, self.labs_done = 0, 0
        self.per_student: dict[str, int] = {}
        self.stream, self.clock, self.start = stream, clock, clock()
        self.counted = 0  # labs graded in this run (kept results take no time)
        self.tty = stream.isatty()
        self.lock = threading.Lock()
        self.running: dict[str, tuple[str, float]] = {}  # student → the lab running, since when
        if self.tty:
            threading.Thread(target=self._ticker, daemon=True).start()

    def _ticker(self) -> None:
        while self.done < self.students:
            time.sleep(self.TICK_SECONDS)
            self.tick()

    def tick(self) -> None:
        """Show the labs running now, and for how long."""
        with self.lock:
            if self.running and self.done < self.students:
                now = self.clock()
                self._show("running " + ", ".join(f"{s}: {lab} {_clock(now - t)}"
                                                  for s, (lab, t) in sorted(self.running.items())))

    def lab(self, student: str, lab: str, over: bool = True) -> None:
        """One lab of ``student`` starts, or is over (its score comes with the student's result)."""
        with self.lock:
            if not over:
                self.running[student] = (lab, self.clock())
                return
            if self.running.get(student, ("",))[0] == lab:
                del self.running[student]
            if self.per_student.get(student, 0) >= self.labs_each:
                return
            self.per_student[student] = self.per_student.get(student, 0) + 1
            self.labs_done += 1
            self.counted += 1
            self._show(f"{student}: {lab} done")

    def update(self, result, reused: bool) -> None:
        """``result``'s student is done: their labs that did not run count as done too."""
        with self.lock:
            self.running.pop(result.student, None)
            left = self.labs_each - self.per_student.get(result.student, 0)
            self.per_student[result.student] = self.labs_each
            self.labs_done += left
            if not reused:
                self.counted += left
            self.done += 1
            status = "kept" if reused else ("NOT GRADED: " + result.error if result.error
                                            else f"{result.total:.2f}/{result.max_total:g}")
            self._show(f"{result.student}: {status}", final=self.done == self.students)

    def _show(self, what: str, final: bool = False) -> None:
        total = max(1, self.students * self.labs_each)
        elapsed = self.clock() - self.start
        rate = self.counted / elapsed if elapsed > 0 and self.counted else 0
        eta = f"eta {_clock((total - self.labs_done) / rate)}" if rate else "eta …"
        filled = int(self.WIDTH * self.labs_done / total)
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.students} students, "
                f"{self.labs_done}/{total} labs, {eta}  {what}")
        if self.tty:
            self.stream.write("\r\033[K" + line[:160] + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
