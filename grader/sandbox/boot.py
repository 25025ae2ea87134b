"""Runs inside the sandbox as ``_grader_boot.py``: the grader's test process. Trusted code only.

It reads a one-time token from stdin (so it never sits in the environment), makes itself
undumpable (no other process of its user may read its memory or trace it), imports the
test machinery once, then forks a child that runs every lab's pristine tests, lab after
lab, in one pytest session. Lab code never runs here: ``lab("module")`` reaches it in a
separate process per lab that the grader starts on request (``gptkit.testing.remote``).
Results go, as ``_grader_protocol`` events, to a pipe only this process holds.

The child tells this process, on a pipe of its own, when each lab starts and ends. Each
lab has a wall-clock backstop, far above its CPU budget (which the plugin counts); a child
that runs past it, or dies, ends that lab without a result, and a new child runs the labs
after it.
"""

import gc
import json
import os
import signal
import sys
import time


def _undumpable():
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/mem, ptrace and core dumps closed to others."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def main():
    token = sys.stdin.readline().strip()
    with open(sys.argv[1], encoding="utf-8") as fh:
        plan = json.load(fh)
    _undumpable()
    sys.path[:0] = plan["sys_path"]
    os.umask(0o022)
    out = os.fdopen(plan["results_fd"], "w", buffering=1)

    import _grader_protocol as protocol

    def emit(event):
        out.write(protocol.encode(token, event))
        out.flush()

    # Everything the tests need, imported once: a child that replaces one that died starts
    # with it loaded.
    import numpy  # noqa: F401
    import pytest
    import hypothesis  # noqa: F401

    import _grader_plugin
    from gptkit.testing import remote

    gc.freeze()  # what is loaded so far stays: the tests' collections need not walk it again

    jobs = plan["jobs"]
    todo = [job["lab"] for job in jobs]
    timeout = {job["lab"]: float(job["timeout"]) for job in jobs}
    attempt = 0
    while todo:
        attempt += 1
        tests = [t for job in jobs if job["lab"] in todo for t in job["tests"]]
        progress_r, progress_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(progress_r)
            _run_labs(plan, todo, tests, attempt, emit, progress_w, remote, _grader_plugin, pytest, protocol)
        os.close(progress_w)
        todo = _watch(pid, progress_r, todo, timeout, emit, protocol)
    out.close()


LOG_BYTES = 8 * 1024 * 1024  # what is kept of the test process's output: below its file-size limit


def _bounded_log(path):
    """stdout and stderr into ``path``, the first ``LOG_BYTES`` of them: what pytest prints
    holds text lab code chose (its exceptions' messages), and a log past the file-size
    limit would stop the test process."""
    import threading

    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    r, w = os.pipe()

    def drain():
        kept = 0
        while True:
            try:
                chunk = os.read(r, 65536)
            except OSError:
                return
            if not chunk:
                return
            if kept < LOG_BYTES:
                part = chunk[:LOG_BYTES - kept]
                try:
                    os.write(log, part)
                except OSError:
                    part = b"x" * LOG_BYTES
                kept += len(part)

    threading.Thread(target=drain, daemon=True).start()
    os.dup2(w, 1)
    os.dup2(w, 2)
    os.close(w)


def _run_labs(plan, labs, tests, attempt, emit, progress_w, remote, plugin, pytest, protocol):
    """The child: one pytest session over ``labs``' tests; never returns."""
    code = 3
    try:
        _bounded_log(plan["log"])
        progress = os.fdopen(progress_w, "w", buffering=1)

        def note(what, lab):
            progress.write(f"{what} {lab}\n")

        def enter(lab):  # the lab's own process becomes the one lab() reaches
            r = remote.active()
            if r is None or r.lab != lab:
                remote.start(plan["ctl_fd"], plan["test_cpu_seconds"], plan["test_wall_seconds"],
                             plan["module_labs"], lab).warm()

        enter(labs[0])  # its start-up overlaps the collection
        plugin.configure(emit, plan["test_cpu_seconds"], plan["test_wall_seconds"], labs, note, enter,
                         plan["lab_cpu_seconds"])
        code = pytest.main([*tests, *plan["pytest_args"], f"--basetemp={plan['basetemp']}-{attempt}",
                            "-p", "_grader_plugin"])
    except BaseException as exc:  # noqa: BLE001 - the child must always exit here
        emit(protocol.LabCrash(plugin.current_lab() or labs[0], f"{type(exc).__name__}: {exc}"[:500]))
    finally:
        try:
            sys.stdout.flush()
        finally:
            r = remote.active()
            if r is not None:
                r.close()
            os._exit(int(code) if isinstance(code, int) else 3)


def _watch(pid, progress_r, todo, timeout, emit, protocol):
    """Follow the child through ``todo`` (in order) until it ends or a lab runs past its time
    limit; returns the labs that a new child should run."""
    os.set_blocking(progress_r, False)
    started, ended, current, buf = [], set(), None, b""
    deadline = time.monotonic() + timeout[todo[0]]
    status = timed_out = None

    def read_progress():
        nonlocal buf, current, deadline
        while True:
            try:
                chunk = os.read(progress_r, 4096)
            except BlockingIOError:
                return
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                what, _, lab = line.decode().partition(" ")
                if lab not in timeout:
                    continue
                if what == "start":
                    started.append(lab)
                    current, deadline = lab, time.monotonic() + timeout[lab]
                elif what == "end":
                    ended.add(lab)
                    current = None
                    following = [lab for lab in todo if lab not in ended and lab not in started]
                    deadline = time.monotonic() + timeout[following[0] if following else lab]

    while status is None:
        read_progress()
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(pid, 0)
            timed_out = current or next(lab for lab in todo if lab not in ended)
            emit(protocol.LabTimeout(timed_out, timeout[timed_out]))
            status = -1
        else:
            time.sleep(0.02)
    read_progress()
    os.close(progress_r)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    if timed_out is None and current is not None:  # the child ended in the middle of a lab
        how = f"exit code {code}" if os.WIFEXITED(status) else f"signal {sig}" if sig else "it vanished"
        emit(protocol.LabCrash(current, f"the test process ended in the middle of the lab ({how})"))
    stop = timed_out or current
    rest = [lab for lab in (todo[todo.index(stop) + 1:] if stop else todo) if lab not in ended]
    if rest and not started and timed_out is None:
        # It ended before running any lab (pytest could not start): another child would too.
        for lab in rest:
            emit(protocol.LabEnd(lab, code, sig))
        return []
    return rest


if __name__ == "__main__":
    main()
