"""Host side of the sandbox: start the test process with limits, start lab processes
when it asks, read what it reports.

Per submission, two kinds of process, each in its own sandbox:
- the test process (``boot.py``): the kit's tests, the results pipe; never lab code;
- lab processes (``labserver.py``): one fresh interpreter per lab (and again if it dies),
  holding the submission's code and one end of a socket whose other end goes to the
  test process over the control socket.

Isolation, strongest first:
- bubblewrap (``bwrap``) when installed: private mount namespaces (the lab process sees
  only its lab tree, ``gptkit``, its own ``/tmp`` and the Python installation; the test
  process does not see the submission), no network, own PID and IPC namespaces; as root,
  each kind of process drops to its own unprivileged uid;
- as root without bubblewrap: each process takes a network namespace of its own, then
  drops to its unprivileged uid with no capabilities and no_new_privs, running a Python
  that uid can read (``runtime.py``); where that cannot be done, grading is refused;
- not root, without bubblewrap: a user and network namespace where the kernel allows one;
- every lab process has a scratch folder of its own, shared with no other process:
  ``/tmp`` (also its HOME, TMPDIR and working folder), a tmpfs of ``Limits.disk_mb``
  in its own mount namespace (bubblewrap's, or one made as root without it); where
  neither exists, a fresh folder of the scratch that the host removes. The host
  measures what it holds and stops the process past the quota;
- every lab process, a zygote's child too, makes a user and an IPC namespace of its own
  and joins a new session keyring before its walls go up, where the kernel allows
  (``own_namespaces``): no key or IPC object of its outlives it or reaches another; and
  a mount namespace with /proc read-only (no reset of the peak memory read here);
- always: resource limits (address space, CPU seconds, processes and threads, file size,
  open files), wall-clock limits with the whole process group killed, an output cap,
  the kernel walls and the audit hook of ``labserver.py``. The grader writes nothing in
  a folder lab code can write: configurations go through pipes, logs to ``slogs/``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader.sandbox import labserver, protocol, runtime
from grader.sandbox.runtime import SandboxRefused  # noqa: F401 - raised here, caught by the CLI

HERE = Path(__file__).resolve().parent
SANDBOX_ROOT = "/sandbox"  # where the scratch folder appears inside bubblewrap
LAB_ROOT = "/mnt/sandbox"  # where its parts appear to a lab process with its own /tmp, as root without bubblewrap
HYPOTHESIS_DIR = "tmp/hypothesis"  # the test process's Hypothesis storage, in the scratch folder


@dataclass
class Limits:
    wall_seconds: float = 1800.0  # whole submission: a backstop, wall-clock (see lab_wall_seconds)
    lab_seconds: float = 120.0  # one lab: CPU seconds of its lab code and its tests (the kernel's count)
    test_seconds: float = 10.0  # one test: CPU seconds of the lab code (the kernel's count, whatever the load)
    memory_mb: int = 2048
    cpu_seconds: int = 600
    max_processes: int = 64
    max_file_mb: int = 16  # any file a lab writes, its printed output included
    max_output_kb: int = 512  # what the grader reads back and keeps of a lab's printed output
    disk_mb: int = 64  # what one lab process may keep in its scratch folder (/tmp)
    test_wall_backstop: float | None = None  # seconds without an answer from lab code (None: see below)
    lab_wall_backstop: float | None = None  # wall-clock seconds of one lab's run (None: see below)

    @property
    def test_wall_seconds(self) -> float:
        """Backstop for lab code that waits without using CPU: far above the CPU budget, so
        that load alone never reaches it."""
        return self.test_wall_backstop or max(60.0, 6 * self.test_seconds)

    @property
    def lab_wall_seconds(self) -> float:
        """Backstop for a lab whose code waits without using CPU (its tests' own backstops
        stop it first): far above its CPU budget, so that load alone never reaches it."""
        return self.lab_wall_backstop or max(300.0, 5 * self.lab_seconds)


@dataclass
class RawRun:
    events: list[dict] = field(default_factory=list)
    output: str = ""
    killed: str = ""  # why the grader stopped it ("" if it finished by itself)
    returncode: int | None = None
    seconds: float = 0.0
    isolation: str = ""
    lab_output: dict = field(default_factory=dict)  # lab → the first max_output_kb of what it printed (public tests)
    lab_output_bytes: dict = field(default_factory=dict)
    dropped: int = 0  # lines on the results pipe that were not well-formed events
    # lab → what the grader itself saw of its lab processes (never text the lab wrote):
    # "disk" (MB it held when stopped), "memory" (peak MB), "died" (how many ended by themselves)
    observed: dict = field(default_factory=dict)


def isolation_mode() -> str:
    """'bwrap' when bubblewrap works here, else 'rlimits' (limits, kernel walls, audit hook).
    As root without bubblewrap, raises SandboxRefused (one line) when the sandboxed
    processes cannot be dropped to an unprivileged user: lab code never runs as root."""
    mode = "rlimits"
    bwrap = shutil.which("bwrap")
    if bwrap and not os.environ.get("GRADER_NO_BWRAP"):
        probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net",
                                *([] if os.geteuid() == 0 else ["--unshare-user"]), "true"],
                               capture_output=True, timeout=30)
        mode = "bwrap" if probe.returncode == 0 else "rlimits"
    if mode == "rlimits" and os.geteuid() == 0:
        runtime.for_dropped_user(LAB_UID)
    if os.geteuid() == 0 and not own_namespaces(mode) and not kernel_walls():
        raise SandboxRefused("refusing to grade: this kernel gives a lab process neither user and IPC namespaces "
                             "of its own nor the seccomp filter, so a key in its uid's keyring would outlive it "
                             "and reach the next student graded as that uid")
    return mode


USE_ZYGOTE = True  # tests turn it off to attack the other way of starting lab processes


@functools.cache
def kernel_walls() -> bool:
    """Whether the lab process's two kernel walls (the seccomp filter and the Landlock
    fence) both hold on this machine: then one zygote per submission forks the labs'
    processes (``labserver.py``), each fenced to its own lab's tree by the kernel."""
    try:
        probe = subprocess.run([sys.executable, "-I", "-S", "-B", str(HERE / "labserver.py"), "--walls"],
                               capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


@functools.cache
def own_namespaces(mode: str) -> bool:
    """Whether a lab process, started here as the grader starts it (in ``mode``'s sandbox,
    as its unprivileged user), gets a user and an IPC namespace of its own
    (``labserver._own_namespaces``): then every lab process, the zygote's children
    included, makes them before its walls go up, and no keyring or IPC object of one lab
    process outlives it or reaches another. Where the kernel (or a container's own filter)
    refuses them, the seccomp filter alone refuses those objects (``isolation_mode``)."""
    rt = sandbox_runtime(mode)
    code = (HERE / "labserver.py").read_text()
    cmd = [rt.executable, "-I", "-S", "-B", "-c", code, "--namespaces"]
    root = os.geteuid() == 0
    if mode == "bwrap":
        cmd = _bwrap(list(rt.roots), [], "/tmp", LAB_UID if root else None) + cmd

    def child():
        if root and mode != "bwrap":
            runtime.no_network()
            runtime.drop_privileges(LAB_UID)

    try:
        probe = subprocess.run(cmd, preexec_fn=child, capture_output=True, timeout=60, cwd="/",
                               env={"PATH": "/usr/bin:/bin", **rt.env})
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def namespaces_warning(mode: str) -> str:
    """What ``grader grade`` says when it starts where lab processes get no namespaces of
    their own ("" where they do)."""
    if own_namespaces(mode):
        return ""
    return ("warning: this kernel gives lab processes no user and IPC namespaces of their own: the seccomp filter "
            "alone keeps them from keyrings, System V IPC and POSIX message queues")


TEST_UID, LAB_UID = 61000, 62000  # + the job slot (the test process); + 64 × slot + the lab's index


def can_drop_to(uid: int = LAB_UID) -> bool:
    """Without bubblewrap, as root: can the sandboxed processes run as another user, with no
    capabilities (this Python, or its public copy: ``runtime.py``)? If not, grading is
    refused (``isolation_mode``): nothing runs as root."""
    try:
        runtime.for_dropped_user(uid)
        return True
    except SandboxRefused:
        return False


def sandbox_runtime(mode: str) -> runtime.Runtime:
    """The Python the sandboxed processes run: as root without bubblewrap, one that an
    unprivileged user can read (SandboxRefused if none); else this one."""
    if mode != "bwrap" and os.geteuid() == 0:
        return runtime.for_dropped_user(LAB_UID)
    return runtime.host_runtime()


_CLONE_NEWNS, _MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    0x20000, 0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000, 0x40000)
TMPFS_INODES = 4096  # files and folders one lab process's /tmp may hold
# What each file, folder or link costs against the disk quota besides its data: an empty
# file holds no block but an inode and a folder entry, and a lab process that made them by
# the hundred thousand in its hand-off folder (on the host's disk) would fill the host's
# inodes, and every other student's writes with them, within its quota of bytes.
ENTRY_BYTES = 4096


