"""The kernel's and the users' walls around lab code, in both modes that lack nothing:
under bubblewrap, and as root without it (``GRADER_NO_BWRAP=1``: containers, CI runners,
Gradescope). Each attack is appended to lab 01's stub, so that honestly it scores 0; its
correct answers are switched on only if the attack works (``WON``). The audit hook is
taken out of the lab process here (a patched ``labserver.py``), so that each attack
meets the kernel's walls and the users alone. Every mode grades one batch: an honest
student, every attack, another honest student."""

import json
import os
import shutil
import socket
import threading
import time

import pytest

from gptkit.testing.layout import KIT_ROOT
from grader import cli
from grader.grade import Grader
from grader.sandbox import runner, runtime

from .conftest import ALICE, FAST, reachable_dir, use_lab_server

CM = "01_causal_mask"
STUB = (KIT_ROOT / "labs" / CM / "src" / "causal_mask.py").read_text()
HONEST = (ALICE / "labs" / CM / "src" / "causal_mask.py").read_text()

# What every attack starts with: the attack sets WON when it got what it wanted.
HEAD = """
import ctypes, errno, fcntl, os, signal, socket, stat, struct, sys, threading, time
WON = False
def _status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return {k: v.strip() for k, v in fields.items()}
def _sockets():
    out = []
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                out.append(fd)
        except OSError:
            pass
    return out
def _peer_pids():
    pids = set()
    for fd in _sockets():
        s = socket.socket(fileno=os.dup(fd))
        try:
            pid, _uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if pid > 0:
                pids.add(pid)
        except OSError:
            pass
        finally:
            s.close()
    return pids
"""

