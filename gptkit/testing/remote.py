"""The test process's side of grading: lab code lives in another process.

When the grader runs a lab's tests, ``lab("module")`` (``loader.py``) hands out stand-ins
from this module instead of the student's real module. Every attribute read, call,
index or assignment on a stand-in becomes a request to the process that holds the lab
code (``grader/sandbox/labserver.py``), in plain data (``wire.py``); what comes back is
plain data too (arrays, numbers, strings, lists, tuples, dicts) or a handle, which
becomes another stand-in. The test process never imports or runs student code, and
student code never sees the test process: no shared memory, no results pipe, no tests.

Time: each test may use ``budget`` seconds of CPU time in the lab process, counted by
the kernel (asked of the grader), so a busy machine does not change a verdict. A
wall-clock backstop, far above the budget, catches lab code that only sleeps.
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import json
import os
import select
import socket
import time
import warnings
import weakref
from collections.abc import Iterator

import numpy as np

from gptkit.testing import wire


class TestTimeLimit(BaseException):
    """A test ran past its time limit (a BaseException, so nothing in a test swallows it)."""

    __test__ = False


class LabProcessDied(Exception):
    """The process running the lab code ended in the middle of a request."""


class NotPlainData(Exception):
    """Lab code returned something that is not plain data (a subclass of ndarray, an object
    with its own comparison). Not a TypeError: a test expecting one must not be satisfied."""


class LabCodeError(Exception):
    """Lab code raised something that is not an ordinary exception (SystemExit, …)."""


# Exceptions lab code raises that are rebuilt here by type (anything else: LabCodeError).
ERRORS = {cls.__name__: cls for cls in (
    ValueError, TypeError, IndexError, KeyError, LookupError, AttributeError, NotImplementedError, AssertionError,
    ArithmeticError, ZeroDivisionError, FloatingPointError, OverflowError, RuntimeError, RecursionError,
    MemoryError, ImportError, ModuleNotFoundError, OSError, FileNotFoundError, IsADirectoryError,
    NotADirectoryError, PermissionError, EOFError, StopIteration, UnicodeError, Exception)}

MAX_RESTARTS = 5  # after this many deaths of the lab process in one lab, stop starting it again
_active: "Remote | None" = None
_requests = itertools.count(1)  # this process's requests to the grader, numbered (Remote._host)


def active() -> "Remote | None":
    return _active


class RemoteObject:
    """A stand-in for an object that lives in the lab process."""

    __slots__ = ("_remote", "_handle", "_life", "__weakref__")

    def __init__(self, remote: "Remote", handle: int, life: int):
        object.__setattr__(self, "_remote", remote)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_life", life)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._remote.request("getattr", target=self, name=name)

    def __setattr__(self, name, value):
        self._remote.request("setattr", target=self, name=name, value=value)

    def __call__(self, *args, **kwargs):
        return self._remote.request("call", target=self, args=list(args), kwargs=kwargs)

    def __getitem__(self, key):
        return self._remote.request("getitem", target=self, key=key)

    def __setitem__(self, key, value):
        self._remote.request("setitem", target=self, key=key, value=value)

    def __len__(self):
        n = self._remote.request("len", target=self)
        if type(n) is not int:
            raise NotPlainData(f"len() of an object of the lab code gave {type(n).__name__}, not an int")
        return n

    def __iter__(self):
        items = self._remote.request("list", target=self)
        if not isinstance(items, list):
            raise NotPlainData("iterating over an object of the lab code gave no list")
        return iter(items)

    def __repr__(self):
        try:
            d = self._remote.request("describe", target=self)
            return str(d.get("repr")) if isinstance(d, dict) else "<lab object>"
        except BaseException:  # noqa: BLE001 - a repr must not fail
            return "<lab object>"

    def __del__(self):
        try:
            self._remote.forget(self._handle, self._life)
        except BaseException:  # noqa: BLE001 - interpreter shutdown
            pass


def next_item(iterator):
    """``next(iterator)``, also for an iterator that lives in the lab process (a stand-in,
    which ``iter`` would read whole): one item, or ``StopIteration`` at the end."""
    if isinstance(iterator, RemoteObject):
        return iterator._remote.request("next", target=iterator)
    return next(iterator)


def type_name(value) -> str:
    """The type of a value as a student would name it (the lab-side class for stand-ins)."""
    if isinstance(value, RemoteObject):
        d = value._remote.request("describe", target=value)
        return str(d.get("type")) if isinstance(d, dict) else "object"
    return type(value).__name__


class Remote:
    """One lab's channel to its lab process, started (again) on demand by the grader."""

    def __init__(self, ctl_fd: int, budget: float, wall: float, module_labs: dict[str, str], lab: str):
        self.module_labs = module_labs  # "causal_mask" → "01_causal_mask" (for messages)
        self.lab = lab
        self.ctl = socket.socket(fileno=os.dup(ctl_fd))  # its own: the labs of a session each make a Remote
        self.closed = False
        self.budget, self.wall = budget, wall
        self.sock = None
        self.reader = None
        self.sid = None
        self.starting = False
        self.life = 0  # which lab process: stand-ins of an earlier one are dead
        self.restarts = 0
        self.proxies: dict[int, weakref.ref] = {}
        self.released: list[int] = []
        self.modules: dict[str, RemoteObject] = {}
        self.module_attrs: dict[tuple[str, str], RemoteObject] = {}  # functions and classes, looked up once
        self.gens: dict[int, np.random.Generator] = {}  # ref → generator (ours > 0, theirs < 0)
        self.gen_ref: dict[int, int] = {}  # id(generator) → ref
        self.gen_sent: dict[int, dict] = {}  # ref → the state the lab process last knew
        self.dropped: list[int] = []
        self.next_ref = 1
        self.test = 0
        self.cpu_base = 0.0  # the lab process's CPU time when this test started
        self.cpu_dead = 0.0  # CPU time this test spent in lab processes that have since ended
        self.cpu_idle = None  # (lab process, its CPU time) when the last test ended, until a request
        self.origins: dict[int, tuple] = {}  # id(array) → (weakref, object id, first byte, end byte)
        self.callbacks: dict[int, object] = {}  # functions of the tests that lab code may call back
        self.died: str = ""
        self.late = False  # this test ran past a time limit by this process's own count
        self.write_back = False  # arrays lab code changes in place change for the test too (opt-in)

    # -- the grader (host) --------------------------------------------------------------------
    def _host(self, msg: dict, fds: int = 0):
        # Every test process of a submission shares this control connection. One the grader
        # killed (its lab ran past its time) may have left a reply to its last request
        # unread: replies echo their request's id, and one for another request is dropped.
        ident = f"{os.getpid()}:{next(_requests)}"
        self.ctl.sendall(json.dumps({**msg, "id": ident}).encode())
        while True:
            data, got, _, _ = socket.recv_fds(self.ctl, 65536, max(fds, 1))
            if not data:
                raise LabProcessDied("the grader stopped answering")
            reply = json.loads(data)
            if reply.get("id") == ident:
                break
            for fd in got:
                os.close(fd)
        if "error" in reply:
            for fd in got:
                os.close(fd)
            raise LabProcessDied(reply["error"])
        return reply, got

    def _cpu(self) -> float:
        if self.sid is None:
            return 0.0
        reply, _ = self._host({"op": "cpu", "sid": self.sid})
        return float(reply["cpu"])

    def _start(self) -> None:
        if self.closed:
            raise LabProcessDied(f"the tests of {self.lab} are over: its lab process is not started again")
        if self.restarts >= MAX_RESTARTS:
            raise LabProcessDied(f"the lab code's process ended {MAX_RESTARTS} times; it is not started again")
        if self.sid is not None:
            self._stop()
        reply, fds = self._host({"op": "spawn", "lab": self.lab, "phase": self.phase}, fds=1)
        self.sock = socket.socket(fileno=fds[0])
        self.sock.settimeout(self.wall)
        self.reader = wire.Reader(self.sock)
        self.sid = reply["sid"]
        self.starting = True  # until its "ready": its start-up is charged to no test
        self.life += 1
        self.restarts += 1
        self.cpu_base = 0.0
        self.proxies.clear()
        self.released.clear()
        self.modules.clear()
        self.module_attrs.clear()
        self.gen_sent.clear()
        self.dropped.clear()

    def warm(self) -> None:
        """Start the lab process now, so its start-up overlaps the tests' collection (and
        its import of NumPy is charged to no test)."""
        try:
            self._start()
            self.restarts = 0
        except (OSError, ValueError, LabProcessDied):
            pass

    phase = "public"  # which of the lab's hand-off folders its process sees (``runner.handoff``)

    def fresh(self) -> None:
        """A new lab process from here on (the lab's hidden tests): the one so far ends with
        its scratch folder and objects, and no restart is counted against the lab."""
        self.phase = "hidden"
        self._stop()
        self.warm()

    def restart(self) -> None:
        """A new lab process from here on, in the same phase (a test that measures a process's
        own peak memory starts from one that has done nothing else); no restart is counted."""
        self._stop()
        self.warm()

    def peak_resident(self) -> int | None:
        """The lab process's peak resident memory so far (VmHWM) in bytes, read by the grader
        from outside it: lab code cannot change it. None if the grader cannot tell."""
        if self.sid is None:
            self._start()
        if self.starting:
            self._ready()
        reply, _ = self._host({"op": "memory", "sid": self.sid})
        kb = reply.get("peak_kb")
        return int(kb) * 1024 if isinstance(kb, int) and kb > 0 else None

    def _stop(self, grace: float = 0.0) -> dict:
        """End the current lab process; returns its exit status as the grader saw it."""
        status = {}
        if self.sid is not None:
            try:
                status, _ = self._host({"op": "kill", "sid": self.sid, "grace": grace})
                if not self.starting:
                    self.cpu_dead += max(0.0, float(status.get("cpu", 0.0)) - self.cpu_base)
            except (OSError, ValueError, LabProcessDied):
                pass
        if self.sock is not None:
            self.sock.close()
        self.sock = self.reader = self.sid = None
        return status

    def close(self) -> None:
        """The lab's tests are over: its process ends, and is not started again."""
        self._stop()
        self.closed = True
        self.ctl.close()

    # -- tests ----------------------------------------------------------------------------------
    def begin_test(self) -> None:
        self.test += 1
        self.cpu_dead = 0.0
        if self.sid is None or self.starting:
            self.cpu_base = 0.0
        elif self.cpu_idle is not None and self.cpu_idle[0] == self.sid:
            self.cpu_base = self.cpu_idle[1]  # nothing ran in it since the last test ended
        else:
            self.cpu_base = self._cpu()
        self.died = ""
        self.late = False
        self.write_back = False

    def end_test(self) -> float:
        """CPU seconds the lab code used during this test (the kernel's count)."""
        running = self.sid is not None and not self.starting
        now = self._cpu() if running else 0.0
        self.cpu_idle = (self.sid, now) if running else None
        used = self.cpu_dead + (max(0.0, now - self.cpu_base) if running else 0.0)
        self.dropped += list(self.gens)
        self.callbacks.clear()
        self.gens.clear()
        self.gen_ref.clear()
        return used

    # -- stand-ins ------------------------------------------------------------------------------
    def module(self, name: str) -> RemoteObject:
        mod = self.modules.get(name) if self.sock is not None else None
        if mod is None:
            mod = self.request("import", module=name)
            self.modules[name] = mod
        return mod

    def module_attr(self, name: str, module: RemoteObject, attr: str):
        """``module.attr``; a function or class is asked for once per lab process."""
        key = (name, attr)
        value = self.module_attrs.get(key)
        if value is None or value._life != self.life:
            value = getattr(module, attr)
            if isinstance(value, RemoteObject):
                self.module_attrs[key] = value
        return value

    def forget(self, handle: int, life: int) -> None:
        if life == self.life:
            self.released.append(handle)
            self.proxies.pop(handle, None)

    def _proxy(self, handle: int) -> RemoteObject:
        ref = self.proxies.get(handle)
        obj = ref() if ref is not None else None
        if obj is None:
            obj = RemoteObject(self, handle, self.life)
            self.proxies[handle] = weakref.ref(obj)
        return obj

    def _generator(self, g: wire.GeneratorRef) -> np.random.Generator:
        gen = self.gens.get(g.ref)
        if gen is None:
            gen = wire.make_generator(g.state)
            self.gens[g.ref], self.gen_ref[id(gen)] = gen, g.ref
        else:
            gen.bit_generator.state = g.state
        self.gen_sent[g.ref] = g.state
        return gen

    def _encode_other(self, value, enc: wire.Encoder):
        if isinstance(value, RemoteObject):
            if value._remote is not self or value._life != self.life:
                raise LabProcessDied("this object belonged to a run of the lab code that has ended "
                                     "(the process was restarted after it died)")
            return {"$h": value._handle}
        if type(value) is np.random.Generator:
            ref = self.gen_ref.get(id(value))
            if ref is None:
                ref, self.next_ref = self.next_ref, self.next_ref + 1
                self.gens[ref], self.gen_ref[id(value)] = value, ref
            state = wire.generator_state(value)
            self.gen_sent[ref] = state
            return {"$g": [ref, enc(state)]}
        if isinstance(value, Iterator):  # a generator: lab code reads it one item at a time
            key = len(self.callbacks) + 1
            self.callbacks[key] = value.__next__
            return {"$i": key}
        if callable(value) and not isinstance(value, type):
            key = len(self.callbacks) + 1
            self.callbacks[key] = value
            return {"$c": key}
        raise wire.WireError(f"a test passed a {wire.type_name(value)} to lab code, which takes plain data only")

    def _note_origin(self, arr: np.ndarray, where: list) -> None:
        key = id(arr)
        self.origins[key] = (weakref.ref(arr, lambda _r, k=key: self.origins.pop(k, None)), *where)

    def origin(self, arr) -> tuple | None:
        """(object id, first byte, end byte) of an array as it lives in the lab process."""
        rec = self.origins.get(id(arr))
        if rec is None or rec[0]() is not arr:
            return None
        return rec[1:]

    # -- one request ----------------------------------------------------------------------------
    def request(self, op: str, **fields):
        __tracebackhide__ = True
        self.cpu_idle = None
        if self.sock is None:
            self._start()
        if self.starting:
            self._ready()
        sync = {}
        for ref, gen in self.gens.items():
            state = gen.bit_generator.state
            if ref in self.gen_sent and state != self.gen_sent[ref]:
                sync[ref] = state
                self.gen_sent[ref] = state
        enc = wire.Encoder(self._encode_other)
        meta = {"release": self.released, "drop": self.dropped, "test": self.test, "budget": self.budget}
        tree = [op, meta, enc({**fields, "sync": sync} if sync else fields)]
        sent = list(enc.arrays_seen)
        self.released, self.dropped = [], []
        try:
            wire.send(self.sock, tree, enc.buffers)
            while True:
                self._wait(op)
                kind, meta, payload = _envelope(self.reader.header())
                dec = wire.Decoder(self.reader.read_into, self._proxy, self._generator, sent=sent,
                                   provenance=self._note_origin)
                reply = dec(payload)
                if kind != "cb":
                    break
                self._call_back(reply)  # lab code called a function the test passed it
        except (OSError, EOFError, socket.timeout) as exc:
            raise self._died(op, exc) from None
        except wire.WireError as exc:
            self._stop()
            raise NotPlainData(f"the lab code's process sent a malformed answer ({exc}); it was restarted") from None
        if not isinstance(reply, dict):
            self._stop()
            raise NotPlainData("the lab code's process sent a malformed answer; it was restarted")
        _warn_again(meta.get("w"))
        return self._unpack(reply, sent)

    def _ready(self) -> None:
        """Wait for a new lab process to finish starting; a test's CPU count starts there."""
        __tracebackhide__ = True
        try:
            self._wait("start", count_cpu=False)
            kind, _, _ = _envelope(self.reader.header())
        except (OSError, EOFError, socket.timeout) as exc:
            raise self._died("start", exc) from None
        except wire.WireError:
            kind = ""
        if kind != "ready":
            self._stop()
            raise NotPlainData("the lab code's process did not start as expected; it was stopped")
        self.starting = False
        self.cpu_base = self._cpu()

    def _call_back(self, req: dict) -> None:
        fn = self.callbacks.get(req.get("cb"))
        args, kwargs = req.get("args", []), req.get("kwargs", {})
        try:
            if fn is None or not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ValueError("lab code called back a function it was not given")
            answer = {"v": fn(*args, **kwargs)}
        except Exception as exc:  # noqa: BLE001 - goes back to lab code as its exception
            answer = {"e": {"type": type(exc).__name__ if type(exc).__name__ in ERRORS else "Exception",
                            "msg": str(exc)[:2000]}}
        enc = wire.Encoder(self._encode_other)
        tree = ["cbr", {}, enc(answer)]
        wire.send(self.sock, tree, enc.buffers)

    def _wait(self, op: str, count_cpu: bool = True) -> None:
        """Until the answer starts to arrive; stops the lab process past the time limits."""
        __tracebackhide__ = True
        start = time.monotonic()
        while True:
            ready, _, _ = select.select([self.sock], [], [], 0.5)
            if ready:
                return
            used = self.cpu_dead + self._cpu() - self.cpu_base if count_cpu else 0.0
            late = time.monotonic() - start > self.wall
            if used > self.budget + 0.5 or late:
                self.late = True
                self._stop()
                what = (f"more than the {self.budget:g} s of CPU time a test may use" if not late else
                        f"no answer for {self.wall:g} s (a test may use {self.budget:g} s of CPU time)")
                raise TestTimeLimit(f"this test ran past its time limit: the lab code took {what} "
                                    "(an infinite loop, or far too slow)")

    def _died(self, op: str, exc: BaseException) -> LabProcessDied:
        status = self._stop(grace=1.0)
        how = ""
        if status.get("ended_by_grader"):
            how = " (it closed its channel, so the grader ended it)"
        elif status.get("signal"):
            how = f" (killed by signal {status['signal']}{': out of memory?' if status['signal'] == 9 else ''})"
        elif "exit" in status:
            how = f" (it exited with code {status['exit']}: os._exit, sys.exit or a crash)"
        self.died = f"the process running the lab code ended during a `{op}` request{how}"
        return LabProcessDied(self.died + "; the next test starts it again")

    def _unpack(self, reply: dict, sent: list):
        __tracebackhide__ = True
        for ref, state in (reply.get("g") or {}).items():
            if type(ref) is int:
                self._generator(wire.GeneratorRef(ref, state))
        changed = {}  # id(the test's array) → what lab code left in it
        for pair in reply.get("w") or ():
            if isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and 0 <= pair[0] < len(sent):
                target, new = sent[pair[0]], pair[1]
                if not (isinstance(new, np.ndarray) and new.shape == target.shape):
                    continue
                if self.write_back and target.flags.writeable:
                    target[...] = new  # asked for: lab code changed an array the test passed, so does the test's
                else:
                    changed[id(target)] = new
        if "e" in reply:
            raise _rebuild(reply["e"])
        if changed:  # an argument changed in place and returned: the test gets what lab code returned
            return _substitute(reply.get("v"), changed)
        return reply.get("v")