HANDOFF_PHASES = ("public", "hidden")
# As root without bubblewrap, where the scratch folder lies under /tmp: the hand-off tree
# goes here instead (see ``_handoff_root``).
HANDOFF_DIR = os.environ.get("GRADER_HANDOFF_DIR", "/var/tmp/gptkit-handoff")


def _handoff_root(scratch: Path, mode: str) -> Path:
    """Where the hand-off folders of a run live on the host (and, but for bubblewrap, where
    the test process and the lab processes see them). A lab process may write anywhere in
    its own /tmp, and the Landlock fence lets it do so under every folder mounted there:
    as root without bubblewrap, a scratch folder under the host's /tmp would put the whole
    hand-off tree (every lab's and phase's folder) under it, bound into the zygote's /tmp.
    So the tree moves out of /tmp, to a fresh folder of ``HANDOFF_DIR``: then each lab
    process reaches its own folder alone (the fence), and no other one."""
    if mode == "bwrap" or os.geteuid() != 0 or not str(scratch).startswith("/tmp/"):
        return scratch / "handoff"
    os.makedirs(HANDOFF_DIR, mode=0o711, exist_ok=True)
    st = os.lstat(HANDOFF_DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        raise SandboxRefused(f"refusing to grade: {HANDOFF_DIR} is not a folder of root's")
    os.chmod(HANDOFF_DIR, 0o711)
    root = Path(tempfile.mkdtemp(prefix="run-", dir=HANDOFF_DIR))
    root.chmod(0o755)
    return root


def _parents(path: str, below: Path) -> list[str]:
    """bubblewrap arguments making the folders between ``below`` and ``path`` (which it
    would otherwise make mode 0700) passable."""
    out, cur = [], Path(path).parent
    chain = []
    while cur != below and below in cur.parents:
        chain.append(cur)
        cur = cur.parent
    for d in reversed(chain):
        out += ["--perms", "0755", "--dir", str(d)]
    return out


def tmpfs_bytes(disk_mb: int) -> int:
    """The size of a lab process's /tmp: its quota and one MB more, so that the host sees
    a process that filled it pass the quota (and stops it) before the kernel says no."""
    return (disk_mb + 1) * 1024 * 1024


@functools.cache
def _libc():
    """The C library, loaded in the grader (never between fork and exec)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _private_tmp(disk_mb: int, binds: tuple = (), keep: tuple[str, ...] = (), rw: tuple = ()) -> None:
    """Runs in a lab process's child set-up as root without bubblewrap, before any uid
    drop: a mount namespace of its own (nothing propagates back) whose /tmp is a tmpfs of
    ``tmpfs_bytes(disk_mb)``, its working folder, and /dev/null over ``PROC_KEYS``. What
    it writes there no other process sees, and it is gone when the process (or the zygote holding it) ends. ``binds``:
    (host path, path under ``LAB_ROOT``) pairs, the parts of the scratch folder it may
    see, bound read-only on a tmpfs over ``LAB_ROOT``'s parent (so that none lies under
    /tmp, which the lab process may write); ``keep``: paths under the host's /tmp it needs
    (a Python installation there), bound back read-only at the same place; ``rw``: (host
    path, path) pairs bound read-write (its hand-off folder, at the test process's path)."""
    import ctypes

    libc = _libc()

    def check(ret):
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"private /tmp: {os.strerror(err)}")

    check(libc.unshare(_CLONE_NEWNS))
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None))
    held = [(os.open(src, os.O_PATH), os.path.isdir(src), str(dst), False)
            for src, dst in [*binds, *((p, p) for p in keep)]]
    held += [(os.open(src, os.O_PATH), True, str(dst), True) for src, dst in rw]
    opts = f"size={tmpfs_bytes(disk_mb)},nr_inodes={TMPFS_INODES},mode=1777".encode()
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, opts))
    for path in PROC_KEYS:
        if os.path.exists(path):
            check(libc.mount(b"/dev/null", path.encode(), None, _MS_BIND, None))
    if binds:
        check(libc.mount(b"tmpfs", os.path.dirname(LAB_ROOT).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                         b"size=1m,mode=0755"))
    for fd, is_dir, path, writable in held:
        os.makedirs(path if is_dir else os.path.dirname(path), exist_ok=True)
        if not is_dir:
            open(path, "a").close()
        target = path.encode()
        check(libc.mount(f"/proc/self/fd/{fd}".encode(), target, None, _MS_BIND | _MS_REC, None))
        if not writable:
            check(libc.mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None))
        os.close(fd)
    os.chdir("/tmp")


