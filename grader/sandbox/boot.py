"""Runs inside the sandbox as ``_grader_boot.py``. Trusted code only until it forks.

It reads a one-time token from stdin (so it never sits in the environment), imports
the heavy libraries once, then forks one child per lab. Each child locks itself down
(an audit hook no later code can remove), then runs that lab's pristine tests with
pytest. Results go, token first, to a pipe only the grader reads.
"""

import json
import os
import resource
import signal
import sys
import time


def _guard(read_roots, write_roots, student_root, student_reads, report):
    """Install an audit hook: no files outside the scratch folder and the Python install,
    no processes, sockets, native libraries, or forbidden modules. While student code is
    on the stack, even the kit's own files (tests, fixtures, hidden tests) are off limits:
    only the Python install, the lab folders and the scratch work folders remain."""
    denied_modules = {"torch", "transformers", "safetensors", "ctypes", "_ctypes", "subprocess",
                      "_posixsubprocess", "socket", "_socket", "multiprocessing", "pty", "resource"}
    denied_events = ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn",
                     "os.fork", "os.forkpty", "socket.", "ctypes.", "os.kill", "os.killpg", "os.chown",
                     "sys.addaudithook",
                     "os.setuid", "os.setgid")
    # File-system changes are fine inside the writable scratch folders (pytest's tmp_path).
    # (pytest's tmp_path links its newest folder: a link whose both ends stay inside is harmless.)
    path_events = {"os.remove", "os.rename", "os.rmdir", "os.unlink", "os.chmod", "os.truncate",
                   "os.mkdir", "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.symlink", "os.link"}
    sep = os.sep
    realpath = os.path.realpath
    fsdecode = os.fsdecode
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path, roots):
        return any(path == r or path.startswith(r + sep) for r in roots)

    getframe = sys._getframe
    student_prefix = student_root + sep

    def student_on_stack():
        f = getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith(student_prefix):
                return True
            f = f.f_back
        return False

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            p = realpath(fsdecode(path))
            writing = bool(flags & write_flags) if flags else any(c in (mode or "") for c in "wax+")
            if not writing and not p.startswith("/proc/") and student_on_stack():
                if not inside(p, student_reads):
                    report("blocked", f"lab code read {p}")
                    raise PermissionError(f"the grader's sandbox does not allow lab code to read {p}")
                return
            if p.startswith("/proc/"):
                ok = p.startswith("/proc/self/stat") or p.startswith("/proc/cpuinfo") or p == "/proc/meminfo"
                if not ok or writing:
                    report("blocked", f"opened {p}")
                    raise PermissionError(f"the grader's sandbox does not allow opening {p}")
                return
            if not inside(p, write_roots if writing else read_roots):
                report("blocked", f"{'wrote' if writing else 'read'} {p}")
                raise PermissionError(f"the grader's sandbox does not allow {'writing' if writing else 'reading'} {p}")
        elif event == "import":
            name = args[0] or ""
            if name.split(".")[0] in denied_modules or name in denied_modules:
                report("blocked", f"imported {name}")
                raise ImportError(f"the grader's sandbox does not allow importing {name}")
        elif event in path_events:
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            if not all(inside(realpath(fsdecode(a)), write_roots) for a in paths):
                report("blocked", f"called {event} on {', '.join(map(str, paths))[:200]}")
                raise PermissionError(f"the grader's sandbox does not allow {event} outside its scratch folder")
        elif event.startswith(denied_events):
            report("blocked", f"called {event}")
            raise PermissionError(f"the grader's sandbox does not allow {event}")

    sys.addaudithook(hook)


def main():
    token = sys.stdin.readline().strip()
    with open(sys.argv[1], encoding="utf-8") as fh:
        plan = json.load(fh)
    sys.path[:0] = plan["sys_path"]
    out = os.fdopen(plan["results_fd"], "w", buffering=1)

    def emit(kind, **fields):
        out.write(token + " " + json.dumps({"event": kind, "t": round(time.monotonic(), 3), **fields}) + "\n")
        out.flush()

    # Import everything the tests need before any student code exists in this process.
    import numpy  # noqa: F401
    import pytest
    import hypothesis  # noqa: F401
    try:
        import scipy.special  # noqa: F401
    except ImportError:
        pass
    import _grader_plugin

    for job in plan["jobs"]:
        emit("lab_start", lab=job["lab"])
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                _grader_plugin.configure(token, out, plan["per_test_timeout"], job["lab"])
                current = job["lab"]

                def report(kind, what):
                    emit(kind, lab=current, what=what)

                # Everything this lab prints goes to a capped file, not to the grader.
                log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.close(log)
                resource.setrlimit(resource.RLIMIT_FSIZE, (plan["max_file_bytes"], plan["max_file_bytes"]))
                _guard(plan["read_roots"], plan["write_roots"], plan["student_root"],
                       plan["student_reads"], report)
                code = pytest.main([*job["tests"], f"--impl={job['impl']}", *plan["pytest_args"],
                                    "-p", "_grader_plugin"])
            except BaseException as exc:  # noqa: BLE001 - the child must always exit here
                emit("lab_crash", lab=job["lab"], what=f"{type(exc).__name__}: {exc}"[:500])
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
                emit("lab_timeout", lab=job["lab"], seconds=job["timeout"])
                status = -1
            else:
                time.sleep(0.02)
        if status != -1:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            emit("lab_end", lab=job["lab"], exit=os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1,
                 signal=sig)
    out.close()


if __name__ == "__main__":
    main()