ATTACKS = {
    # A block device for the disk the scratch folder is on (made: the breach), then its
    # first sector (where no device cgroup stops root).
    "mknod_disk": """
dev = os.stat(".").st_dev
for where in (".", os.environ.get("TMPDIR", ".")):
    node = os.path.join(where, "disk")
    try:
        os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(os.major(dev), os.minor(dev)))
        WON = True
        with open(node, "rb") as fh:
            fh.read(512)
    except OSError:
        pass
""",
    # The grader, the test process and the zygote, signalled through a file's owner (SIGIO).
    "fcntl_setown": """
r, w = os.pipe()
targets = {os.getppid(), GRADER_PID, *_peer_pids()}
for fd in [r, w, *_sockets()]:
    try:
        fcntl.fcntl(fd, 10, signal.SIGWINCH)  # F_SETSIG: a harmless signal, if the wall failed
        WON = True
    except OSError:
        continue
    for pid in targets:
        for cmd, arg in ((8, pid), (8, -pid)):  # F_SETOWN: a process, a process group
            try:
                fcntl.fcntl(fd, cmd, arg)
                WON = True
            except OSError:
                pass
        try:
            fcntl.fcntl(fd, 15, struct.pack("ii", 1, pid))  # F_SETOWN_EX, F_OWNER_PID
            WON = True
        except OSError:
            pass
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    except OSError:
        pass
os.write(w, b"x")
""",
    "ioctl_fiosetown": """
r, w = os.pipe()
for fd in [r, w, *_sockets()]:
    for pid in {os.getppid(), GRADER_PID, *_peer_pids()}:
        for req in (0x8901, 0x8902):  # FIOSETOWN, SIOCSPGRP
            try:
                fcntl.ioctl(fd, req, struct.pack("i", pid))
                WON = True
            except OSError:
                pass
""",
    # io_uring: IORING_OP_SOCKET would make a socket past the seccomp filter; setup must fail.
    "io_uring": """
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
nr = {"x86_64": 425, "aarch64": 425}[os.uname().machine]
fd = libc.syscall(ctypes.c_long(nr), ctypes.c_uint(8), params)
WON = fd >= 0
""",
    "tcp_to_host": """
for make in (lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),):
    try:
        s = make()
        s.settimeout(3)
        s.connect(("127.0.0.1", PORT))
        s.sendall(b"attack")
        WON = True
    except OSError:
        pass
""",
    # Correct only where it runs with privileges: root, a capability, or no no_new_privs.
    "privileged": """
st = _status()
caps = [int(st[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
WON = os.getuid() == 0 or os.geteuid() == 0 or any(caps) or st.get("NoNewPrivs") != "1"
""",
    # Far more threads than the cap (the address-space limit alone lets about 200 start).
    "thread_bomb": """
import _thread
threading.stack_size(64 * 1024)
gate = _thread.allocate_lock()
gate.acquire()
def wait():
    with gate:
        pass
started = 0
try:
    while started < 400:
        _thread.start_new_thread(wait, ())
        started += 1
except (RuntimeError, MemoryError):
    pass
gate.release()  # every thread ends: what follows has its memory back
time.sleep(1)
WON = started >= 150
""",
    # Every file the grader might write in a folder lab code can write, swapped for a link
    # to a file outside the scratch folder; then a new lab process is asked for.
    "symlink_swap": """
here = os.getcwd()
if not os.path.exists(os.path.join(here, "swapped")):
    open(os.path.join(here, "swapped"), "w").close()
    top = os.path.dirname(here)
    names = [os.path.join(here, f".server-{LAB}.json"), os.path.join(here, ".zygote.json"),
             os.path.join(top, "slogs", f"{LAB}.txt"), os.path.join(top, "slogs", ".zygote.txt"),
             os.path.join(top, "plan.json"), os.path.join(top, "logs", "tests.txt")]
    for folder in (here, os.environ.get("TMPDIR", here)):
        try:
            names += [os.path.join(folder, n) for n in os.listdir(folder)]
        except OSError:
            pass
    for i, name in enumerate(names):
        target = (CALIBRATION, VICTIM)[i % 2]
        try:
            os.unlink(name)
        except OSError:
            pass
        try:
            os.symlink(target, name)
        except OSError:
            pass
    os._exit(3)
""",
    # Kernel objects that outlive the process or reach another one (issue 37): a key in
    # the uid's keyring (student A's hidden inputs in student B's messages), SysV shared
    # memory, message queues and semaphores, a POSIX message queue. Any one made wins.
    "keyring_and_ipc": """
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
add_key, keyctl, mq_open = {"x86_64": (248, 250, 240), "aarch64": (217, 219, 180)}[os.uname().machine]
made = []
for ring in (-4, -5, -2):  # the user, user-session and process keyrings
    if libc.syscall(ctypes.c_long(add_key), b"user", b"hidden-input", b"0.125", ctypes.c_size_t(5),
                    ctypes.c_int(ring)) >= 0:
        made.append(("key", ring))
if libc.syscall(ctypes.c_long(keyctl), ctypes.c_int(22), ctypes.c_int(-1), ctypes.c_int(-4)) >= 0:
    made.append("persistent keyring")  # KEYCTL_GET_PERSISTENT
for name, call in (("shm", lambda: libc.shmget(0x37, 4096, 0o1000 | 0o600)),
                   ("msg", lambda: libc.msgget(0x37, 0o1000 | 0o600)),
                   ("sem", lambda: libc.semget(0x37, 1, 0o1000 | 0o600)),
                   ("mq", lambda: libc.syscall(ctypes.c_long(mq_open), b"hidden-input", 0o100 | 2, 0o600, None))):
    if call() >= 0:
        made.append(name)
WON = bool(made)
""",
    # Anonymous memory files, inotify on what another process writes, any core it likes.
    "memfd_inotify_affinity": """
libc = ctypes.CDLL(None, use_errno=True)
made = []
try:
    os.close(os.memfd_create("hidden"))
    made.append("memfd")
except OSError:
    pass
if libc.inotify_init1(0) >= 0:
    made.append("inotify")
try:
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    made.append("affinity")
except OSError:
    pass
WON = bool(made)
""",
    # The hand-off folders of the other phase and of other labs: every one this process can
    # write into, beyond its own, is a channel (the public phase writes where the hidden
    # phase's tests run, or reads what they left).
    "handoff_of_others": """
writable = []
for top in ("/tmp", "/sandbox", "/mnt", os.path.dirname(os.getcwd())):
    for dirpath, dirnames, _files in os.walk(top):
        if dirpath.count("/") > 12:
            dirnames[:] = []
            continue
        if os.path.basename(dirpath) == "handoff":
            dirnames[:] = []
            for lab in os.listdir(dirpath):
                for phase in ("public", "hidden"):
                    d = os.path.join(dirpath, lab, phase)
                    try:
                        with open(os.path.join(d, f"probe-{os.getpid()}"), "w") as fh:
                            fh.write("x")
                        writable.append(d)
                    except OSError:
                        pass
WON = len(set(writable)) >= 2
""",
}


