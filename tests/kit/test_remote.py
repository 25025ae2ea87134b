"""Lab code in another process behaves, for the tests, like lab code in theirs: the
stand-ins of ``gptkit.testing.remote`` against a real lab process (``labserver.py``),
started here without a sandbox by a stand-in for the grader."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gptkit.testing import arguments_written_back, next_item, remote, same_object, shares_memory
from gptkit.testing.layout import KIT_ROOT
from grader.sandbox import runner

LAB_CODE = '''
import numpy as np

class Buffer:
    def __init__(self, n):
        self.data = np.zeros((2, n), np.float32)
        self.length = 0
    def view(self):
        return self.data[:, :self.length]
    def push(self, x):
        self.data[:, self.length] = x
        self.length += 1
        return self

class Picky(ValueError):
    pass

class Same:
    def __eq__(self, other):
        return True

import collections, dataclasses

@dataclasses.dataclass
class Point:
    x: float
    y: float

def containers():
    Pair = collections.namedtuple("Pair", "a b")
    return collections.OrderedDict(w=np.ones(2)), Pair(1, 2), Point(1.0, 2.0)

def scale_in_place(x, k):
    x *= k
    return None

def identity(x):
    return x

def scaled_and_returned(x, k):
    x *= k
    return x

def draw(rng, n):
    return rng.normal(size=n)

def apply(fn, x):
    return fn(x) + 1

def zero_over_zero(n):
    return np.zeros(n, np.float32) / np.zeros(n, np.float32)

def warned_then_failed():
    import warnings
    warnings.warn("a UserWarning of the lab's own")
    raise ValueError("after the warning")

def doubled(items):
    for x in items:
        yield 2 * x

def fail(kind):
    if kind == "picky":
        raise Picky("a picky error")
    if kind == "key":
        raise KeyError("missing")
    if kind == "exit":
        import os
        os._exit(3)
    if kind == "loop":
        while True:
            pass
    if kind == "same":
        return Same()
    if kind == "subclass":
        return np.zeros(3).view(np.matrix)

def forge_provenance():
    """Patch the wire lab code can import so that every array it sends says it is one
    object at one place."""
    import gptkit.testing.wire as w
    w.id = lambda obj: 1
    w.byte_range = lambda a: (4096, 8192)
    return "patched"

def escape(how):
    """Try to leave this process; say what happened."""
    import os, sys, threading
    try:
        if how == "fork":
            if os.fork() == 0:
                os._exit(0)
        elif how == "fork_exec":  # raises no audit event: only the kernel stops it
            import _posixsubprocess
            r, w = os.pipe()
            _posixsubprocess.fork_exec([b"/bin/true"], [b"/bin/true"], True, (), None, None, -1, -1, -1, -1,
                                       -1, -1, r, w, False, False, 0, None, None, None, -1, None, True)
        elif how == "socket":
            import socket
            socket.socket()
        elif how == "signal":
            os.kill(os.getppid(), 0)
        elif how == "thread":
            box = []
            t = threading.Thread(target=lambda: box.append(float(np.ones((64, 64)).sum())))
            t.start()
            t.join()
            return f"ran {box}"
        elif how == "scipy":
            import scipy.special
            return float(scipy.special.erf(0.5))
    except OSError as exc:
        return f"refused: {exc.errno}"
    except (ImportError, PermissionError) as exc:
        return f"refused: {exc}"
    return "escaped"
'''


class FakeGrader:
    """What runner's _LabProcesses does, without a sandbox: start, measure, end."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        (tmp_path / "impl" / "00_test" / "00_test").mkdir(parents=True)  # the grader's layout: impl/<lab>/<lab>/
        (tmp_path / "impl" / "00_test" / "00_test" / "labmod.py").write_text(LAB_CODE)
        self.procs = {}
        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            data = self.ours.recv(65536)
            if not data:
                return
            req, fds = json.loads(data), []
            if req["op"] == "spawn":
                a, b = socket.socketpair()
                impl = str(self.tmp / "impl" / "00_test")
                config = {"sys_path": [impl + "/00_test", str(KIT_ROOT), *sys.path], "impl": impl, "student_path": impl,
                          "read_roots": [impl, str(KIT_ROOT), *runner.python_roots(), "/usr", sys.prefix],
                          "write_roots": [str(self.tmp), "/dev/null"]}
                (self.tmp / "c.json").write_text(json.dumps(config))
                p = subprocess.Popen([sys.executable, "-I", "-S", "-B", str(runner.HERE / "labserver.py"),
                                      str(b.fileno()), str(self.tmp / "c.json")], pass_fds=(b.fileno(),))
                b.close()
                sid = len(self.procs) + 1
                self.procs[sid] = p
                reply, fds = {"sid": sid}, [a]
            elif req["op"] == "cpu":
                reply = {"cpu": runner._tree_cpu(self.procs[req["sid"]].pid)}
            else:
                p = self.procs[req["sid"]]
                cpu = runner._tree_cpu(p.pid)
                deadline = time.monotonic() + req.get("grace", 0)
                while p.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                p.kill()
                p.wait()
                reply = {"cpu": cpu, "exit": p.returncode if p.returncode >= 0 else -1,
                         "signal": -p.returncode if p.returncode < 0 else 0}
            reply["id"] = req.get("id")
            socket.send_fds(self.ours, [json.dumps(reply).encode()], [f.fileno() for f in fds])
            for f in fds:
                f.close()


