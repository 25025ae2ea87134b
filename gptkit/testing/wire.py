"""The grader's channel between the test process and the process that runs lab code.

When a submission is graded, the tests run in one process and the student's code in
another; they exchange *plain data* only: ``None``, booleans, numbers, strings, bytes,
paths, slices, lists, tuples, dicts, NumPy arrays and scalars of numeric dtypes, seeded
generators (as their state), and *handles* that name an object living on the other
side (or, for a function a test passes to lab code, a *callback*: calling it asks the
test process to run it on plain arguments; for an iterator, such as a generator, a
callback per item). Decoding never runs code the sender chose: the format is JSON (no pickle) with
the arrays' raw bytes after it, every dtype from a fixed list, every shape checked
against the bytes it claims.

A message is ``<8-byte little-endian length of the JSON> <JSON> <each array's bytes>``.
In the JSON, plain lists, strings, numbers, booleans and null stand for themselves;
everything else is a one-key object whose key starts with ``$``.
"""

from __future__ import annotations

import json
import math
import pathlib
import struct
from collections.abc import Callable

import numpy as np

MAX_MESSAGE_BYTES = 1 << 32  # one message, arrays included (a 124M-parameter state dict is 0.5 GB)
MAX_DEPTH = 64
DTYPES = frozenset(np.dtype(t).str for t in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128"))
BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
SCALAR_TYPES = frozenset(np.dtype(t).type.__name__ for t in DTYPES)
_HEAD = struct.Struct("<Q")


class WireError(Exception):
    """A value that cannot cross the channel, or a malformed message."""


class Handle:
    """Names an object that lives on the other side (by a number that side chose)."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id


class GeneratorRef:
    """A ``np.random.Generator`` sent by reference: the sender's number for it and its state."""

    __slots__ = ("ref", "state")

    def __init__(self, ref: int, state: dict):
        self.ref, self.state = ref, state


def type_name(obj) -> str:
    t = type(obj)
    return t.__name__ if t.__module__ in ("builtins", None) else f"{t.__module__}.{t.__qualname__}"


# --- encoding --------------------------------------------------------------------------------

class Encoder:
    """Turns a value into (JSON-able tree, arrays). ``other(value, encoder)`` is called for
    any value that is not plain data and returns its encoding (a handle, a generator
    reference) or raises WireError; ``arrays_seen`` collects every ndarray encoded, in order."""

    def __init__(self, other: Callable[[object, "Encoder"], dict], *, same_as: dict | None = None, provenance: bool = False):
        self.other = other
        self.buffers: list[np.ndarray] = []
        self.arrays_seen: list[np.ndarray] = []
        self.same_as = same_as or {}  # id(array) → its index among the arrays the other side sent
        self.provenance = provenance  # describe where each array lives (object id, byte range)

    def __call__(self, value, depth: int = 0):
        if depth > MAX_DEPTH:
            raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
        t = type(value)
        if value is None or t is bool or t is str:
            return value
        if t is int:
            return value
        if t is float:
            return value if math.isfinite(value) else {"$f": repr(value)}
        if t is list:
            return [self(v, depth + 1) for v in value]
        if t is tuple:
            return {"$t": [self(v, depth + 1) for v in value]}
        if t is dict:
            return {"$m": [[self(k, depth + 1), self(v, depth + 1)] for k, v in value.items()]}
        if t is np.ndarray:
            return self.array(value)
        if isinstance(value, np.generic) and t.__module__ == "numpy":
            if value.dtype.str not in DTYPES:
                raise WireError(f"a NumPy scalar of dtype {value.dtype} (only numeric dtypes are plain data)")
            return {"$s": self.array(np.asarray(value))["$a"]}
        if t is bytes:
            self.buffers.append(np.frombuffer(value, np.uint8))
            return {"$b": len(value)}
        if isinstance(value, pathlib.PurePath) and t.__module__ == "pathlib":
            return {"$p": str(value)}
        if t is slice:
            return {"$sl": [self(value.start, depth + 1), self(value.stop, depth + 1), self(value.step, depth + 1)]}
        if value is Ellipsis:
            return {"$E": 0}
        if isinstance(value, (dict, list, tuple)):  # OrderedDict, a named tuple, …: their plain contents
            kind = dict if isinstance(value, dict) else list if isinstance(value, list) else tuple
            return self(kind(value), depth)
        if isinstance(value, np.dtype) and t.__module__.startswith("numpy"):
            if value.str not in DTYPES:
                raise WireError(f"the dtype {value} (only numeric dtypes are plain data)")
            return {"$dt": value.str}
        if t is type and issubclass(value, np.generic) and value.__module__ == "numpy" \
                and value.__name__ in SCALAR_TYPES:
            return {"$st": value.__name__}
        return self.other(value, self)

    def array(self, a: np.ndarray) -> dict:
        if a.dtype.str not in DTYPES:
            raise WireError(f"an array of dtype {a.dtype} (only numeric and boolean arrays are plain data)")
        if id(a) in self.same_as:
            return {"$r": self.same_as[id(a)]}
        self.arrays_seen.append(a)
        self.buffers.append(np.ascontiguousarray(a))
        spec = [a.dtype.str, list(a.shape)]
        if self.provenance:
            spec.append([id(a), *byte_range(a)])
        return {"$a": spec}


def byte_range(a: np.ndarray) -> tuple[int, int]:
    """[first, last) byte addresses an array's elements occupy."""
    lo = hi = a.__array_interface__["data"][0]
    if a.size == 0:
        return lo, lo
    for n, stride in zip(a.shape, a.strides):
        (lo, hi) = (lo + stride * (n - 1), hi) if stride < 0 else (lo, hi + stride * (n - 1))
    return lo, hi + a.itemsize


def generator_state(gen: np.random.Generator) -> dict:
    bg = gen.bit_generator
    name = type(bg).__name__
    if name not in BIT_GENERATORS or type(gen) is not np.random.Generator:
        raise WireError(f"a random generator of type {type_name(gen)} / {name}")
    return bg.state


def make_generator(state) -> np.random.Generator:
    if not isinstance(state, dict) or state.get("bit_generator") not in BIT_GENERATORS:
        raise WireError("a generator state that names no known bit generator")
    bg = getattr(np.random, state["bit_generator"])()
    try:
        bg.state = state
    except (TypeError, ValueError, KeyError) as exc:
        raise WireError(f"a malformed {state['bit_generator']} state: {exc}") from None
    return np.random.Generator(bg)


# --- decoding --------------------------------------------------------------------------------

class Decoder:
    """Rebuilds a value from a JSON tree whose arrays are read by ``read_into`` (a function
    filling a writable byte view). ``handle`` maps a handle number to an object on this
    side; ``generator`` maps a GeneratorRef to a Generator on this side."""

    def __init__(self, read_into: Callable[[memoryview], None], handle: Callable[[int], object],
                 generator: Callable[[GeneratorRef], object], *, sent: list | None = None,
                 provenance: Callable[[np.ndarray, list], None] | None = None,
                 callback: Callable[[int], object] | None = None, budget: int = MAX_MESSAGE_BYTES):
        self.read_into, self.handle, self.generator = read_into, handle, generator
        self.callback = callback  # maps "$c" (a function of the other side, callable from here)
        self.sent = sent or []  # the arrays this side sent in the request being answered ("$r")
        self.provenance = provenance
        self.budget = budget
        self.arrays: list[np.ndarray] = []

    def _take(self, n: int) -> None:
        if n < 0 or n > self.budget:
            raise WireError(f"a message larger than the {MAX_MESSAGE_BYTES} bytes allowed")
        self.budget -= n

    def _array(self, spec) -> np.ndarray:
        if not (isinstance(spec, list) and len(spec) in (2, 3) and isinstance(spec[0], str)
                and isinstance(spec[1], list)):
            raise WireError("a malformed array description")
        dtype, shape = spec[:2]
        if dtype not in DTYPES:
            raise WireError(f"an array of dtype {dtype!r}, which is not plain data")
        if len(shape) > 32 or not all(type(n) is int and 0 <= n for n in shape):
            raise WireError(f"an array of shape {shape!r}")
        dt = np.dtype(dtype)
        count = math.prod(shape)
        self._take(count * dt.itemsize)
        arr = np.empty(shape, dt)
        if arr.nbytes:
            self.read_into(memoryview(arr.reshape(-1).view(np.uint8)))
        self.arrays.append(arr)
        if len(spec) == 3 and self.provenance is not None:
            where = spec[2]
            if not (isinstance(where, list) and len(where) == 3 and all(type(v) is int for v in where)):
                raise WireError("a malformed array origin")
            self.provenance(arr, where)
        return arr

    def __call__(self, node, depth: int = 0):
        if depth > MAX_DEPTH:
            raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self(v, depth + 1) for v in node]
        if not (isinstance(node, dict) and len(node) == 1):
            raise WireError("a malformed value")
        (tag, body), = node.items()
        if tag == "$a":
            return self._array(body)
        if tag == "$s":
            return self._array(body)[()]
        if tag == "$t":
            return tuple(self(v, depth + 1) for v in _list(body))
        if tag == "$m":
            out = {}
            for pair in _list(body):
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise WireError("a malformed dict entry")
                key = self(pair[0], depth + 1)
                try:
                    out[key] = self(pair[1], depth + 1)
                except TypeError:
                    raise WireError("a dict key that cannot be hashed") from None
            return out
        if tag == "$f":
            if body not in ("nan", "inf", "-inf"):
                raise WireError("a malformed float")
            return float(body)
        if tag == "$b":
            if type(body) is not int:
                raise WireError("a malformed bytes value")
            self._take(body)
            buf = bytearray(body)
            if body:
                self.read_into(memoryview(buf))
            return bytes(buf)
        if tag == "$p":
            if not isinstance(body, str):
                raise WireError("a malformed path")
            return pathlib.Path(body)
        if tag == "$sl":
            parts = [self(v, depth + 1) for v in _list(body)]
            if len(parts) != 3 or not all(p is None or type(p) is int for p in parts):
                raise WireError("a malformed slice")
            return slice(*parts)
        if tag == "$E":
            return Ellipsis
        if tag == "$r":
            if type(body) is not int or not 0 <= body < len(self.sent):
                raise WireError("a reference to an argument that was not sent")
            return self.sent[body]
        if tag == "$dt":
            if body not in DTYPES:
                raise WireError(f"a dtype {body!r} that is not plain data")
            return np.dtype(body)
        if tag == "$st":
            if body not in SCALAR_TYPES:
                raise WireError(f"a scalar type {body!r} that is not plain data")
            return getattr(np, body)
        if tag == "$h":
            if type(body) is not int:
                raise WireError("a malformed handle")
            return self.handle(body)
        if tag == "$c":
            if type(body) is not int or self.callback is None:
                raise WireError("a malformed or unexpected callback")
            return self.callback(body)
        if tag == "$i":
            if type(body) is not int or self.callback is None:
                raise WireError("a malformed or unexpected iterator")
            return CallbackIterator(self.callback(body))
        if tag == "$g":
            if not (isinstance(body, list) and len(body) == 2 and type(body[0]) is int):
                raise WireError("a malformed generator")
            return self.generator(GeneratorRef(body[0], self(body[1], depth + 1)))
        raise WireError(f"an unknown kind of value {tag!r}")


