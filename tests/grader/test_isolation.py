"""What one lab process can reach of another, of the test process and of the grader's
records (issue 27). Every test runs in both configurations an instructor may have:
bubblewrap, and no bubblewrap with the grader as root (``GRADER_NO_BWRAP=1``: containers,
Gradescope). The attacks are appended to the lab 01 stub, so lab 01 honestly scores
nothing, and graded between honest students."""

import dataclasses
import importlib.util
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import gptkit.testing
from gptkit.testing.layout import KIT_ROOT
from grader.grade import Grader
from grader.sandbox import runner
from tests.grader.conftest import ALICE, FAST, reachable_dir

L1, L2 = "01_causal_mask", "02_embeddings"
CM, EMB = f"labs/{L1}/src/causal_mask.py", f"labs/{L2}/src/embeddings.py"
STUB = (KIT_ROOT / "labs" / L1 / "src" / "causal_mask.py").read_text()
HIDDEN_01 = KIT_ROOT / "tests" / "hidden" / L1
FIXTURE_NAMES = ["test_hidden_causal_mask", "sdpa.npz", "self_attention.npz", "mask_T3_S7"]


@pytest.fixture(scope="module", params=["bwrap", "rlimits-as-root"])
def mode_grader(request, reachable_tmp):
    """A grader on labs 01–02 in one of the two configurations."""
    yield from _mode_grader(request.param, reachable_tmp, FAST)


SMALL_DISK = dataclasses.replace(FAST, disk_mb=2)  # 512 entries of ENTRY_BYTES: an attack needs few files to pass it


@pytest.fixture(scope="module", params=["bwrap", "rlimits-as-root"])
def small_disk_grader(request, reachable_tmp):
    """A grader on labs 01–02 in one of the two configurations, with a disk quota of 2 MB."""
    yield from _mode_grader(request.param, reachable_tmp, SMALL_DISK)


def _mode_grader(mode, reachable_tmp, limits):
    with pytest.MonkeyPatch.context() as mp:
        if mode == "bwrap":
            mp.delenv("GRADER_NO_BWRAP", raising=False)
            if runner.isolation_mode() != "bwrap":
                pytest.skip("bubblewrap is not installed here, or does not work")
        else:
            if os.geteuid() != 0:
                pytest.skip("this configuration is the grader running as root without bubblewrap")
            mp.setenv("GRADER_NO_BWRAP", "1")
        g = Grader(reachable_dir(reachable_tmp, f"isolation-{mode}"), ["01", "02"], limits=limits, log=lambda *_: None)
        assert g.isolation == ("bwrap" if mode == "bwrap" else "rlimits")
        (g.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
        g.prepare()
        yield g


def submission(root: Path, lab1: str | None = None, lab1_extra: str = "", lab2_extra: str = "") -> Path:
    """Alice's submission; lab 01 replaced by ``lab1`` (the stub if "stub"), code appended."""
    shutil.copytree(ALICE, root)
    if lab1 == "stub":
        (root / CM).write_text(STUB)
    if lab1_extra:
        (root / CM).write_text((root / CM).read_text() + "\n" + lab1_extra)
    if lab2_extra:
        (root / EMB).write_text((root / EMB).read_text() + "\n" + lab2_extra)
    return root


def runtime_flags(lr) -> list[str]:
    return [f for f in lr.flags if not f.startswith("for review")]


# -- the hidden tests' inputs, found by running the hidden tests here -------------------------

class _Recorder:
    """Stands in for ``lab("causal_mask")``: records every array a test passes, answers
    with the reference solution."""

    def __init__(self, seen):
        path = KIT_ROOT / "solutions" / L1 / "causal_mask.py"
        spec = importlib.util.spec_from_file_location("_reference_causal_mask", path)
        self._ref = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self._ref)
        self._seen = seen

    def __getattr__(self, name):
        fn = getattr(self._ref, name)

        def call(*args, **kwargs):
            self._seen += [a for a in [*args, *kwargs.values()] if isinstance(a, np.ndarray)]
            return fn(*args, **kwargs)

        return call