@pytest.fixture
def lab(tmp_path):
    host = FakeGrader(tmp_path)
    r = remote.start(host.theirs.fileno(), 1.0, 20.0, {"labmod": "00_test"}, "00_test")
    r.begin_test()
    try:
        yield r.module("labmod")
    finally:
        r.close()
        remote._active = None
        for p in host.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)


def test_arrays_numbers_and_objects(lab):
    buf = lab.Buffer(4)
    buf.push(np.array([1, 2], np.float32)).push(np.array([3, 4], np.float32))
    assert buf.length == 2 and buf.view().tolist() == [[1, 3], [2, 4]]
    buf.length = 1
    assert buf.view().shape == (2, 1) and isinstance(buf.view(), np.ndarray)
    assert buf.view().dtype == np.float32 and buf.view().flags.writeable


def test_warnings_of_lab_code_reach_the_test(lab):
    """What lab code warns (NumPy's 0 / 0 among them) a test records as it would under
    `uv run pytest`, also when the call then raises; a call that warns nothing brings none."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = lab.zero_over_zero(3)
        lab.identity(1.0)
    assert np.isnan(out).all()
    assert [w.category for w in seen] == [RuntimeWarning] and "invalid value" in str(seen[0].message), seen
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="after the warning"):
            lab.warned_then_failed()
    assert [(w.category, str(w.message)) for w in seen] == [(UserWarning, "a UserWarning of the lab's own")]


def test_containers_a_student_may_return(lab):
    ordered, pair, point = lab.containers()
    assert type(ordered) is dict and ordered["w"].tolist() == [1, 1]
    assert pair == (1, 2), "a named tuple comes back as its tuple"
    assert point.x == 1.0 and point.y == 2.0, "a dataclass stays in the lab process: a stand-in"


def test_changes_to_arguments_and_identity(lab):
    x = np.ones(3, np.float32)
    assert lab.scale_in_place(x, 2.0) is None
    assert x.tolist() == [1, 1, 1], "lab code gets arguments by value: the test's own array never changes"
    with arguments_written_back():
        assert lab.scale_in_place(x, 2.0) is None
    assert x.tolist() == [2, 2, 2], "asked for, an argument changed in place by lab code changes for the test too"
    assert lab.scale_in_place(x, 2.0) is None
    assert x.tolist() == [2, 2, 2], "only within the block"
    assert lab.identity(x) is x, "lab code returning its argument returns the test's own array"
    y = np.ones(3, np.float32)
    back = lab.scaled_and_returned(y, 3.0)
    assert y.tolist() == [1, 1, 1] and back.tolist() == [3, 3, 3], (
        "an argument changed in place and returned: the test gets what lab code returned, its own array stays")
    buf = lab.Buffer(3)
    buf.length = 2
    assert same_object(buf.data, buf.data) and not same_object(buf.data, buf.view())
    assert shares_memory(buf.view(), buf.data) and not shares_memory(buf.view(), lab.Buffer(3).data)


def test_lab_code_cannot_forge_where_its_arrays_live(lab):
    """same_object and shares_memory rest on what the lab process says of each array it
    sends; lab code that patches the wire it can import (every array one object at one
    place) patches a copy of its own, not the one that answers."""
    assert lab.forge_provenance() == "patched"
    one, two = lab.Buffer(3), lab.Buffer(3)
    assert not same_object(one.data, two.data), "a patched wire made two arrays one object"
    assert not shares_memory(one.data, two.data), "a patched wire made two arrays share memory"
    one.length = 2
    assert same_object(one.data, one.data) and shares_memory(one.view(), one.data)


def test_generators_and_callbacks(lab):
    rng, mirror = np.random.default_rng(5), np.random.default_rng(5)
    assert np.array_equal(lab.draw(rng, 3), mirror.normal(size=3))
    assert rng.normal() == mirror.normal(), "the test's generator advances as lab code drew from it"
    assert lab.apply(lambda v: v * 10, 2) == 21, "a function the test passes is called back"


def test_iterators_cross_one_item_at_a_time(lab):
    read = []

    def items():
        for x in range(100):
            read.append(x)
            yield x

    out = lab.doubled(items())
    assert [next_item(out) for _ in range(3)] == [0, 2, 4] and read == [0, 1, 2], \
        "a generator the test passes is read one item at a time, as lab code asks for them"
    assert list(out) == [2 * x for x in range(3, 100)] and len(read) == 100
    with pytest.raises(StopIteration):
        next_item(lab.doubled(iter([])))


def test_errors(lab):
    with pytest.raises(ValueError, match="a picky error") as info:
        lab.fail("picky")
    assert any("labs/00_test/src/labmod.py line" in n for n in getattr(info.value, "__notes__", []))
    with pytest.raises(KeyError):
        lab.fail("key")
    with pytest.raises(AttributeError):
        lab.nothing_here
    for kind, word in (("same", "__eq__"), ("subclass", "subclass")):
        with pytest.raises(remote.NotPlainData, match=word):
            lab.fail(kind)


def test_a_dying_process_is_started_again(lab):
    with pytest.raises(remote.LabProcessDied, match="exited with code 3"):
        lab.fail("exit")
    r = remote.active()
    assert r.module("labmod").identity(5) == 5


def test_a_reply_left_by_a_killed_test_process_is_not_taken_for_the_next_ones():
    """The test processes of a submission share one control connection to the grader. One
    killed mid-request (its lab ran past its time) leaves the grader's reply unread; the
    next test process must take the reply to its own request, not that one."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r = remote.Remote(theirs.fileno(), 1.0, 20.0, {}, "00_test")
    ours.send(json.dumps({"cpu": 7.0, "id": "a killed process's request"}).encode())

    def answer():
        req = json.loads(ours.recv(65536))
        ours.send(json.dumps({"cpu": 1.5, "id": req["id"]}).encode())

    server = threading.Thread(target=answer)
    server.start()
    r.sid = 1
    try:
        assert r._cpu() == 1.5, "the reply to another (killed) process's request was taken for this one's"
    finally:
        server.join(5)
        r.ctl.close()
        ours.close()
        theirs.close()