class CallbackIterator:
    """An iterator of the other side (a generator a test passes to lab code): each
    ``next`` calls it back for one item; it ends when the other side's iterator ends."""

    __slots__ = ("_next_item",)

    def __init__(self, next_item):
        self._next_item = next_item

    def __iter__(self):
        return self

    def __next__(self):
        return self._next_item()


def _list(body) -> list:
    if not isinstance(body, list):
        raise WireError("a malformed value")
    return body


# --- one message on a stream socket ----------------------------------------------------------

def send(sock, tree, buffers: list[np.ndarray]) -> None:
    head = json.dumps(tree, separators=(",", ":"), allow_nan=False).encode()
    total = len(head) + sum(b.nbytes for b in buffers)
    if total > MAX_MESSAGE_BYTES:
        raise WireError(f"a message of {total} bytes, more than the {MAX_MESSAGE_BYTES} allowed")
    small = [head] + [b.tobytes() for b in buffers if b.nbytes <= 65536]
    if len(small) == len(buffers) + 1:  # everything small: one write
        sock.sendall(_HEAD.pack(len(head)) + b"".join(small))
        return
    sock.sendall(_HEAD.pack(len(head)) + head)
    for b in buffers:
        if b.nbytes:
            sock.sendall(memoryview(b.reshape(-1).view(np.uint8)))


class Reader:
    """Reads whole messages from a stream socket (EOFError when the other side is gone)."""

    def __init__(self, sock):
        self.sock = sock

    def read_into(self, view: memoryview) -> None:
        got, n = 0, len(view)
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError("the other process closed the channel")
            got += k

    def header(self):
        head = bytearray(_HEAD.size)
        self.read_into(memoryview(head))
        (n,) = _HEAD.unpack(head)
        if n > MAX_MESSAGE_BYTES:
            raise WireError("a message header larger than allowed")
        body = bytearray(n)
        self.read_into(memoryview(body))
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise WireError("a message that is not JSON (or nested too deeply)") from None
