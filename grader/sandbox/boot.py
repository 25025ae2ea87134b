"""Runs inside the sandbox as ``_grader_boot.py``: the grader's test process. Trusted code only.

It reads a one-time token from stdin (so it never sits in the environment), makes itself
undumpable (no other process of its user may read its memory or trace it), imports the
test machinery once, then forks one child per lab that runs the lab's pristine tests
with pytest. Lab code never runs here: ``lab("module")`` reaches it in a separate
process that the grader starts on request (``gptkit.testing.remote``). Results go, as
``_grader_protocol`` events, to a pipe only this process holds.
"""

import contextlib
import gc
import io
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

    # Everything the tests need, imported once before the per-lab forks.
    import numpy  # noqa: F401
    import pytest
    import hypothesis  # noqa: F401

    import _grader_plugin
    from gptkit.testing import remote

    # One pytest session here first, on an empty folder without conftest, so that each lab's
    # session in its fork finds pytest's own machinery loaded; then gc.freeze(), so that the
    # forks' garbage collections leave the objects loaded so far alone (otherwise every
    # page they sit on is copied into every fork). Together 0.3-0.4 s of CPU per submission.
    empty = os.path.join(os.environ.get("HOME") or "/tmp", ".warm-up")
    os.makedirs(empty, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):
        pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--noconftest", "-c", os.devnull,
                     "--rootdir", empty, empty])
    gc.collect()
    gc.freeze()

    for job in plan["jobs"]:
        lab = job["lab"]
        emit(protocol.LabStart(lab))
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.close(log)
                r = remote.start(plan["ctl_fd"], plan["test_cpu_seconds"], plan["test_wall_seconds"],
                                 plan["module_labs"], lab)
                r.warm()
                _grader_plugin.configure(emit, plan["test_cpu_seconds"], plan["test_wall_seconds"], lab)
                try:
                    code = pytest.main([*job["tests"], *plan["pytest_args"], f"--basetemp={job['basetemp']}",
                                        "-p", "_grader_plugin"])
                finally:
                    r.close()
            except BaseException as exc:  # noqa: BLE001 - the child must always exit here
                emit(protocol.LabCrash(lab, f"{type(exc).__name__}: {exc}"[:500]))
            finally:
                try:
                    out.flush()
                    sys.stdout.flush()
                finally:
                    os._exit(int(code) if isinstance(code, int) else 3)
        deadline = time.monotonic() + job["timeout"]
        status = None
        while status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            elif time.monotonic() > deadline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                os.waitpid(pid, 0)
                emit(protocol.LabTimeout(lab, float(job["timeout"])))
                status = -1
            else:
                time.sleep(0.02)
        if status != -1:
            emit(protocol.LabEnd(lab, os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1,
                                 os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0))
    out.close()


if __name__ == "__main__":
    main()