def _substitute(value, changed: dict, depth: int = 0):
    if type(value) is np.ndarray:
        return changed.get(id(value), value)
    if depth > wire.MAX_DEPTH:
        return value
    if type(value) is list:
        return [_substitute(v, changed, depth + 1) for v in value]
    if type(value) is tuple:
        return tuple(_substitute(v, changed, depth + 1) for v in value)
    if type(value) is dict:
        return {k: _substitute(v, changed, depth + 1) for k, v in value.items()}
    return value


def _warn_again(warned) -> None:
    """The warnings the lab process recorded while it answered, warned here again (as the
    builtin category they derive from), where a test may record them as it would lab
    code's own under `uv run pytest`."""
    if not isinstance(warned, list):
        return
    for item in warned[:20]:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            category = getattr(builtins, item[0], None)
            if isinstance(category, type) and issubclass(category, Warning):
                warnings.warn(item[1][:500], category, stacklevel=4)


def _envelope(tree) -> tuple[str, dict, object]:
    """A message is ``[kind, meta, payload]``: meta plain JSON, payload in wire's encoding."""
    if not (isinstance(tree, list) and len(tree) == 3 and isinstance(tree[0], str) and isinstance(tree[1], dict)):
        raise wire.WireError("a message without its envelope")
    return tree[0], tree[1], tree[2]