def attack_file(name: str, **values) -> str:
    consts = "".join(f"{k} = {v!r}\n" for k, v in values.items())
    # The correct answers are compiled first (an attack may leave little memory), used only if it won.
    return (STUB + "\n" + consts + f"_HONEST = {{}}\nexec({HONEST!r}, _HONEST)\n" + HEAD + ATTACKS[name]
            + "\nif WON:\n    globals().update({k: v for k, v in _HONEST.items() if not k.startswith('__')})\n")


def without_audit_hook(tmp_path):
    """labserver.py with no audit hook: what lab code meets is the kernel and the users."""
    text = (runner.HERE / "labserver.py").read_text()
    assert text.count("    sys.addaudithook(hook)\n") == 1
    patched = tmp_path / "labserver_nohook.py"
    patched.write_text(text.replace("    sys.addaudithook(hook)\n", "    pass  # test: no audit hook\n"))
    files = runner.boot_files()
    return lambda: {**files, "_grader_labserver.py": patched}


class Listener:
    """A TCP listener on the host's 127.0.0.1 that counts the connections it gets."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


def _snapshot(folder):
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d != ".scratch"]
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                with open(p, "rb") as fh:
                    out[p] = fh.read()
    return out


def _mode(mode, monkeypatch):
    if mode == "bwrap":
        monkeypatch.delenv("GRADER_NO_BWRAP", raising=False)
        if runner.isolation_mode() != "bwrap":
            pytest.skip("bubblewrap is missing or does not work here (apt-get install bubblewrap)")
    else:
        if os.geteuid() != 0:
            pytest.skip("the 'root without bubblewrap' mode needs the tests to run as root")
        monkeypatch.setenv("GRADER_NO_BWRAP", "1")
    return mode


@pytest.fixture(scope="module", params=[("bwrap", True), ("bwrap", False), ("root-no-bwrap", True),
                                        ("root-no-bwrap", False)],
                ids=["bwrap-zygote", "bwrap-one-by-one", "root-no-bwrap-zygote", "root-no-bwrap-one-by-one"])
def batch(request, reachable_tmp, tmp_path_factory):
    """``(mode, zygote)``: the lab processes forked by a zygote (where the kernel has both
    walls) or each started alone (as on a kernel without them)."""
    with pytest.MonkeyPatch.context() as mp:
        mode = _mode(request.param[0], mp)
        mp.setattr(runner, "USE_ZYGOTE", request.param[1])
        tmp = tmp_path_factory.mktemp(f"walls-{mode}")
        use_lab_server(mp, without_audit_hook(tmp), "-no-audit-hook")
        out = reachable_dir(reachable_tmp, f"walls-{mode}")
        g = Grader(out, ["01"], limits=FAST, log=lambda *_: None)
        assert g.isolation == ("bwrap" if mode == "bwrap" else "rlimits")
        (g.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
        g.prepare()
        victim = reachable_dir(reachable_tmp, "victim") / "victim.txt"
        victim.write_text("the grader's own file\n")
        listener = Listener()
        values = dict(GRADER_PID=os.getpid(), PORT=listener.port, CALIBRATION=str(g.cache / "calibration.json"),
                      VICTIM=str(victim), LAB=CM)
        subs = tmp / "subs"
        students = ["a_honest", *(f"m_{name}" for name in ATTACKS), "z_honest"]
        for student in students:
            root = subs / student
            shutil.copytree(ALICE, root)
            if student.startswith("m_"):
                (root / "labs" / CM / "src" / "causal_mask.py").write_text(attack_file(student[2:], **values))
        before = _snapshot(out)
        results = {r.student: r for r in g.run_batch([subs / s for s in students])}
        yield {"mode": mode, "grader": g, "results": results, "listener": listener, "victim": victim,
               "before": before, "after": _snapshot(out), "out": out}
        listener.sock.close()


def _points(r):
    return r.labs[CM].points


def test_honest_students_around_the_attacks_keep_full_marks_and_the_gradebook_is_written(batch):
    g, results = batch["grader"], batch["results"]
    full = g.rubric[CM].points
    assert _points(results["a_honest"]) == full and _points(results["z_honest"]) == full, \
        {s: _points(r) for s, r in results.items()}
    assert len(results) == 2 + len(ATTACKS)
    assert (batch["out"] / "gradebook.csv").is_file()
    rows = (batch["out"] / "gradebook.csv").read_text().splitlines()
    assert sum(1 for line in rows if line.startswith(("a_honest", "z_honest", "m_"))) == len(results)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_attack_scores_nothing(batch, attack):
    """mknod of the disk, a file's owner set to signal the grader or the test process
    (fcntl, ioctl), io_uring, TCP to the host, privileges, a thread bomb, a symlink swap,
    keys and IPC objects, memfd/inotify/affinity, another phase's hand-off folder."""
    r = batch["results"][f"m_{attack}"]
    assert _points(r) == 0, (attack, batch["mode"], [t.message[:200] for t in r.labs[CM].tests][:3])