def test_cpu_budget(lab):
    with pytest.raises(remote.TestTimeLimit):
        lab.fail("loop")
    assert remote.active().end_test() > 0.5, "the CPU the lab code used counts for the test"


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="the seccomp wall knows these machines")
def test_lab_code_cannot_start_processes_open_sockets_or_signal(lab):
    """The kernel's wall (seccomp), not the audit hook alone: even calls that raise no
    audit event (``_posixsubprocess.fork_exec``) are refused; threads and SciPy still work."""
    for how in ("fork", "fork_exec", "socket", "signal"):
        assert lab.escape(how).startswith("refused"), how
    assert lab.escape("thread") == "ran [4096.0]"
    assert abs(lab.escape("scipy") - 0.5205) < 1e-4, "SciPy imports on demand, behind the wall"


SIGNALS = """
import ctypes, errno, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import labserver
victim = os.fork()
if victim == 0:  # lives a few seconds, holding none of the parent's pipes
    os.close(1)
    os.close(2)
    time.sleep(5)
    os._exit(0)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = {"x86_64": {"tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129},
      "aarch64": {"tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138}}[os.uname().machine]
info = ctypes.create_string_buffer(bytes(8) + (-1).to_bytes(4, "little", signed=True), 128)  # si_code: SI_QUEUE
def attempt():
    out = []
    try:
        os.kill(victim, 0)
        out.append("sent")
    except OSError as exc:
        out.append(errno.errorcode[exc.errno])
    for name, args in (("tkill", (victim, 0)), ("tgkill", (victim, victim, 0)),
                       ("rt_sigqueueinfo", (victim, 0, info))):
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr[name]), *args)
        out.append("sent" if r == 0 else errno.errorcode[ctypes.get_errno()])
    return out
before = attempt()
walled = labserver._no_new_processes()
after = attempt()
print(" ".join(before), "|", " ".join(after) if walled else "no wall")
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="the seccomp wall knows these machines")
def test_the_kernel_wall_refuses_every_way_to_signal_another_process_without_the_audit_hook():
    """kill, tkill, tgkill and rt_sigqueueinfo, through ctypes (which the audit hook would
    refuse first): each reaches another process before the wall and none after it."""
    run = subprocess.run([sys.executable, "-I", "-S", "-c", SIGNALS, str(runner.HERE)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    before, _, after = run.stdout.strip().partition(" | ")
    assert before.split() == ["sent"] * 4, run.stdout
    if after == "no wall":
        pytest.skip("this kernel took no seccomp filter")
    assert after.split() == ["EPERM"] * 4, run.stdout


FENCE = """
import errno, os, sys
sys.path.insert(0, sys.argv[1])
import labserver
inside, outside = sys.argv[2], sys.argv[3]
roots = [*sys.argv[4:], inside]
if not labserver._files_fence(roots, [os.path.join(inside, "scratch")]):
    print("no fence"); sys.exit(0)