def _rebuild(err) -> BaseException:
    if not isinstance(err, dict):
        return LabCodeError("lab code raised an exception that could not be read")
    kind, msg = str(err.get("type", "")), str(err.get("msg", ""))[:2000]
    name = str(err.get("name", kind))
    if kind == "TestTimeLimit":
        return TestTimeLimit(msg)
    if kind == "WireError":
        return NotPlainData(msg)
    cls = ERRORS.get(kind)
    if cls is None:
        exc = LabCodeError(f"{name}: {msg}" if msg else name)
    else:
        args = err.get("args")
        try:
            exc = cls(*args) if isinstance(args, list) and args else cls(msg)
        except Exception:  # noqa: BLE001 - e.g. a constructor that wants other arguments
            exc = cls(msg)
        if name != kind:
            exc.add_note(f"(lab code raised {name}, a kind of {kind})")
    where = err.get("where")
    if where:
        exc.add_note(f"raised in {str(where)[:200]}")
    exc.lab_error = err  # the loader reads `line` for import errors
    return exc


@contextlib.contextmanager
def arguments_written_back():
    """Within this block, an array argument that lab code changes in place changes for the
    test too, as it would in one process (graded, the lab process's changes are copied
    back). Only a test that checks in-place behaviour, or that lab code leaves its inputs
    alone, asks for it. Elsewhere lab code gets its arguments by value: whatever it does to
    them, a test's own arrays (from which it computes what it expects) never change.
    In one process (plain pytest) nothing is copied: tests pass copies where it matters."""
    r = _active
    if r is None:
        yield
        return
    before, r.write_back = r.write_back, True
    try:
        yield
    finally:
        r.write_back = before


def same_object(a, b) -> bool:
    """``a is b``, also for arrays that came back from lab code in another process."""
    r = _active
    oa, ob = (r.origin(a), r.origin(b)) if r is not None else (None, None)
    if oa is not None and ob is not None:
        return oa[0] == ob[0]
    return a is b


def shares_memory(a, b) -> bool:
    """``np.shares_memory``, also for arrays that came back from lab code in another process."""
    r = _active
    oa, ob = (r.origin(a), r.origin(b)) if r is not None else (None, None)
    if oa is not None and ob is not None:
        return oa[1] < ob[2] and ob[1] < oa[2]
    if oa is not None or ob is not None:
        return False
    return bool(np.shares_memory(a, b))


def start(ctl_fd: int, budget: float, wall: float, module_labs: dict[str, str], lab: str) -> Remote:
    """Called by the grader's test process before pytest starts: lab() goes remote."""
    global _active
    _active = Remote(ctl_fd, budget, wall, module_labs, lab)
    return _active

