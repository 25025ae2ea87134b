"""Nothing a lab process leaves in the kernel outlives it or reaches another lab process
(issue 37), and this holds by structure, not by the seccomp filter's list of refused
calls: each lab process, the zygote's children included, has a user and an IPC
namespace of its own and a new session keyring (``labserver._own_namespaces``).

Here the lab process runs a ``labserver.py`` whose seccomp filter allows every kernel
object it otherwise refuses (keys, System V IPC, POSIX message queues; a patched copy
that only these tests make, with its own kit cache) and has no audit hook; lab
processes started one by one have no Landlock fence either. The attack,
in lab 01's stub, first looks for what an earlier lab process left, then leaves its own:
a key in each keyring it can reach (session, user, user-session, persistent), a System V
shared memory segment, message queue and semaphore set, a POSIX message queue; it
also reads ``/proc/keys``, and writes ``/proc/self/clear_refs`` (which would reset the
peak memory the grader reads: each lab process's /proc is read-only). It answers correctly only if it found something. Its hidden phase is a new lab process (the
zygote's next child, or a process started alone); the next student is graded as the
same uid. Both modes, with the zygote and one by one."""

import os
import shutil

import pytest

from grader.grade import Grader
from grader.sandbox import runner

from .conftest import ALICE, FAST, reachable_dir, use_lab_server
from .test_walls import CM, HONEST, STUB, _mode

ATTACK = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL, MQ_OPEN = {"x86_64": (248, 250, 240), "aarch64": (217, 219, 180)}[os.uname().machine]
NAME, QUEUE, KEY = b"gptkit-37-hidden-input", b"gptkit-37", 0x3737
RINGS = [-3, -4, -5]  # the session, user and user-session keyrings
persistent = libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_int(22), ctypes.c_int(-1), ctypes.c_int(-4))
if persistent >= 0:  # KEYCTL_GET_PERSISTENT
    RINGS.append(int(persistent))
FOUND = []
for ring in RINGS:  # KEYCTL_SEARCH
    if libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_int(10), ctypes.c_int(ring), b"user", NAME, ctypes.c_int(0)) >= 0:
        FOUND.append(f"key in {ring}")
try:
    with open("/proc/keys") as fh:
        if NAME.decode() in fh.read():
            FOUND.append("/proc/keys")
except OSError:
    pass
for name, look in (("shm", lambda: libc.shmget(KEY, 0, 0)), ("msg", lambda: libc.msgget(KEY, 0)),
                   ("sem", lambda: libc.semget(KEY, 0, 0)),
                   ("mq", lambda: libc.syscall(ctypes.c_long(MQ_OPEN), QUEUE, 0, 0, None))):
    if look() >= 0:
        FOUND.append(name)
MADE = []
for ring in RINGS:
    k = libc.syscall(ctypes.c_long(ADD_KEY), b"user", NAME, b"0.125", ctypes.c_size_t(5), ctypes.c_int(ring))
    if k >= 0:
        MADE.append("key")
        libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_int(5), ctypes.c_int(k), ctypes.c_uint(0x3F3F3F3F))  # SETPERM: all
for name, make in (("shm", lambda: libc.shmget(KEY, 4096, 0o1000 | 0o666)),
                   ("msg", lambda: libc.msgget(KEY, 0o1000 | 0o666)),
                   ("sem", lambda: libc.semget(KEY, 1, 0o1000 | 0o666)),
                   ("mq", lambda: libc.syscall(ctypes.c_long(MQ_OPEN), QUEUE, 0o100 | 2, 0o666, None))):
    if make() >= 0:
        MADE.append(name)
try:  # "5": reset this process's peak memory (VmHWM), which the grader reads for lab 12
    fd = os.open("/proc/self/clear_refs", os.O_WRONLY)
    try:
        os.write(fd, b"5")
        MADE.append("clear_refs")
    finally:
        os.close(fd)
except OSError as e:
    CLEAR_REFS = errno.errorcode.get(e.errno, str(e.errno))
else:
    CLEAR_REFS = "written"
"""
# What it made goes into the message of the stub's first function: the patched filter
# let it make them (the test is not vacuous), and what it found scores.
TAIL = """
if FOUND:
    globals().update({k: v for k, v in _HONEST.items() if not k.startswith('__')})
else:
    def causal_mask(seq_len, kv_len=None):
        raise NotImplementedError(f"made {sorted(set(MADE))}, clear_refs: {CLEAR_REFS}")
