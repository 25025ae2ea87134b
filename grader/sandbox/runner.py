"""Host side of the sandbox: start the boot script with limits, read what it reports.

Isolation, strongest first:
- bubblewrap (``bwrap``) when installed: a private mount namespace in which only the
  scratch folder (read-write) and the Python installation (read-only) exist, no network,
  its own PID namespace; as root, the code also drops to an unprivileged uid per job slot;
- always: resource limits (address space, CPU seconds, processes, file size, open
  files), a wall-clock limit with the whole process group killed, an output cap, and the
  audit hook of ``boot.py`` (files outside the scratch folder, processes, sockets).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SANDBOX_ROOT = "/sandbox"  # where the scratch folder appears inside bubblewrap


@dataclass
class Limits:
    wall_seconds: float = 600.0  # whole submission
    lab_seconds: float = 120.0  # one lab's test run
    test_seconds: float = 10.0  # one test
    memory_mb: int = 2048
    cpu_seconds: int = 600
    max_processes: int = 64
    max_file_mb: int = 16  # any file a lab writes, its printed output included
    max_output_kb: int = 512  # what the grader reads back and keeps of a lab's printed output


@dataclass
class RawRun:
    events: list[dict] = field(default_factory=list)
    output: str = ""
    killed: str = ""  # why the grader stopped it ("" if it finished by itself)
    returncode: int | None = None
    seconds: float = 0.0
    isolation: str = ""
    lab_output: dict = field(default_factory=dict)  # lab → the first max_output_kb of what it printed
    lab_output_bytes: dict = field(default_factory=dict)


def isolation_mode() -> str:
    """'bwrap' when bubblewrap works here, else 'rlimits' (limits and audit hook only)."""
    if os.environ.get("GRADER_NO_BWRAP"):
        return "rlimits"
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return "rlimits"
    probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net",
                            *([] if os.geteuid() == 0 else ["--unshare-user"]), "true"],
                           capture_output=True, timeout=30)
    return "bwrap" if probe.returncode == 0 else "rlimits"


def python_roots() -> list[str]:
    """Folders the sandboxed Python must read: its installation and the environment's packages."""
    paths = {sys.base_prefix, sys.prefix, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
             sysconfig.get_paths()["stdlib"], str(Path(os.path.realpath(sys.executable)).parent)}
    return sorted({os.path.realpath(p) for p in paths if p})


def site_packages() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])})


def _limit_self(limits: Limits, as_root_drop: bool) -> None:
    """Runs in the child between fork and exec."""
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_mb * mb, limits.max_file_mb * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() != 0 or as_root_drop:
        # Counted per user: for a dedicated uid this caps the sandbox itself; for a normal
        # user it caps their extra processes while grading.
        try:
            current = len([p for p in os.listdir("/proc") if p.isdigit()]) if os.geteuid() != 0 else 0
        except OSError:
            current = 0
        n = limits.max_processes + current
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails instead of killing


def _drain(stream, cap: int, sink: list, flag: dict) -> None:
    total = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            return
        total += len(chunk)
        if total <= cap:
            sink.append(chunk)
        elif not flag.get("over"):
            flag["over"] = True
            sink.append(chunk[: max(0, cap - (total - len(chunk)))])