@functools.cache
def private_tmp_works() -> bool:
    """Without bubblewrap: can the grader give a lab process a /tmp of its own (as root,
    where the kernel lets it make a mount namespace; not in a container without
    CAP_SYS_ADMIN)? If not, each lab process gets a fresh folder of the scratch instead."""
    if os.geteuid() != 0 or not os.path.isdir(os.path.dirname(LAB_ROOT)):
        return False
    _libc()
    try:
        # A shell, not this Python: the Python may live under the /tmp that the probe hides.
        probe = subprocess.run(["/bin/sh", "-c", "touch /tmp/.grader-probe && [ \"$(ls -A /tmp)\" = .grader-probe ] "
                                f"&& [ -d {LAB_ROOT}/probe/bin ]"],
                               preexec_fn=lambda: _private_tmp(1, (("/usr", f"{LAB_ROOT}/probe"),)),
                               capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def python_roots() -> list[str]:
    """Folders the sandboxed Python must read: its installation and the environment's packages."""
    paths = {sys.base_prefix, sys.prefix, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
             sysconfig.get_paths()["stdlib"], str(Path(os.path.realpath(sys.executable)).parent)}
    return sorted({os.path.realpath(p) for p in paths if p})


def site_packages() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])})


def _limit_self(limits: Limits, as_root_drop: bool, uid: int | None = None, cpus=None,
                user_net: bool = False) -> None:
    """Runs in the child between fork and exec (``uid``: drop to it, without bubblewrap,
    after taking a network namespace of its own; ``user_net``: not root, a user and
    network namespace of its own; ``cpus``: the cores it may run on)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_mb * mb, limits.max_file_mb * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() != 0 or as_root_drop or uid is not None:
        # Counted per user: for a dedicated uid this caps the sandbox itself; for a normal
        # user it caps their extra processes while grading.
        try:
            current = len([p for p in os.listdir("/proc") if p.isdigit()]) if os.geteuid() != 0 else 0
        except OSError:
            current = 0
        n = limits.max_processes + current
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails instead of killing
    if uid is not None:  # any failure here raises: the child never runs, least of all as root
        runtime.no_network()
        runtime.drop_privileges(uid)
    elif user_net:
        runtime.no_network()


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


def _bwrap_binds(roots: list[str]) -> list[str]:
    """Read-only binds of the Python installation (and traversable parents for them)."""
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
    return binds


# What /proc shows of every key of a uid (its description included), in any namespace
# that maps the uid: of a lab process that ended a moment before, until the kernel
# collects them. Each sandbox has /dev/null there.
PROC_KEYS = ("/proc/keys", "/proc/key-users")


def _masked_proc() -> list[str]:
    """bubblewrap arguments putting /dev/null over ``PROC_KEYS`` (those this kernel has)."""
    return [arg for path in PROC_KEYS if os.path.exists(path) for arg in ("--ro-bind", "/dev/null", path)]


def _bwrap(roots: list[str], mounts: list[str], chdir: str, uid: int | None) -> list[str]:
    """The bubblewrap prefix: own PID, network, IPC and mount namespaces; only ``mounts``
    (and the Python installation, read-only) exist; as root, run as ``uid``."""
    prefix = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
              "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", *([] if uid is not None else ["--unshare-user"]),
              "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
              "--symlink", "usr/bin", "/bin", "--proc", "/proc", *_masked_proc(), "--dev", "/dev", "--tmpfs", "/tmp",
              *_bwrap_binds(roots), *mounts, "--chdir", chdir]
    if uid is not None:
        prefix += ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                   "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    return prefix


def _chown_tree(path: Path, uid: int) -> None:
    for dirpath, _dirnames, filenames in os.walk(path):
        os.chown(dirpath, uid, uid)
        for f in filenames:
            os.chown(os.path.join(dirpath, f), uid, uid)


def _reachable(scratch: Path) -> None:
    """As root without bubblewrap the sandboxed processes are other users: every folder
    above the scratch folder must let others through (``o+x``), or grading is refused."""
    for parent in reversed(scratch.parents):
        if not os.stat(parent).st_mode & 0o001:
            raise SandboxRefused(f"refusing to grade as root without bubblewrap: {parent} does not let other users "
                                 "through (chmod o+x), and the sandboxed processes run as other users; grade into "
                                 "a folder they can reach")


def _config_pipe(config: dict) -> int:
    """The read end of a pipe that holds ``config`` as JSON (inheritable): how the grader
    hands a lab process its configuration, with no file that lab code could replace."""
    data = json.dumps(config).encode()
    r, w = os.pipe()
    try:
        if len(data) > 65536:
            raise ValueError("a lab process's configuration over 64 KiB")
        os.write(w, data)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    os.set_inheritable(r, True)
    return r


def _open_log(scratch: Path, name: str, reading: bool = False):
    """A lab's log in ``slogs/``, a folder only the grader may write in; opened without
    following a link (and, reading, only a plain file), so that nothing the lab code did
    turns the grader's write (or read) into another file's."""
    d = os.open(scratch / "slogs", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        flags = os.O_RDONLY if reading else os.O_WRONLY | os.O_APPEND | os.O_CREAT
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644, dir_fd=d)
    finally:
        os.close(d)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (os.geteuid() == 0 and st.st_uid != 0):
        os.close(fd)
        raise OSError(f"slogs/{name} is not the grader's own file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb" if reading else "ab")


def _log_name(lab: str, phase: str) -> str:
    """The file in ``slogs/`` that a lab process's printed output goes to. The hidden phase
    has its own, which the grader never reads back: nothing a student sees (the printed-size
    note among them) depends on what the lab printed while the hidden tests ran."""
    return f"{lab}.txt" if phase == "public" else f"{lab}.{phase}.txt"


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a live process and its descendants (its reaped children included)."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        cpu = labserver.proc_cpu(p)
        if cpu is None:
            continue
        total += cpu
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return total


@dataclass
class _LabProcess:
    proc: subprocess.Popen | None  # None: forked by the zygote, known there as ``pid``
    lab: str
    pid: int = 0
    cpu: float = 0.0  # once ended: its CPU time (rusage)
    status: dict = field(default_factory=dict)
    home: str = ""  # its scratch folder as the host sees it ("": its own /tmp, a tmpfs)
    handoff: str = ""  # its hand-off folder as the host sees it (see ``_LabProcesses.handoff``)
    phase: str = "public"  # the tests it serves: "public", or "hidden" (what it does there is never reported)

    @property
    def seen_as(self) -> str:
        """Its key in ``observed``: a hidden-phase process's peak memory, disk use and deaths
        are kept apart from its lab's, so no note a student reads carries a bit of them (a
        hidden test's inputs could set the size of what it keeps)."""
        return self.lab if self.phase == "public" else f"{self.lab} (hidden phase)"