def attempt(path, flags):
    try:
        os.close(os.open(path, flags, 0o644))
        return "open"
    except OSError as exc:
        return errno.errorcode[exc.errno]
print(attempt(os.path.join(inside, "ok.txt"), os.O_RDONLY), attempt(os.path.join(outside, "secret.npz"), os.O_RDONLY),
      attempt(os.path.join(inside, "scratch", "new"), os.O_WRONLY | os.O_CREAT),
      attempt(os.path.join(inside, "ok.txt"), os.O_WRONLY), attempt(os.path.join(outside, "new"), os.O_WRONLY | os.O_CREAT))
"""


def test_the_kernel_fences_the_lab_process_files_without_the_audit_hook(tmp_path):
    """Landlock, with no audit hook installed: only the given folders can be read, only
    the scratch folder written. What holds a non-root grading without bubblewrap."""
    inside, outside = tmp_path / "lab", tmp_path / "tests"
    (inside / "scratch").mkdir(parents=True)
    outside.mkdir()
    (inside / "ok.txt").write_text("x")
    (outside / "secret.npz").write_bytes(b"expected values")
    run = subprocess.run([sys.executable, "-I", "-S", "-c", FENCE, str(runner.HERE), str(inside), str(outside),
                          *runner.python_roots()], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    if run.stdout.strip() == "no fence":
        pytest.skip("this kernel has no Landlock (Linux ≥ 5.13): the fence is the audit hook, users and bubblewrap")
    assert run.stdout.split() == ["open", "EACCES", "open", "EACCES", "EACCES"], run.stdout