def hidden_canaries() -> list[str]:
    """Strings that appear in any text made from lab 01's hidden tests' input arrays: the hex
    of their first bytes, and their first values as NumPy prints them."""
    seen: list[np.ndarray] = []
    canaries = set()
    for path in sorted(HIDDEN_01.glob("test_*.py")):
        saved = gptkit.testing.lab
        gptkit.testing.lab = lambda _name: _Recorder(seen)
        try:
            spec = importlib.util.spec_from_file_location(f"_hidden_{path.stem}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        finally:
            gptkit.testing.lab = saved
        for name, fn in vars(mod).items():
            if not name.startswith("test_"):
                continue
            params = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
            cases = [dict(zip([n.strip() for n in params[0].args[0].split(",")], vals))
                     for vals in params[0].args[1]] if params else [{}]
            for case in cases:
                fn(**case)
    for a in seen:
        if a.dtype.kind == "f" and a.size >= 16 and np.isfinite(a).all() and np.abs(a).max() < 1e3:
            canaries.add(a.tobytes()[:16].hex())
            flat = a.ravel()
            big = [x for x in flat if abs(x) > 1][:3]
            canaries.update(np.format_float_positional(x, precision=5, unique=False) for x in big)
            canaries.add(repr(flat[:4])[7:40])
    assert len(canaries) >= 4, "the hidden tests of lab 01 pass no arrays: pick another canary"
    return sorted(canaries)


# -- the attacks --------------------------------------------------------------------------------

# Lab 01: records every argument it gets into every writable place it finds, and raises
# exceptions carrying everything it can read or list (hidden test and fixture names included).
# Both attacks look in the same places: the temporary folders, the working and home
# folders, and the lab file's folder with five above it.
NEARBY = r'''
import os as _os


def _nearby():
    places = ["/tmp", "/var/tmp", "/dev/shm", _os.getcwd(), _os.environ.get("HOME", "/tmp"),
              _os.environ.get("TMPDIR", "/tmp")]
    here = _os.path.dirname(_os.path.abspath(__file__))
    for _ in range(5):
        places.append(here)
        here = _os.path.dirname(here)
    return places
'''

RECORDER = NEARBY + r'''
import glob as _glob

_MARK = "zz-record-lab01.txt"


def _places():
    places = _nearby()
    for top in list(places):
        try:
            for root, dirs, _files in _os.walk(top):
                places += [_os.path.join(root, d) for d in dirs][:50]
                if len(places) > 300:
                    break
        except Exception:
            pass
    return list(dict.fromkeys(places))


def _record(args):
    text = ""
    for a in args:
        if isinstance(a, np.ndarray):
            text += f"REC {a.tobytes()[:64].hex()} {a.ravel()[:6]!r}\n"
            for where in ("/tmp", _os.environ.get("HOME", "/tmp")):
                try:
                    np.save(_os.path.join(where, f"zz-arg-{a.size}.npy"), a)
                except Exception:
                    pass
        else:
            text += f"REC {a!r}\n"[:300]
    for d in _places():
        try:
            with open(_os.path.join(d, _MARK), "a") as fh:
                fh.write(text)
        except Exception:
            pass


def _found():
    out = []
    for d in _places():
        try:
            names = _os.listdir(d)
        except Exception:
            continue
        out.append(f"LISTED {d}: {' '.join(sorted(names))[:400]}")
        for n in names:
            p = _os.path.join(d, n)
            try:
                if n.endswith(".npy"):
                    out.append(f"READ {p}: {np.load(p).ravel()[:6]!r} {np.load(p).tobytes()[:64].hex()}")
                elif _os.path.isfile(p) and _os.path.getsize(p) < 100000:
                    out.append(f"READ {p}: {open(p, errors='replace').read()[:1500]}")
            except Exception:
                pass
    for pattern in ("/sandbox/kit/tests/*", "/sandbox/kit/tests/hidden/*/*", "/sandbox/*/*",
                    _os.path.dirname(_os.path.dirname(_os.path.realpath(np.__file__))) + "/*"):
        out.append(f"GLOB {pattern}: {' '.join(_glob.glob(pattern))[:400]}")
    import gptkit
    kit = _os.path.dirname(_os.path.dirname(_os.path.realpath(gptkit.__file__)))
    for rel in ("", "tests", "tests/hidden", f"tests/hidden/{'01_causal_mask'}", "tests/01_causal_mask/fixtures"):
        try:
            out.append(f"LISTED {kit}/{rel}: {' '.join(_os.listdir(_os.path.join(kit, rel)))}")
        except Exception as exc:
            out.append(f"no {rel}: {type(exc).__name__}")
    return " | ".join(out)


def _spy(name):
    def spy(*args, **kwargs):
        _record([*args, *kwargs.values()])
        raise ValueError(f"FOUND {_found()}")
    spy.__name__ = name
    return spy


for _name in ("causal_mask", "additive_mask", "softmax", "scaled_dot_product_attention"):
    globals()[_name] = _spy(_name)
CausalSelfAttention.__init__ = lambda self, *a, **k: _spy("CausalSelfAttention")(*a, *k.values())
'''

# Lab 02 (Alice's, honest): before each call, looks for anything lab 01 left; raises it if found.
LOOKOUT = NEARBY + r'''


def _left_behind():
    found = []
    for d in _nearby():
        try:
            names = _os.listdir(d)
        except Exception:
            continue
        for n in names:
            if n.startswith("zz-"):
                p = _os.path.join(d, n)
                try:
                    found.append(f"{p}: {open(p, 'rb').read()[:3000]!r}")
                except Exception:
                    found.append(p)
    if found:
        raise ValueError("LEFT BEHIND " + " | ".join(found))


for _cls in (TokenEmbedding, PositionalEmbedding, GPTEmbedding):
    def _forward(self, *a, _orig=_cls.forward, **k):
        _left_behind()
        return _orig(self, *a, **k)
    _cls.forward = _forward
_sinusoid = sinusoidal_positional_encoding


def sinusoidal_positional_encoding(*a, **k):
    _left_behind()
    return _sinusoid(*a, **k)
'''


@pytest.fixture(scope="module")
def batch(mode_grader, tmp_path_factory):
    """Alice, the recorder, and Bob (Alice's copy), graded as one batch."""
    root = tmp_path_factory.mktemp("batch")
    paths = [submission(root / "alice"),
             submission(root / "mallory", "stub", RECORDER, LOOKOUT),
             submission(root / "bob")]
    results = {r.student: r for r in mode_grader.run_batch(paths)}
    return mode_grader, results


def test_no_hidden_input_reaches_any_output(batch):
    """Lab 01 records every argument it gets, its hidden tests' too, wherever it can write,
    and its public code raises whatever it can read; Alice's lab 02, run in the same
    submission, raises anything lab 01 left. None of the hidden tests' inputs appears in
    any student's feedback.md, results.json or result.json, nor in the gradebook or the
    class report; lab 02 keeps its points (it found nothing)."""
    g, results = batch
    mallory = results["mallory"]
    assert mallory.labs[L1].points == 0
    messages = " ".join(t.message for t in mallory.labs[L1].tests)
    assert "FOUND" in messages and "REC " in messages, "the attack did not run, or found not even its own records"
    assert mallory.labs[L2].points == g.rubric[L2].points, [
        t.message[:300] for t in mallory.labs[L2].tests if t.outcome != "passed"][:2]
    texts = {}
    for student in results:
        for name in ("feedback.md", "results.json", "result.json"):
            texts[f"{student}/{name}"] = (g.student_dir(student) / name).read_text()
    for name in ("gradebook.csv", "stats.json", "report.html"):
        texts[name] = (g.out_dir / name).read_text()
    canaries = hidden_canaries()
    leaks = {(where, c) for where, text in texts.items() for c in canaries if c in text}
    assert not leaks, f"hidden test inputs in the outputs: {sorted(leaks)[:5]}"
    hidden = [t for t in mallory.labs[L1].tests if t.hidden]
    assert hidden and all("FOUND" not in t.message and "REC" not in t.message for t in hidden)
    assert all(t.message.startswith("a hidden test failed") for t in hidden), hidden[0].message


# Lab 01's softmax raises every path of the grading machine it can name (issue 37).
PATHS = """
import os as _os, sys as _sys
def softmax(x, axis=-1):
    raise ValueError("PATHS " + " | ".join([_sys.executable, _os.path.realpath(_sys.executable), _os.getcwd(),
                                            np.__file__, _os.__file__, *_sys.path[:8]]))
"""


def test_no_host_path_reaches_a_message(mode_grader, tmp_path):
    """The Python's executable and installation, its packages (the public runtime's folder,
    as root without bubblewrap), the import path and the grading folder: none reaches what
    a student sees; each is a placeholder there."""
    import sys

    from grader.sandbox import runtime

    g = mode_grader
    r = g.grade("paths", submission(tmp_path / "paths", lab1_extra=PATHS))
    text = "\n".join([t.message for lr in r.labs.values() for t in lr.tests]
                     + [f for lr in r.labs.values() for f in lr.flags])
    assert "PATHS " in text and "<site-packages>" in text, text[:500]
    host = {str(g.out_dir), runtime.RUNTIMES, runner.HANDOFF_DIR, sys.prefix, sys.base_prefix,
            os.path.realpath(sys.executable), os.path.dirname(np.__file__), os.path.dirname(os.__file__),
            *(p for p in sys.path if p.count("/") >= 3 and not p.startswith("/usr/"))}
    leaked = sorted(p for p in host if p in text)
    assert not leaked, (leaked, text[:600])


# Lab 01 prints 2 MB, but only for a size of mask that a hidden test alone asks for.
LOUD_WHEN_HIDDEN = """
_quiet_causal_mask = causal_mask
def causal_mask(T, S=None):
    if T >= 13:
        print("x" * 2_000_000)
    return _quiet_causal_mask(T, S)
"""


def test_what_the_hidden_phase_prints_reaches_no_note(mode_grader, tmp_path):
    """Output in proportion to a hidden input would tell the student a few bits through the
    printed-size note: the hidden phase's output is counted in no note (issue 37)."""
    g = mode_grader
    r = g.grade("loud", submission(tmp_path / "loud", lab1_extra=LOUD_WHEN_HIDDEN))
    lr = r.labs[L1]
    assert lr.points == g.rubric[L1].points, [t.message[:200] for t in lr.tests if t.outcome != "passed"][:2]
    assert not any("printed" in f for f in lr.flags), lr.flags


BIG_WHEN_HIDDEN = """
import numpy as _np
_small_causal_mask = causal_mask
_done = []
def causal_mask(T, S=None):
    if T >= 13 and not _done:  # only the hidden tests ask for 13 or more: touch what the limit allows
        _done.append(True)
        for mb in range(1024, 0, -8):
            try:
                a = _np.empty(mb * 2**20, _np.uint8)
            except MemoryError:
                continue
            a[::4096] = 1  # one byte a page: resident, cheaply; its peak stays, the memory goes back
            del a
            break
    return _small_causal_mask(T, S)
"""


def test_what_the_hidden_phase_holds_reaches_no_note(mode_grader, tmp_path):
    """Memory in proportion to a hidden input would tell the student a bit through the
    memory-limit note: a hidden-phase process's peak memory, disk use and deaths are kept
    apart from its lab's and reach no note (issue 37)."""
    g = mode_grader
    r = g.grade("big", submission(tmp_path / "big", lab1_extra=BIG_WHEN_HIDDEN))
    lr = r.labs[L1]
    # (it may cost itself a test: near its limit, what runs next may not find the room)
    assert any(t.hidden and t.outcome == "passed" for t in lr.tests), [t.message[:200] for t in lr.tests][:3]
    assert not any("memory" in f for f in lr.flags), lr.flags


def test_lab_code_cannot_list_hidden_tests_or_fixtures(batch):
    """The recorder lists every folder it can think of (the kit's, the scratch folder's, its
    own tree's parents) and reads what it finds: no hidden test's or fixture's name, and no
    test process folder, shows in what it reports."""
    _g, results = batch
    messages = " ".join(t.message for t in results["mallory"].labs[L1].tests)
    assert "LISTED" in messages
    shown = [name for name in [*FIXTURE_NAMES, "plan.json", "pytest-", "tmp/hypothesis"] if name in messages]
    assert not shown, f"lab code listed {shown}: " + " … ".join(
        messages[max(0, messages.index(n) - 300):messages.index(n) + 100] for n in shown)


def _host_files(prefix: str) -> list[str]:
    found = []
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            found += [f"{d}/{n}" for n in os.listdir(d) if n.startswith(prefix)]
        except OSError:
            pass
    return found


def test_the_recorders_files_are_gone_afterwards(batch):
    """What lab code wrote to /tmp (its own) is gone once the submission is graded."""
    g, _results = batch
    assert not _host_files("zz-"), _host_files("zz-")
    assert not list((g.out_dir / ".scratch").iterdir())


DEBUG_SAVES = r'''
import os as _os

_BEFORE = sorted(n for n in _os.listdir("/tmp") if n.startswith("dbg-"))
with open(f"/tmp/dbg-{_os.path.basename(__file__)}-{_os.getpid()}", "w") as _fh:
    _fh.write("mine")
_os.makedirs(_os.path.expanduser("~/notes"), exist_ok=True)
import tempfile as _tempfile
with _tempfile.NamedTemporaryFile(dir=None, delete=False) as _fh:
    _fh.write(b"x")
with open("relative-notes.txt", "w") as _fh:
    _fh.write("x")
'''


def test_an_honest_lab_may_write_to_tmp_privately(mode_grader, tmp_path):
    """Honest code saving for debugging (``np.save("/tmp/…")``, its HOME, TMPDIR, working
    folder) loses nothing, and no other process sees the files: each lab process (lab 01's
    public tests, its hidden ones, lab 02's) checks that /tmp held none of another's. Gone
    afterwards."""
    check = ("\n_orig_{0} = {0}\n\ndef {0}(*a, **k):\n"
             "    if _BEFORE:\n        raise RuntimeError(f'another process left {{_BEFORE}}')\n"
             "    np.save('/tmp/dbg-arg.npy', np.asarray(a[0]))\n"
             "    assert np.load('/tmp/dbg-arg.npy').shape == np.asarray(a[0]).shape\n"
             "    return _orig_{0}(*a, **k)\n")
    path = submission(tmp_path / "carol", None, DEBUG_SAVES + check.format("softmax") + check.format("causal_mask"),
                      DEBUG_SAVES + check.format("sinusoidal_positional_encoding"))
    r = mode_grader.grade("carol", path)
    for lab in (L1, L2):
        lr = r.labs[lab]
        assert lr.points == mode_grader.rubric[lab].points, [t.message[:300] for t in lr.tests
                                                             if t.outcome != "passed"][:3]
        assert not runtime_flags(lr)
    assert not _host_files("dbg-")


FILL = r'''
import os as _os, time as _time

_start, _written = _time.monotonic(), 0
for _i in range(64):  # 1 GiB, 16 MB a file (the file size limit)
    try:
        with open(f"/tmp/fill-{_i}", "wb") as _fh:
            for _ in range(4):
                _fh.write(b"\1" * (4 << 20))
                _written += 4 << 20
    except OSError:
        pass
'''


def test_writing_a_gigabyte_is_stopped_with_a_grader_flag(mode_grader, tmp_path):
    """1 GiB written to /tmp: the lab process is stopped at the disk quota, the grader says
    so, and the next lab keeps its points."""
    start = time.monotonic()
    r = mode_grader.grade("dave", submission(tmp_path / "dave", "stub", FILL))
    assert r.labs[L1].points == 0
    assert any(f.startswith("disk quota") for f in r.labs[L1].flags), r.labs[L1].flags
    assert r.labs[L2].points == mode_grader.rubric[L2].points
    assert not any("disk quota" in f for f in r.labs[L2].flags)
    assert time.monotonic() - start < FAST.wall_seconds
    assert not _host_files("fill-")


EMPTY_FILES = r'''
import os as _os, sys as _sys, time as _time


def _handoff_folders():
    """The lab process's hand-off folders, on the host's disk: the lab server's own
    configuration names them (its write roots), a few frames up from this import."""
    f = _sys._getframe()
    while f is not None:
        cfg = f.f_locals.get("config")
        if isinstance(cfg, dict) and "write_roots" in cfg:
            return [w for w in cfg["write_roots"] if "handoff" in w]
        f = f.f_back
    return []


_made = 0
for _d in _handoff_folders():  # empty files hold no block, only an inode and an entry each
    _base = _os.path.join(_d, "flood")
    _os.makedirs(_base, exist_ok=True)
    while _made < 2_000:  # four times the 2 MB quota's 512 entries: under a second of CPU, however busy the machine
        if _made % 500 == 0:
            _os.mkdir(_os.path.join(_base, str(_made // 500)))
        _os.close(_os.open(_os.path.join(_base, str(_made // 500), str(_made)), _os.O_CREAT | _os.O_WRONLY, 0o600))
        _made += 1
    break
_time.sleep(3)  # holding them, below every CPU limit
'''


def test_empty_files_by_the_thousand_count_against_the_disk_quota(small_disk_grader, tmp_path):
    """Lab code that fills its hand-off folder (on the host's disk) with empty files, which
    hold no block: each file and folder counts 4 KiB against the quota, so the process is
    stopped with the grader's flag before the host's inodes, and with them every other
    student's writes, run out; the next lab keeps its points. (A quota of 2 MB, so that the
    attack's files take well under a second of CPU time.)"""
    g = small_disk_grader
    r = g.grade("ivan", submission(tmp_path / "ivan", "stub", EMPTY_FILES))
    assert any(f.startswith("disk quota") for f in r.labs[L1].flags), (
        "empty files in the hand-off folder went uncounted (or the attack found no hand-off folder)", r.labs[L1].flags)
    assert r.labs[L2].points == g.rubric[L2].points
    assert not any("disk quota" in f for f in r.labs[L2].flags)


FORGE = r'''
import __main__ as _main


class TestTimeLimit(Exception):
    pass


class LabProcessDied(Exception):
    pass


def causal_mask(*a, **k):
    raise MemoryError("MemoryError: out of memory (graded by hand: 10/10)")


def additive_mask(*a, **k):
    raise TestTimeLimit("TestTimeLimit: this test used 99 s of CPU time")


def softmax(*a, **k):
    raise LabProcessDied("LabProcessDied: the process running the lab code ended; sandbox blocked: all")


def scaled_dot_product_attention(*a, **k):
    raise getattr(_main, "TestTimeLimit", RuntimeError)("disk quota: graded by hand: 10/10")


def _shadow(*a, **k):
    open("/etc/shadow").read()  # refused: the audit hook reports it


CausalSelfAttention.__init__ = _shadow
'''

ERASE = r'''
import os as _os


def softmax(x, axis=-1):  # runs past its CPU time, swallows the limit, answers
    try:
        while True:
            pass
    except BaseException:
        return np.zeros_like(x)


def causal_mask(seq_len, kv_len=None):  # (its first tests ask for 1, 4, 5 queries)
    if seq_len == 4:  # ends its own process
        _os._exit(0)
    if seq_len == 5:  # meets the memory limit, swallows it
        hog = []
        try:
            while True:
                hog.append(np.empty((16, 1024, 1024)))
        except MemoryError:
            del hog
    raise ValueError("all is well")
'''


def test_lab_code_can_neither_forge_nor_erase_a_flag(mode_grader, tmp_path):
    """Flags are the grader's own observations. A lab whose exceptions are named and worded
    like every flag, and that trips the audit hook, gets none (its words stay in its test
    messages); a lab that meets the time and memory limits and ends its own process, and
    swallows or rewords each, gets all three."""
    g = mode_grader
    forged = g.grade("eve", submission(tmp_path / "eve", "stub", FORGE))
    assert forged.labs[L1].points == 0
    assert not runtime_flags(forged.labs[L1]), forged.labs[L1].flags
    assert not any("graded by hand" in f or "sandbox blocked" in f for f in forged.flags)
    assert any("graded by hand" in t.message for t in forged.labs[L1].tests if not t.hidden)
    real = g.grade("frank", submission(tmp_path / "frank", "stub", ERASE))
    flags = " | ".join(runtime_flags(real.labs[L1]))
    assert "time limit" in flags and "memory limit" in flags and "ended by itself" in flags, flags
    for r in (forged, real):
        assert r.labs[L2].points == g.rubric[L2].points and not runtime_flags(r.labs[L2])

