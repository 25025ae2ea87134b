"""Implementations that should earn nothing, made from the reference by wrapping it.

The kit's own checks that its tests cannot be gamed (``tests/kit/test_impostors.py``)
run the tests against trees built here:

- ``"zeros"``: every function and method of the lab returns what the reference returns
  with every array replaced by zeros of the same shape and dtype (numbers by 0, strings
  empty, objects kept; what a method changes in place in its object's arrays is undone),
  the work a student who wrote only the shapes would hand in. It must score 0.
- ``"scramble"``: every result is the reference's, but the caller's array arguments are
  overwritten afterwards, as lab code
  that mutates its inputs to make a test's expectation match would do (here: floats NaN,
  booleans inverted, integers changed). Only the tests that check that inputs are left
  alone may fail: a test that builds its expectation from, or calls lab code again with,
  the arguments it passed fails here.

Only the outermost call from outside the lab code is changed: the reference's calls to
its own functions and to earlier labs' run as they are.
"""

from __future__ import annotations

import functools
import shutil
import sys
import threading
import types
from pathlib import Path

import numpy as np

from gptkit.testing.layout import lab_dirs

MODES = ("zeros", "scramble")
_state = threading.local()


def _depth() -> int:
    return getattr(_state, "depth", 0)


def zeros_like(value):
    """``value`` with every array made zeros of its shape and dtype; numbers 0; strings
    empty; lab objects and None as they are."""
    if isinstance(value, np.ndarray):
        return np.zeros_like(value)
    if isinstance(value, np.generic):
        return type(value)(0)
    if type(value) is bool:
        return False
    if type(value) in (int, float):
        return type(value)(0)
    if type(value) in (str, bytes):
        return type(value)()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(zeros_like(v) for v in value)
    if isinstance(value, list):
        return [zeros_like(v) for v in value]
    if isinstance(value, dict):
        return {k: zeros_like(v) for k, v in value.items()}
    if isinstance(value, types.GeneratorType):
        return (zeros_like(v) for v in value)
    return value


def _arrays(value, out: list, seen: set) -> list:
    if id(value) in seen:
        return out
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _arrays(v, out, seen)
    elif isinstance(value, dict):
        for v in value.values():
            _arrays(v, out, seen)
    return out


def _copy_arrays(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_copy_arrays(v) for v in value)
    if isinstance(value, list):
        return [_copy_arrays(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy_arrays(v) for k, v in value.items()}
    return value


def _scramble(arrays: list[np.ndarray]) -> None:
    """Every element changed: floats NaN, booleans inverted, integers' lowest bit flipped,
    so that whatever a test derives from them afterwards differs from what it should."""
    for a in arrays:
        if not (a.flags.writeable and a.size):
            continue
        if a.dtype == np.bool_:
            np.logical_not(a, out=a)
        elif a.dtype.kind in "iu":
            a ^= 1
        elif a.dtype.kind in "fc":
            a[...] = np.nan


def _wrap(fn, mode: str, *, method: bool):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _depth():
            return fn(*args, **kwargs)
        _state.depth = 1
        try:
            if mode == "scramble":
                # lab code gets the arguments by value (as when graded), then spoils the caller's
                start = 1 if method else 0
                given = _arrays((args[start:], kwargs), [], set())
                result = fn(*args[:start], *_copy_arrays(args[start:]), **_copy_arrays(kwargs))
                _scramble(given)
                return result
            kept = []
            if method and fn.__name__ != "__init__":  # its work in place is undone: it did nothing
                kept = [(a, a.copy()) for a in _arrays(list(vars(args[0]).values()), [], set())
                        if a.flags.writeable] if hasattr(args[0], "__dict__") else []
            result = fn(*args, **kwargs)
            for a, before in kept:
                a[...] = before
        finally:
            _state.depth = 0
        return result if fn.__name__ == "__init__" else zeros_like(result)

    return wrapper


def disguise(namespace: dict, mode: str) -> None:
    """Wrap the functions and the methods of the classes that the module whose globals are
    ``namespace`` defines (called at the end of each module of a built tree)."""
    name = namespace["__name__"]
    for key, value in list(namespace.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == name and not key.startswith("__"):
            namespace[key] = _wrap(value, mode, method=False)
        elif isinstance(value, type) and value.__module__ == name:
            for attr, raw in list(vars(value).items()):
                if attr.startswith("__") and attr not in ("__call__", "__init__", "__getitem__", "__len__"):
                    continue
                if isinstance(raw, types.FunctionType):
                    setattr(value, attr, _wrap(raw, mode, method=True))
                elif isinstance(raw, staticmethod):
                    setattr(value, attr, staticmethod(_wrap(raw.__func__, mode, method=False)))
                elif isinstance(raw, classmethod):
                    setattr(value, attr, classmethod(_wrap(raw.__func__, mode, method=True)))


def build_tree(dest: Path, mode: str, source: Path, labs: list[str] | None = None) -> Path:
    """An implementation tree at ``dest``: the lab modules of ``source`` (solutions), each
    followed by a call to :func:`disguise`. ``labs``: lab numbers or names to include
    (every lab up to the last one asked for, as later labs import earlier ones)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    all_labs = lab_dirs(source)
    if labs:
        last = max(i for i, lab in enumerate(all_labs) if lab.name in labs or lab.number in labs)
        all_labs = all_labs[: last + 1]
    footer = (f"\n\nfrom gptkit.testing.impostors import disguise as _disguise  # noqa: E402\n"
              f"_disguise(globals(), {mode!r})\n")
    for lab in all_labs:
        out = dest / lab.name
        out.mkdir(parents=True)
        for module in lab.modules():
            text = (lab.code_dir / f"{module}.py").read_text(encoding="utf-8")
            (out / f"{module}.py").write_text(text + footer, encoding="utf-8")
    return dest


if __name__ == "__main__":  # python -m gptkit.testing.impostors zeros DEST [LAB ...]
    from gptkit.testing.layout import KIT_ROOT

    print(build_tree(Path(sys.argv[2]), sys.argv[1], KIT_ROOT / "solutions", sys.argv[3:] or None))