def run(scratch: Path, jobs: list[dict], limits: Limits, *, slot: int = 0, mode: str | None = None) -> RawRun:
    """Run the planned lab jobs inside ``scratch`` (which holds ``kit/``, ``impl/``,
    ``work/``, ``tmp/``) and return every event the boot script reported."""
    mode = mode or isolation_mode()
    scratch = Path(scratch).resolve()
    inside = Path(SANDBOX_ROOT) if mode == "bwrap" else scratch
    token = secrets.token_hex(16)
    r_fd, w_fd = os.pipe()
    os.set_inheritable(w_fd, True)
    roots = python_roots()
    plan = {
        "sys_path": [str(inside / "kit"), *site_packages()],
        "results_fd": w_fd,
        "read_roots": [str(inside), *roots, "/usr/lib", "/usr/share/zoneinfo", "/etc/localtime", "/dev/null",
                       "/dev/urandom"],
        "write_roots": [str(inside / "work"), str(inside / "tmp"), str(inside / "logs"), "/dev/null"],
        "student_root": str(inside / "impl"),
        "student_reads": [*roots, str(inside / "impl"), str(inside / "work"), str(inside / "tmp"), "/dev/null",
                          "/dev/urandom"],
        "max_file_bytes": limits.max_file_mb * 1024 * 1024,
        "per_test_timeout": limits.test_seconds,
        "pytest_args": ["-q", "-s", "-p", "no:cacheprovider", "-p", "no:randomly", "-m", "not torch",
                        f"--rootdir={inside / 'kit'}", "-c", str(inside / "kit" / "pyproject.toml"),
                        "--tb=line", "-W", "ignore"],
        "jobs": [{**j, "impl": str(inside / j["impl"]), "tests": [str(inside / "kit" / t) for t in j["tests"]],
                  "timeout": limits.lab_seconds, "log": str(inside / "logs" / f"{j['lab']}.txt")} for j in jobs],
    }
    (scratch / "plan.json").write_text(json.dumps(plan))
    (scratch / "logs").mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(inside / "work"), "TMPDIR": str(inside / "tmp"),
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8",
           # Only the plugins the kit names: autoloading every installed one (anyio's comes
           # with the torch extra) cost more than a lab's tests.
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "HYPOTHESIS_STORAGE_DIRECTORY": str(inside / "tmp" / "hypothesis")}
    python = os.path.realpath(sys.executable) if mode == "bwrap" else sys.executable
    cmd = [python, "-I", "-S", "-B", str(inside / "kit" / "_grader_boot.py"), str(inside / "plan.json")]
    if mode == "bwrap":
        cmd[0] = sys.executable  # the venv's python: pyvenv.cfg finds the packages
        drop = os.geteuid() == 0
        uid = 61000 + slot
        if drop:
            for sub in ("work", "tmp", "logs"):
                for dirpath, dirnames, filenames in os.walk(scratch / sub):
                    os.chown(dirpath, uid, uid)
                    for f in filenames:
                        os.chown(os.path.join(dirpath, f), uid, uid)
        binds, made = [], set()
        for root in sorted({*roots, os.path.dirname(os.path.abspath(sys.executable)).rsplit("/bin", 1)[0]}):
            if not os.path.exists(root):
                continue
            # bwrap would create the mount point's parents mode 0700: make them traversable.
            for parent in reversed(Path(root).parents):
                if str(parent) not in ("/", "/usr") and str(parent) not in made and not str(parent).startswith("/usr/"):
                    made.add(str(parent))
                    binds += ["--perms", "0755", "--dir", str(parent)]
            binds += ["--ro-bind", root, root]
        prefix = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
                  "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                  *([] if drop else ["--unshare-user"]),
                  "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                  "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                  *binds, "--bind", str(scratch), SANDBOX_ROOT, "--ro-bind", str(scratch / "kit"),
                  str(inside / "kit"), "--ro-bind", str(scratch / "impl"), str(inside / "impl"),
                  "--chdir", str(inside / "work")]
        if drop:
            prefix += ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                       "--inh-caps=-all", "--bounding-set=-all"]
        cmd = prefix + cmd
    out_chunks: list[bytes] = []
    res_chunks: list[bytes] = []
    flags: dict = {}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            pass_fds=(w_fd,), cwd=str(scratch / "work"), env=env, start_new_session=True,
                            preexec_fn=lambda: _limit_self(limits, mode == "bwrap" and os.geteuid() == 0))
    os.close(w_fd)
    results = os.fdopen(r_fd, "rb")
    t_out = threading.Thread(target=_drain, args=(proc.stdout, limits.max_output_kb * 1024, out_chunks, flags), daemon=True)
    t_res = threading.Thread(target=_drain, args=(results, 64 * 1024 * 1024, res_chunks, {}), daemon=True)
    t_out.start()
    t_res.start()
    try:
        proc.stdin.write(token.encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    killed = ""
    while proc.poll() is None:
        if time.monotonic() - start > limits.wall_seconds:
            killed = f"stopped after the {limits.wall_seconds:g} s limit for a whole submission"
        elif flags.get("over"):
            killed = f"stopped: printed more than the {limits.max_output_kb} KB output limit"
        if killed:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            break
        time.sleep(0.05)
    t_out.join(timeout=5)
    t_res.join(timeout=5)
    results.close()
    raw = RawRun(output=b"".join(out_chunks).decode("utf-8", "replace"), killed=killed,
                 returncode=proc.returncode, seconds=time.monotonic() - start, isolation=mode)
    for j in jobs:
        log = scratch / "logs" / f"{j['lab']}.txt"
        if log.is_file():
            size = log.stat().st_size
            with open(log, "rb") as fh:
                raw.lab_output[j["lab"]] = fh.read(limits.max_output_kb * 1024).decode("utf-8", "replace")
            raw.lab_output_bytes[j["lab"]] = size
    prefix_tok = token + " "
    for line in b"".join(res_chunks).decode("utf-8", "replace").splitlines():
        if line.startswith(prefix_tok):  # anything without the token was not written by the boot script
            try:
                raw.events.append(_same_paths(json.loads(line[len(prefix_tok):]), str(inside)))
            except json.JSONDecodeError:
                continue
    return raw


def _same_paths(event: dict, inside: str) -> dict:
    """Messages name the scratch folder as ``/sandbox`` whatever the isolation: the same
    submission gets the same result, and no path of the grading machine reaches feedback."""
    if inside == SANDBOX_ROOT:
        return event
    return {k: v.replace(inside, SANDBOX_ROOT) if isinstance(v, str) else v for k, v in event.items()}


def boot_files() -> dict[str, Path]:
    """The files copied into every scratch ``kit/`` folder."""
    return {"_grader_boot.py": HERE / "boot.py", "_grader_plugin.py": HERE / "plugin.py"}