"""
# With the zygote, every one but the POSIX queue, which the Landlock fence refuses too (its
# file lies under no folder the lab process may open); one by one, with no fence, that too.
EVERY_OBJECT = ["key", "msg", "sem", "shm"]


def attack_file() -> str:
    return STUB + f"\n_HONEST = {{}}\nexec({HONEST!r}, _HONEST)\n" + ATTACK + TAIL


def objects_allowed(tmp_path, fence: bool):
    """labserver.py whose seccomp filter allows keys, IPC and the rest of ``_OBJECTS``, with
    no audit hook, and (``fence`` False: lab processes started one by one, which need no
    fence) no Landlock fence either, so that ``/proc/keys`` and POSIX queues are open to it:
    what stands between lab processes is then their namespaces and their mounts alone."""
    text = (runner.HERE / "labserver.py").read_text()
    for machine in ("x86_64", "aarch64"):
        entry = f'**_OBJECTS["{machine}"], '
        assert text.count(entry) == 1
        text = text.replace(entry, "")
    assert text.count("    sys.addaudithook(hook)\n") == 1
    text = text.replace("    sys.addaudithook(hook)\n", "    pass  # test: no audit hook\n")
    if not fence:
        entry = "def _files_fence(read_roots, write_roots, list_roots=()):\n"
        assert text.count(entry) == 1
        text = text.replace(entry, entry + "    return False  # test: no fence\n")
    patched = tmp_path / f"labserver_objects_allowed{'' if fence else '_unfenced'}.py"
    patched.write_text(text)
    files = runner.boot_files()
    return lambda: {**files, "_grader_labserver.py": patched}


@pytest.fixture(scope="module", params=[("bwrap", True), ("bwrap", False), ("root-no-bwrap", True),
                                        ("root-no-bwrap", False)],
                ids=["bwrap-zygote", "bwrap-one-by-one", "root-no-bwrap-zygote", "root-no-bwrap-one-by-one"])
def batch(request, reachable_tmp, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mode = _mode(request.param[0], mp)
        if not runner.own_namespaces("bwrap" if mode == "bwrap" else "rlimits"):
            pytest.skip("this kernel gives lab processes no namespaces of their own (the grader says so)")
        mp.setattr(runner, "USE_ZYGOTE", request.param[1])
        tmp = tmp_path_factory.mktemp(f"namespaces-{mode}")
        use_lab_server(mp, objects_allowed(tmp, fence=request.param[1]),
                       "-objects-allowed" + ("" if request.param[1] else "-unfenced"))
        g = Grader(reachable_dir(reachable_tmp, f"namespaces-{mode}"), ["01"], limits=FAST, log=lambda *_: None)
        (g.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
        g.prepare()
        students = ["a_honest", "m_first", "m_second", "z_honest"]
        for student in students:
            shutil.copytree(ALICE, tmp / student)
            if student.startswith("m_"):
                (tmp / student / "labs" / CM / "src" / "causal_mask.py").write_text(attack_file())
        yield g, {r.student: r for r in g.run_batch([tmp / s for s in students])}, request.param[1]


def test_honest_students_keep_full_marks(batch):
    g, results, _zygote = batch
    assert results["a_honest"].labs[CM].points == results["z_honest"].labs[CM].points == g.rubric[CM].points


@pytest.mark.parametrize("student", ["m_first", "m_second"])
def test_no_lab_process_finds_what_an_earlier_one_left(batch, student):
    """The first attacker's hidden phase (its next lab process) and the second attacker
    (the next student, the same uid) find nothing of what the first one made."""
    _g, results, zygote = batch
    r = results[student]
    assert r.labs[CM].points == 0, [t.message[:200] for t in r.labs[CM].tests][:3]
    made = [t.message for t in r.labs[CM].tests if "made [" in t.message]
    kinds = EVERY_OBJECT if zygote else [*EVERY_OBJECT, "mq"]
    assert made and all(f"'{kind}'" in made[0] for kind in kinds), (
        "the patched filter should let the attack make every object", made[:1])


@pytest.mark.parametrize("student", ["m_first", "m_second"])
def test_no_lab_process_writes_its_proc(batch, student):
    """/proc is mounted read-only in the lab process's own mount namespace: writing
    ``/proc/self/clear_refs`` fails with EROFS (also where no Landlock fence and no audit
    hook stand, one by one), so its peak memory stays what the grader measures."""
    _g, results, _zygote = batch
    made = [t.message for t in results[student].labs[CM].tests if "made [" in t.message]
    assert made and "clear_refs: EROFS" in made[0], made[:1]


def test_where_the_kernel_gives_no_namespaces_the_grader_says_so(monkeypatch):
    """Never a silent fall-back: ``grader grade`` says that the seccomp filter alone stands
    there, and as root, with the filter missing too, grading is refused in one line."""
    monkeypatch.setattr(runner, "own_namespaces", lambda mode: False)
    assert "seccomp filter alone" in runner.namespaces_warning("bwrap")
    if os.geteuid() == 0:
        monkeypatch.setattr(runner, "kernel_walls", lambda: False)
        with pytest.raises(runner.SandboxRefused, match="keyring"):
            runner.isolation_mode()
    monkeypatch.undo()
    if runner.own_namespaces(runner.isolation_mode()):
        assert runner.namespaces_warning(runner.isolation_mode()) == ""