def _tree_leaf(pid: int) -> int:
    """The last descendant of ``pid`` (itself if none): inside bubblewrap's namespaces."""
    while True:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                children = fh.read().split()
        except OSError:
            return pid
        if not children:
            return pid
        pid = int(children[-1])


def _peak_mb(pid: int) -> int:
    """The peak address space of a process so far (VmPeak: what its memory limit caps), in
    MB; 0 if unknown."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _folder_bytes(path: str) -> int:
    """What a folder holds against the disk quota: its entries' blocks, and
    ``ENTRY_BYTES`` for each entry."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512 + ENTRY_BYTES
            except OSError:
                pass
    return total


def _empty_folder(path: Path) -> None:
    """Remove a lab process's scratch folder, whatever modes its files were left with."""
    def retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        except OSError:
            pass
        func(p)

    shutil.rmtree(path, onerror=retry)


class _LabProcesses:
    """The grader's side of the control socket: starts a fresh lab process on request
    (its own sandbox, uid and interpreter; given only its end of a new socket, whose
    other end goes to the test process), reports its CPU time, ends it."""

    def __init__(self, scratch: Path, inside: Path, limits: Limits, mode: str, slot: int, env: dict,
                 labs: dict[str, list[str]], cpus=None, zygote: bool = False, kit: Path | None = None,
                 rt: runtime.Runtime | None = None):
        self.scratch, self.inside, self.limits, self.mode, self.env = scratch, inside, limits, mode, env
        self.outside = inside  # the scratch folder as the test process sees it (``handoff``)
        self.rt = rt or sandbox_runtime(mode)
        self.kit = kit or scratch / "kit"
        self.cpus = cpus
        self.labs = labs  # lab → the lab folders of its tree (earlier labs and itself)
        # As root, each lab's process is its own user, owner of its own tree alone: lab 03's
        # code cannot read the reference bytecode of lab 03 that lab 04's tree holds. With
        # the zygote, the kernel's Landlock fence does that, and the labs share one user.
        # As root, always (sandbox_runtime refused otherwise): no lab code runs as root.
        self.drop = os.geteuid() == 0
        self.user_net = not self.drop and mode != "bwrap" and runtime.user_network_namespace()
        self.uids = {lab: LAB_UID + 64 * slot + (0 if zygote else i) for i, lab in enumerate(labs)}
        self.use_zygote = zygote
        self.own_namespaces = own_namespaces(mode)  # each lab process its user and IPC namespace
        self.zygote = None  # (process, control socket), started by start_zygote
        self.zygote_ready = False
        self.procs: dict[int, _LabProcess] = {}
        self.next_sid = 1
        self.lock = threading.Lock()
        self.zlock = threading.Lock()  # one request at a time on the zygote's socket
        self.kill_lock = threading.RLock()  # the test process and the disk watcher both end processes
        # Each lab process's scratch folder (HOME, TMPDIR, working folder): its own /tmp, a
        # tmpfs in its own mount namespace (bubblewrap's, or one the grader makes as root);
        # elsewhere a fresh folder of the scratch, ``ltmp/<n>``.
        self.private_tmp = mode == "bwrap" or private_tmp_works()
        # Without bubblewrap, what a lab process needs of a scratch folder under the host's
        # /tmp (which its own /tmp hides) is bound back read-only.
        self.keep = tuple(p for p in self.rt.roots if p.startswith("/tmp/"))
        if self.private_tmp and mode != "bwrap":
            self.inside = Path(LAB_ROOT)  # the lab process's view of the scratch folder: see _lab_binds
        self.homes = 0
        # the hand-off tree, as the host and as the test process see it (``_handoff_root``)
        self.handoff_host, self.handoff_seen = scratch / "handoff", str(self.outside / "handoff")
        self.observed: dict[str, dict] = {}  # lab → what the grader saw (RawRun.observed)

    def serve(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            fds, req = [], {}
            try:
                req = json.loads(data)
                op = req.get("op")
                if op == "spawn":
                    reply, fds = self.spawn(str(req.get("lab", "")), str(req.get("phase", "public")))
                elif op == "cpu":
                    reply = {"cpu": self.cpu(int(req["sid"]))}
                elif op == "memory":
                    reply = {"peak_kb": self.peak_resident_kb(int(req["sid"]))}
                elif op == "kill":
                    reply = self.kill(int(req["sid"]), grace=min(2.0, float(req.get("grace", 0))))
                else:
                    reply = {"error": f"unknown request {op!r}"}
            except Exception as exc:  # noqa: BLE001 - the test process gets the reason
                reply = {"error": f"the grader could not do that: {type(exc).__name__}: {exc}"}
            if isinstance(req, dict):
                reply["id"] = req.get("id")  # the test process matches the reply to its request
            try:
                socket.send_fds(sock, [json.dumps(reply).encode()], [f.fileno() for f in fds])
            except OSError:
                return
            finally:
                for f in fds:
                    f.close()

    def _common_mounts(self) -> list[str]:
        """A lab process's sandbox: no folder of the test process or of another lab process;
        its own /tmp, a tmpfs of the disk quota (mounted over the one ``_bwrap`` makes)."""
        inside = self.inside
        return ["--perms", "0755", "--dir", str(inside), "--perms", "0755", "--dir", str(inside / "kit"),
                "--perms", "0755", "--dir", str(inside / "impl"), "--perms", "0755", "--dir", str(inside / "lib"),
                "--perms", "0755", "--dir", str(inside / "lcfg"),
                "--ro-bind", str(self.kit / "gptkit"), str(inside / "lib" / "gptkit"),
                # also where the tests see it: a test hands lab code paths of the kit's data files
                "--ro-bind", str(self.kit / "gptkit"), str(inside / "kit" / "gptkit"),
                "--ro-bind", str(self.kit / "_grader_labserver.py"),
                str(inside / "kit" / "_grader_labserver.py"),
                "--perms", "1777", "--size", str(tmpfs_bytes(self.limits.disk_mb)), "--tmpfs", "/tmp",
                # a Python installation under the host's /tmp, read-only again over the new /tmp
                *(_bwrap_binds(under_tmp) if (under_tmp := [r for r in self.rt.roots if r.startswith("/tmp/")])
                  else [])]

    def _new_home(self, lab: str) -> str:
        """A lab process's scratch folder, as the host sees it ("" for its own /tmp)."""
        if self.private_tmp:
            return ""
        self.homes += 1
        home = self.scratch / "ltmp" / str(self.homes)
        home.mkdir(parents=True, mode=0o700)
        if self.drop:
            os.chown(home, self.uids[lab], -1)
        return str(home)

    def _lab_binds(self, labs) -> tuple:
        """Without bubblewrap, with its own /tmp: the parts of the scratch folder a lab process
        sees (under ``LAB_ROOT``), as bubblewrap's mounts give them: ``gptkit``, the lab
        server, the import path's ``lib/``, the configuration, ``labs``' trees."""
        s, root = self.scratch, Path(LAB_ROOT)
        return ((s / "kit" / "gptkit", root / "kit" / "gptkit"),
                (s / "kit" / "_grader_labserver.py", root / "kit" / "_grader_labserver.py"),
                (s / "lib", root / "lib"), (s / "lcfg", root / "lcfg"),
                (s / "kit" / "gptkit", self.outside / "kit" / "gptkit"),  # where the tests see it (data files)
                *((s / "impl" / lab, root / "impl" / lab) for lab in labs))

    def _inside_home(self, home: str) -> str:
        return "/tmp" if not home else home.replace(str(self.scratch), str(self.inside), 1)

    def _popen(self, cmd: list[str], uid_of: str, log, pass_fds, home: str = "", labs=(), rw=()) -> subprocess.Popen:
        """Start ``cmd`` in its sandbox (bubblewrap's mounts already in ``cmd``), as the
        user of lab ``uid_of`` where the grader runs as root, in its scratch folder ``home``
        (its own /tmp if ""), seeing ``labs``' trees."""
        uid = self.uids[uid_of] if self.drop and self.mode != "bwrap" else None  # bwrap drops to it itself
        own_tmp = self.private_tmp and self.mode != "bwrap"  # bwrap mounts it itself
        where = self._inside_home(home)
        binds = self._lab_binds(labs) if own_tmp else ()
        if own_tmp:
            _libc()

        def child():
            if own_tmp:
                _private_tmp(self.limits.disk_mb, binds, self.keep, rw)
            _limit_self(self.limits, self.mode == "bwrap" and os.geteuid() == 0, uid, self.cpus, self.user_net)

        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                pass_fds=pass_fds, cwd=home or str(self.scratch / "lcfg"),
                                env={**self.env, "HOME": where, "TMPDIR": where},
                                start_new_session=True, preexec_fn=child)

    def start_zygote(self) -> None:
        """The process that forks every lab's process of this submission (``labserver.py``):
        started now, so that its start-up overlaps the test process's."""
        inside, scratch = self.inside, self.scratch
        first = next(iter(self.labs))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        base = _config_pipe({"sys_path": [str(inside / "lib"), *self.rt.site]})
        cmd = [self.rt.executable, "-I", "-S", "-B", str(inside / "kit" / "_grader_labserver.py"), "--zygote",
               str(theirs.fileno()), str(base)]
        if self.mode == "bwrap":
            mounts = [*self._common_mounts(), "--bind", str(self.handoff_host), self.handoff_seen]
            for lab in self.labs:
                mounts += ["--ro-bind", str(scratch / "impl" / lab), str(inside / "impl" / lab)]
            cmd = _bwrap(self.rt.roots, mounts, "/tmp", self.uids[first] if self.drop else None) + cmd
        with _open_log(scratch, ".zygote.txt") as log:
            try:
                proc = self._popen(cmd, first, log, (theirs.fileno(), base), labs=list(self.labs),
                                   rw=((str(self.handoff_host), self.handoff_seen),))
            finally:
                theirs.close()
                os.close(base)
        ours.settimeout(120)
        self.zygote = (proc, ours)

    def _ask_zygote(self, req: dict, fds=()) -> dict:
        with self.zlock:
            return self._ask_zygote_now(req, fds)

    def _ask_zygote_now(self, req: dict, fds=()) -> dict:
        proc, ctl = self.zygote
        if not self.zygote_ready:
            if json.loads(ctl.recv(65536) or b"{}").get("ready") is not True:
                raise OSError("the lab processes' zygote did not start")
            self.zygote_ready = True
        socket.send_fds(ctl, [json.dumps(req).encode()], list(fds))
        data = ctl.recv(65536)
        if not data:
            raise OSError("the lab processes' zygote ended")
        reply = json.loads(data)
        if "error" in reply:
            raise OSError(reply["error"])
        return reply

    def handoff(self, lab: str, phase: str) -> tuple[Path, str]:
        """The folder that pytest's ``tmp_path`` lives in while ``lab``'s ``phase`` (its public
        tests, then its hidden ones) runs (the test process's plugin points it there): as the
        host sees it, and the path at which both the test process and that lab's process see
        it. No other lab process sees it, and the hidden phase has its own."""
        if phase not in HANDOFF_PHASES:
            raise ValueError(f"no phase {phase!r}")
        return self.handoff_host / lab / phase, f"{self.handoff_seen}/{lab}/{phase}"

    def _config(self, lab: str, home: str, phase: str = "public") -> dict:
        """What a lab process may import, read and write: its lab's tree, ``gptkit`` (on
        the import path through ``lib/``, which holds nothing else: the kit's tests and
        hidden tests cannot even be listed), the Python installation, and its own scratch
        folder ``home`` (its own /tmp if ""), which the zygote empties before it forks."""
        inside = self.inside
        gptkit = inside / ("lib" if self.mode == "bwrap" else "kit") / "gptkit"
        where = self._inside_home(home)
        return {"sys_path": [*(str(inside / "impl" / lab / d) for d in self.labs[lab]), str(inside / "lib"),
                             *self.rt.site],
                "impl": str(inside / "impl" / lab), "student_path": str(inside / "impl" / lab),
                "home": where, "empty_home": not home, "own_namespaces": self.own_namespaces,
                "read_roots": [*self.rt.roots, str(inside / "impl" / lab), str(gptkit),
                               str(inside / "kit" / "_grader_labserver.py"), where, self.handoff(lab, phase)[1],
                               str(self.outside / "kit" / "gptkit"),
                               "/usr/lib", "/usr/share/zoneinfo", "/etc/localtime",
                               "/dev/null", "/dev/urandom"],
                "write_roots": [where, self.handoff(lab, phase)[1], "/dev/null"]}

    def spawn(self, lab: str, phase: str = "public"):
        if lab not in self.labs:
            return {"error": f"no lab {lab!r} in this run"}, []
        host_handoff, seen_handoff = self.handoff(lab, phase)
        # One lab runs at a time: a process still alive belongs to a lab whose tests are over
        # (its test process was stopped past the lab's time limit), and must not keep a core.
        for sid in [sid for sid, p in self.procs.items() if not p.status]:
            self.kill(sid)
        home = self._new_home(lab)
        if self.zygote is not None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with _open_log(self.scratch, _log_name(lab, phase)) as log:
                    pid = self._ask_zygote({"op": "spawn", "config": self._config(lab, home, phase)},
                                           (theirs.fileno(), log.fileno()))["pid"]
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            with self.lock:
                sid, self.next_sid = self.next_sid, self.next_sid + 1
                self.procs[sid] = _LabProcess(None, lab, int(pid), home=home, handoff=str(host_handoff), phase=phase)
            return {"sid": sid}, [ours]
        inside, scratch = self.inside, self.scratch
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = self._config(lab, home, phase)
        cfg = _config_pipe(config)  # never a file: lab code could swap a file for a link
        cmd = [self.rt.executable, "-I", "-S", "-B", str(inside / "kit" / "_grader_labserver.py"),
               str(theirs.fileno()), str(cfg)]
        if self.mode == "bwrap":
            mounts = [*self._common_mounts(), "--ro-bind", str(scratch / "impl" / lab), str(inside / "impl" / lab),
                      *_parents(seen_handoff, inside), "--bind", str(host_handoff), seen_handoff]
            cmd = _bwrap(self.rt.roots, mounts, "/tmp", self.uids[lab] if self.drop else None) + cmd
        log = _open_log(scratch, _log_name(lab, phase))
        try:
            proc = self._popen(cmd, lab, log, (theirs.fileno(), cfg), home, labs=[lab],
                               rw=((str(host_handoff), seen_handoff),))
        finally:
            log.close()
            theirs.close()
            os.close(cfg)
        with self.lock:
            sid, self.next_sid = self.next_sid, self.next_sid + 1
            self.procs[sid] = _LabProcess(proc, lab, home=home, handoff=str(host_handoff), phase=phase)
        return {"sid": sid}, [ours]

    def cpu(self, sid: int) -> float:
        p = self.procs[sid]
        if p.status:
            return p.cpu
        if p.proc is None:
            return float(self._ask_zygote({"op": "cpu", "pid": p.pid})["cpu"])
        return _tree_cpu(p.proc.pid)

    def peak_resident_kb(self, sid: int) -> int | None:
        """A lab process's peak resident memory so far (VmHWM, KiB), read by the host (or the
        zygote) from /proc, out of the lab code's reach; None if unknown."""
        p = self.procs[sid]
        if p.status:
            return int(p.status.get("maxrss_kb", 0) or 0) or None
        if p.proc is None:
            return self._ask_zygote({"op": "memory", "pid": p.pid}).get("peak_kb")
        return labserver.proc_peak_kb(_tree_leaf(p.proc.pid))

    def kill(self, sid: int, grace: float = 0.0) -> dict:
        """End a lab process (after ``grace`` seconds to end by itself); its exit status and CPU time."""
        with self.kill_lock:
            p = self.procs[sid]
            first = not p.status
            reply = self._kill(p, grace)
            if first:
                self._observe(p, grace)
            return reply

    def _observe(self, p: _LabProcess, grace: float) -> None:
        """What the grader itself saw of a lab process that has just ended (``grace`` > 0:
        the test process found it gone or unanswering): its peak memory, whether it ended
        by itself. Its scratch folder goes."""
        seen = self.observed.setdefault(p.seen_as, {})
        peak = int(p.status.get("maxrss_kb", 0) or 0) // 1024
        seen["memory"] = max(seen.get("memory", 0), peak)
        if grace > 0 or not p.status.get("ended_by_grader", False):
            seen["died"] = seen.get("died", 0) + 1
        if p.home:
            _empty_folder(Path(p.home))

    def _holder(self, p: _LabProcess) -> int:
        """A host pid inside a live lab process's sandbox: its own, or that of the zygote's tree."""
        if p.proc is None:
            return _tree_leaf(self.zygote[0].pid) if self.zygote is not None else 0
        return _tree_leaf(p.proc.pid)

    def _disk_used(self, p: _LabProcess) -> int | None:
        """Bytes a live lab process keeps in its scratch folder and its hand-off folder,
        as the host measures them, ``ENTRY_BYTES`` for each file, folder or link among them
        (None if it cannot): its own /tmp is seen through ``/proc/<pid>/root``, and only a
        tmpfs of the quota's size counts (not a /tmp it does not have yet)."""
        extra = _folder_bytes(p.handoff) if p.handoff else 0
        if p.home:
            return _folder_bytes(p.home) + extra
        holder = self._holder(p)
        if not holder:
            return None
        try:
            st = os.statvfs(f"/proc/{holder}/root/tmp")
        except OSError:
            return None
        if st.f_blocks * st.f_frsize != tmpfs_bytes(self.limits.disk_mb):
            return None
        return (st.f_blocks - st.f_bfree) * st.f_frsize + (st.f_files - st.f_ffree) * ENTRY_BYTES + extra

    def watch_disk(self, stop: threading.Event, every: float = 0.1) -> None:
        """The disk quota: a lab process that keeps more than ``Limits.disk_mb`` in its
        scratch folder is stopped, and the grader notes it (its own /tmp is a tmpfs that
        size too: the kernel stops the writes a moment later anyway). Also notes each
        live process's peak address space."""
        quota = self.limits.disk_mb * 1024 * 1024
        while not stop.wait(every):
            for sid, p in list(self.procs.items()):
                if p.status:
                    continue
                seen = self.observed.setdefault(p.seen_as, {})
                peak = _peak_mb(self._holder(p))  # also kept at its end (rusage), where the host reaps it
                seen["memory"] = max(seen.get("memory", 0), peak)
                used = self._disk_used(p)
                if used is not None and used > quota:
                    seen["disk"] = max(seen.get("disk", 0), used // (1024 * 1024))
                    self.kill(sid)

    def _kill(self, p: _LabProcess, grace: float) -> dict:
        if not p.status and p.proc is None:
            try:
                reply = self._ask_zygote({"op": "end", "pid": p.pid, "grace": grace})
                p.cpu = float(reply.pop("cpu"))
                p.status = reply
            except (OSError, ValueError, KeyError):
                p.status = {"exit": -1, "signal": 0}
        if not p.status:
            p.cpu = _tree_cpu(p.proc.pid)
            try:
                end = labserver.end_process(p.proc.pid, grace, lambda pid: os.killpg(pid, signal.SIGKILL))
            except ChildProcessError:
                p.status = {"exit": -1, "signal": 0}
            else:
                if not end["ended_by_grader"]:
                    try:
                        os.killpg(p.proc.pid, signal.SIGKILL)  # anything it left behind
                    except OSError:
                        pass
                p.proc.returncode = end["exit"] if end["exit"] >= 0 else -end["signal"]
                # (killed by us: SIGKILL; a process that ended by itself shows its own status)
                p.cpu = max(p.cpu, end.pop("cpu"))
                p.status = end
        return {"cpu": p.cpu, **p.status}

    def stop_all(self) -> None:
        for sid in list(self.procs):
            self.kill(sid)
        if self.zygote is not None:
            proc, ctl = self.zygote
            ctl.close()  # it ends when the socket does
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()


def run(scratch: Path, jobs: list[dict], limits: Limits, *, slot: int = 0, mode: str | None = None,
        module_labs: dict[str, str] | None = None, cpus=None, kit: Path | None = None) -> RawRun:
    """Run the planned lab jobs inside ``scratch`` (which holds ``kit/``, ``impl/``,
    ``work/``, ``tmp/``) and return every event the test process reported.

    Two kinds of process, each in its own sandbox: the test process (the kit's tests, the
    results pipe, no lab code) and, started on its request, a lab process per lab (the
    submission's code, nothing else). ``kit``: under bubblewrap, the folder mounted
    read-only as ``kit/`` (the grader's cached kit, which then needs no copy per
    submission); otherwise ``scratch`` holds its copy. ``cpus``: the cores that both may run on (when
    submissions are graded side by side, each its own: the two processes take turns, and a
    request's answer then never waits for, or moves to, a core the other submission holds)."""
    mode = mode or isolation_mode()
    scratch = Path(scratch).resolve()
    kit = Path(kit).resolve() if kit is not None and mode == "bwrap" else scratch / "kit"
    inside = Path(SANDBOX_ROOT) if mode == "bwrap" else scratch
    token = secrets.token_hex(16)
    r_fd, w_fd = os.pipe()
    os.set_inheritable(w_fd, True)
    ctl_ours, ctl_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ctl_theirs.set_inheritable(True)
    rt = sandbox_runtime(mode)  # as root without bubblewrap: SandboxRefused rather than run as root
    if mode != "bwrap" and os.geteuid() == 0:
        _reachable(scratch)
    roots = list(rt.roots)
    for sub in ("logs", "slogs", "lcfg", "lib"):
        (scratch / sub).mkdir(exist_ok=True)
    handoff = _handoff_root(scratch, mode)
    handoff_seen = str(inside / "handoff") if handoff == scratch / "handoff" else str(handoff)
    for j in jobs:  # pytest's tmp_path for each lab and phase, shared with that lab's process alone
        for phase in HANDOFF_PHASES:
            d = handoff / j["lab"] / phase
            d.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                os.chown(d, TEST_UID + slot, TEST_UID + slot)  # pytest makes its folders there as the owner
            d.chmod(0o777)
    for d in (handoff, *(p for p in handoff.iterdir())):
        d.chmod(0o755)
    if mode != "bwrap":  # the lab process's import path holds gptkit and nothing else of the kit
        (scratch / "lib" / "gptkit").symlink_to(Path("..") / "kit" / "gptkit")
    plan = {
        "sys_path": [str(inside / "kit"), *rt.site],
        "results_fd": w_fd,
        "ctl_fd": ctl_theirs.fileno(),
        "test_cpu_seconds": limits.test_seconds,
        "test_wall_seconds": limits.test_wall_seconds,
        "lab_cpu_seconds": limits.lab_seconds,
        "module_labs": module_labs or {},
        "pytest_args": ["-q", "-s", "-p", "no:cacheprovider", "-p", "no:randomly", "-m", "not torch",
                        f"--rootdir={inside / 'kit'}", "-c", str(inside / "kit" / "pyproject.toml"),
                        "--tb=line", "-W", "ignore"],
        # Each pytest session its own folder (this, then -1, -2, …): pytest empties it first, and
        # the files an earlier session's lab processes wrote there may belong to other users.
        "basetemp": str(inside / "tmp" / "pytest"),
        "log": str(inside / "logs" / "tests.txt"),
        "jobs": [{"lab": j["lab"], "tests": [str(inside / "kit" / t) for t in j["tests"]],
                  "timeout": limits.lab_wall_seconds} for j in jobs],
    }
    (scratch / "plan.json").write_text(json.dumps(plan))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(inside / "work"), "TMPDIR": str(inside / "tmp"),
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8",
           # Only the plugins the kit names: autoloading every installed one (anyio's comes
           # with the torch extra) cost more than a lab's tests.
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "HYPOTHESIS_STORAGE_DIRECTORY": str(inside / HYPOTHESIS_DIR), "GRADER_HANDOFF": handoff_seen,
           **rt.env}
    lab_env = {**{k: env[k] for k in ("PATH", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                      "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "LANG")},
               **rt.env}  # + HOME, TMPDIR: its own
    root = os.geteuid() == 0
    (scratch / "tmp").chmod(0o1777)  # the test process's (pytest's basetemp, Hypothesis): never a lab process's
    (scratch / "slogs").chmod(0o755)  # the grader's alone: lab output comes to it as an open file
    if root:
        # The lab process runs as another user: the tests, fixtures and hidden tests are
        # the test process's alone (bubblewrap does not even mount them for the lab process).
        if kit == scratch / "kit":  # bubblewrap mounts no tests in the lab process's sandbox at all
            _chown_tree(kit / "tests", TEST_UID + slot)
            (kit / "tests").chmod(0o700)
        _chown_tree(scratch / "work", TEST_UID + slot)
        _chown_tree(scratch / "logs", TEST_UID + slot)
    cmd = [rt.executable, "-I", "-S", "-B", str(inside / "kit" / "_grader_boot.py"), str(inside / "plan.json")]
    drop_uid = None
    if mode == "bwrap":
        mounts = ["--bind", str(scratch), SANDBOX_ROOT, "--ro-bind", str(kit), str(inside / "kit"),
                  "--tmpfs", str(inside / "impl")]
        cmd = _bwrap(roots, mounts, str(inside / "work"), TEST_UID + slot if root else None) + cmd
    elif root:  # sandbox_runtime refused already if it could not
        drop_uid = TEST_UID + slot
    labs = {j["lab"]: sorted(p.name for p in (scratch / "impl" / j["lab"]).iterdir() if p.is_dir())
            for j in jobs}
    children = _LabProcesses(scratch, inside, limits, mode, slot, lab_env, labs, cpus,
                             zygote=USE_ZYGOTE and kernel_walls(), kit=kit, rt=rt)
    children.handoff_host, children.handoff_seen = handoff, handoff_seen
    if children.drop:
        for lab, uid in children.uids.items():
            _chown_tree(scratch / "impl" / lab, uid)
            (scratch / "impl" / lab).chmod(0o700)
    if children.use_zygote:
        children.start_zygote()
    watching = threading.Event()
    watcher = threading.Thread(target=children.watch_disk, args=(watching,), daemon=True)
    watcher.start()
    out_chunks: list[bytes] = []
    res_chunks: list[bytes] = []
    flags: dict = {}
    start = time.monotonic()
    _undumpable()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            pass_fds=(w_fd, ctl_theirs.fileno()), cwd=str(scratch / "work"), env=env,
                            start_new_session=True,
                            preexec_fn=lambda: _limit_self(limits, mode == "bwrap" and root, drop_uid, cpus,
                                                           children.user_net))
    os.close(w_fd)
    ctl_theirs.close()
    results = os.fdopen(r_fd, "rb")
    threads = [threading.Thread(target=_drain, args=(proc.stdout, limits.max_output_kb * 1024, out_chunks, flags),
                                daemon=True),
               threading.Thread(target=_drain, args=(results, 64 * 1024 * 1024, res_chunks, {}), daemon=True),
               threading.Thread(target=children.serve, args=(ctl_ours,), daemon=True)]
    for t in threads:
        t.start()
    try:
        proc.stdin.write(token.encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    killed = ""
    while proc.poll() is None:
        if time.monotonic() - start > limits.wall_seconds:
            killed = f"stopped after the {limits.wall_seconds:g} s wall-clock backstop for a whole submission"
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
    for t in threads[:2]:
        t.join(timeout=5)
    ctl_ours.close()
    threads[2].join(timeout=5)
    watching.set()
    watcher.join(timeout=5)
    children.stop_all()
    results.close()
    if handoff != scratch / "handoff":
        shutil.rmtree(handoff, ignore_errors=True)
    raw = RawRun(output=b"".join(out_chunks).decode("utf-8", "replace"), killed=killed,
                 returncode=proc.returncode, seconds=time.monotonic() - start, isolation=mode,
                 observed=children.observed)
    for j in jobs:
        try:
            fh = _open_log(scratch, f"{j['lab']}.txt", reading=True)
        except OSError:
            continue
        with fh:
            size = os.fstat(fh.fileno()).st_size
            raw.lab_output[j["lab"]] = fh.read(limits.max_output_kb * 1024).decode("utf-8", "replace")
        raw.lab_output_bytes[j["lab"]] = size
    pairs = _neutral_paths(rt, scratch, str(inside), handoff_seen)
    for line in b"".join(res_chunks).decode("utf-8", "replace").splitlines():
        event = protocol.decode(line, token)  # anything else was not written by the test process
        if event is None:
            raw.dropped += 1
        else:
            raw.events.append(_same_paths(event, pairs))
    return raw


def _undumpable() -> None:
    """The grader itself: no process of its user may read its memory or trace it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _neutral_paths(rt: runtime.Runtime, scratch: Path, inside: str, handoff: str) -> list[tuple[str, str]]:
    """(host path, placeholder) pairs, longest first: what every message a student sees
    says instead of a path of the grading machine. The scratch folder and the hand-off tree
    are named as bubblewrap shows them (``/sandbox``, ``/sandbox/handoff``): the same
    submission gets the same message whatever the isolation; the Python the sandboxed
    processes run (its executable, its installation and packages, the public runtime's
    folder) becomes ``<python>``, ``<site-packages>``, ``<python-runtime>``."""
    pairs = {handoff: f"{SANDBOX_ROOT}/handoff", inside: SANDBOX_ROOT, str(scratch): SANDBOX_ROOT,
             LAB_ROOT: SANDBOX_ROOT, runtime.RUNTIMES: "<python-runtime>"}
    python = {*rt.roots, os.path.dirname(rt.executable), sys.prefix, sys.base_prefix, sys.exec_prefix}
    python |= {os.path.realpath(p) for p in python if p}
    for path in python:
        parts = Path(path).parts if path else ()
        # not a system folder every machine has (/usr, /usr/lib): those say nothing of this one
        if len(parts) >= 4 or (len(parts) == 3 and parts[1] != "usr"):
            pairs.setdefault(path, "<python>")
    for path in {*rt.site, *(os.path.realpath(p) for p in rt.site)}:
        pairs[path] = "<site-packages>"
    for exe in {rt.executable, os.path.realpath(rt.executable), sys.executable}:
        pairs[exe] = "<python>/bin/python"
    return sorted(((host, neutral) for host, neutral in pairs.items() if host and host != neutral),
                  key=lambda pair: -len(pair[0]))


def _same_paths(event: protocol.Event, pairs: list[tuple[str, str]]) -> protocol.Event:
    """The event with every host path of ``pairs`` (``_neutral_paths``) replaced in its text."""

    def same(text: str) -> str:
        for host, neutral in pairs:
            text = text.replace(host, neutral)
        return text

    return dataclasses.replace(event, **{f.name: same(getattr(event, f.name)) for f in dataclasses.fields(event)
                                         if isinstance(getattr(event, f.name), str)})


def boot_files() -> dict[str, Path]:
    """The files copied into every scratch ``kit/`` folder."""
    return {"_grader_boot.py": HERE / "boot.py", "_grader_plugin.py": HERE / "plugin.py",
            "_grader_protocol.py": HERE / "protocol.py", "_grader_labserver.py": HERE / "labserver.py"}