def test_the_host_listener_got_no_connection(batch):
    assert batch["listener"].connections == 0


def test_no_file_outside_the_scratch_changed(batch):
    """The symlink swap: the calibration cache, the grader's records so far and a file
    elsewhere stay as they were (later students' marks: the test above)."""
    assert batch["victim"].read_text() == "the grader's own file\n"
    calib = batch["grader"].cache / "calibration.json"
    assert json.loads(calib.read_text()), "the calibration cache was emptied"
    before, after = batch["before"], batch["after"]
    changed = [p for p in before if after.get(p) != before[p]]  # the caches: kit, reference, calibration
    assert not changed, changed
    assert after.get(str(calib)) == before.get(str(calib))


# -- the drop itself -----------------------------------------------------------------------------
PRIVS = """
import os
st = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
print(os.getuid(), os.geteuid(), *(st[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the drop is what root does")
def test_as_root_the_sandboxed_python_runs_unprivileged_without_network(monkeypatch):
    """The public runtime (or this Python, where others can read it), run as the drop
    runs it: another uid, every capability set empty, no_new_privs, no network."""
    import subprocess

    rt = runtime.for_dropped_user(runner.LAB_UID)
    code = PRIVS + "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 1), 2)\nexcept OSError as e:\n" \
        "    print(type(e).__name__)\n"

    def child():
        runner._limit_self(FAST, False, runner.LAB_UID)

    run = subprocess.run([rt.executable, "-I", "-S", "-c", code], preexec_fn=child, capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", **rt.env}, cwd="/")
    assert run.returncode == 0, run.stderr
    first, second = run.stdout.splitlines()
    assert first.split() == [str(runner.LAB_UID)] * 2 + ["0000000000000000"] * 5 + ["1"], first
    assert second == "OSError" or "Network is unreachable" in second or second.endswith("Error"), second


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is root's")
def test_without_a_usable_drop_grading_is_refused_in_one_line(monkeypatch, tmp_path, capsys):
    """No Python that an unprivileged user can run, and no public copy: grading refuses
    (one line), rather than run lab code as root."""
    monkeypatch.setenv("GRADER_NO_BWRAP", "1")
    monkeypatch.setattr(runtime, "_chosen", [])
    monkeypatch.setattr(runtime, "probe", lambda rt, uid: "Permission denied")

    def fail(host, parent=runtime.RUNTIMES):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(runtime, "build_public_runtime", fail)
    with pytest.raises(runtime.SandboxRefused) as exc:
        Grader(tmp_path / "out", ["01"], limits=FAST, log=lambda *_: None)
    assert "\n" not in str(exc.value) and "refusing to grade as root" in str(exc.value)
    assert cli.main(["grade", str(ALICE), "--out", str(tmp_path / "out2"), "--labs", "01"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refusing to grade as root" in err, err
    assert not (tmp_path / "out2" / "gradebook.csv").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="public runtimes are root's")
def test_public_runtimes_of_old_installations_are_removed(monkeypatch, tmp_path):
    """Each installation gets its own public runtime; building one removes the runtimes
    and half-made builds nothing has used for a day, and keeps recent ones and anything
    else in the folder."""
    parent = tmp_path / "runtimes"
    parent.mkdir(mode=0o755)
    old, recent, half = parent / ("a" * 24), parent / ("b" * 24), parent / ".build-0123"
    other = parent / "notes"
    for path in (old, recent, half, other):
        path.mkdir()
    day_and_more = time.time() - runtime.STALE_AFTER_S - 60
    for path in (old, half, other):
        os.utime(path, (day_and_more, day_and_more))
    monkeypatch.setattr(runtime, "_copy_tree", lambda src, dst, left_out: os.makedirs(dst))
    rt = runtime.build_public_runtime(runtime.host_runtime(), str(parent))
    kept = sorted(p.name for p in parent.iterdir())
    made = os.path.basename(os.path.dirname(rt.site[0]))
    assert kept == sorted([recent.name, other.name, made]), kept
    assert time.time() - os.stat(parent / made).st_mtime < runtime.STALE_AFTER_S
