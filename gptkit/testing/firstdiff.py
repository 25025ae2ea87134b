"""Where a result first departs from the reference: a pointer, not only a count.

A whole-model comparison that fails ("5565 of 5760 logits differ") says that something is
wrong, not where. This module names the first place that differs:

- **forward**: :func:`record_trace` runs the *reference* model (when fixtures are made)
  and records every sub-layer call, its inputs and its outputs, in the order the calls
  finish; :func:`trace_arrays` stores that in a fixture. In a test,
  :func:`first_difference` feeds each stored call's inputs to the student's sub-layer of
  the same name (``model.layers[1].self_attn(x, positions)``, through its public API, so
  it works on a graded submission's stand-ins as well) and compares with the stored
  outputs. The first call whose output differs, in finishing order, is the innermost
  culprit: its own parts, fed their reference inputs, agree. When every sub-layer agrees,
  the difference lies in how the model joins them (what it passes to each).
- **backward**: :func:`first_in_order` names the first gradient that differs, in the
  order backpropagation produces them.

Both give one sentence, "first differs at `layers.1.self_attn` …", for
``assert_close(..., locate=lambda: first_difference(model, trace))``; the student copy needs neither solutions nor torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager

import numpy as np

from gptkit.testing.assertions import mismatch_summary

PREFIX = "trace"
FIRST = "first differs at"  # grader.catalogue counts a message with this as naming the place


def _short(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _brief(problem: str) -> str:
    """"12 of 80 elements differ (atol=…); largest …" → "12 of 80 elements differ"."""
    return re.sub(r" \(atol=[^)]*\)", "", problem.split(";")[0])


def first_mismatch(steps: Iterable[tuple[str, object, object]], *, atol: float | Mapping[str, float] = 1e-5,
                   rtol: float = 1e-4) -> tuple[str, str, list[str]] | None:
    """``steps`` yields ``(place, actual, expected)`` in order; the first place whose
    actual is not close to its expected, as (place, what differs, places that agreed
    before it); None when all agree."""
    agreed = []
    for place, actual, expected in steps:
        tol = atol.get(place, 1e-5) if isinstance(atol, Mapping) else atol
        problem = _differs(actual, expected, tol, rtol)
        if problem:
            return place, problem, agreed
        agreed.append(place)
    return None


def _differs(actual, expected, atol: float, rtol: float) -> str | None:
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return f"expected {len(expected)} outputs, got {type(actual).__name__}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            problem = _differs(a, e, atol, rtol)
            if problem:
                return f"output {i}: {problem}"
        return None
    if expected is None:
        return None if actual is None else f"expected None, got {type(actual).__name__}"
    try:
        a, e = np.asarray(actual), np.asarray(expected)
    except Exception as exc:  # noqa: BLE001 - whatever the student returned
        return f"not an array ({type(exc).__name__})"
    if a.shape != e.shape:
        return f"shape {a.shape}, expected {e.shape}"
    if a.dtype.kind not in "fiub":
        return f"dtype {a.dtype}, expected numbers"
    return mismatch_summary(a, e, atol, rtol)


def first_in_order(order: Iterable[str], actual: Mapping, expected: Mapping, *, what: str = "the gradient",
                   atol: float | Mapping[str, float] = 1e-5, rtol: float = 1e-4) -> str | None:
    """The first of ``order`` (e.g. parameter names in the order backpropagation reaches
    them) whose ``actual`` differs from ``expected``, as a sentence; None when all agree."""
    found = first_mismatch(((n, actual.get(n), expected[n]) for n in order if n in expected), atol=atol, rtol=rtol)
    if found is None:
        return None
    place, problem, agreed = found
    shown = agreed[-3:]
    before = (f"; {_short(shown)} before it {'agrees' if len(shown) == 1 else 'agree'}" if agreed
              else "; it is the first one computed")
    return f"{FIRST} `{place}` ({what}: {_brief(problem)}){before}"


# --- the forward trace -----------------------------------------------------------------------------

class _Calls(list):
    started: list[str]


@contextmanager
def record_trace(model):
    """Record every sub-layer call of ``model`` (a kit ``Layer``) while the block runs:
    yields the list of ``(path, args, kwargs, output)``, in the order calls finish (the
    first call of each sub-layer only); afterwards its ``started`` lists the paths in the
    order the calls began."""
    calls, seen, patched, started = _Calls(), set(), [], []
    for path, layer in [("", model), *model.named_layers()]:  # "" is the model itself
        if "forward" in vars(layer):
            continue

        def wrapped(*args, _path=path, _forward=layer.forward, **kwargs):
            if _path not in started:
                started.append(_path)
            out = _forward(*args, **kwargs)
            if _path not in seen:
                seen.add(_path)
                calls.append((_path, args, kwargs, out))
            return out

        layer.forward = wrapped
        patched.append(layer)
    try:
        yield calls
    finally:
        for layer in patched:
            del layer.forward
        calls.started = started  # the order the calls began in: outer layers before their parts


def _encode(value, key: str, arrays: dict) -> dict | None:
    if isinstance(value, np.ndarray):
        arrays[key] = value
        return {"array": key}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, np.generic):
        return {"value": value.item()}
    return None  # not replayable (a cache, a generator…)


def trace_arrays(calls, prefix: str = PREFIX) -> dict[str, np.ndarray]:
    """A recorded trace as fixture arrays: ``<prefix>.calls`` (JSON: each call's path and
    how to rebuild its arguments) and each array argument and output."""
    arrays, spec = {}, []
    for i, (path, args, kwargs, out) in enumerate(calls):
        base = f"{prefix}.{i}"
        enc_args = [_encode(a, f"{base}.arg.{j}", arrays) for j, a in enumerate(args)]
        enc_kwargs = {k: _encode(v, f"{base}.kw.{k}", arrays) for k, v in kwargs.items()}
        outs = out if isinstance(out, tuple) else (out,)
        enc_out = [_encode(o, f"{base}.out.{j}", arrays) for j, o in enumerate(outs)]
        if None in enc_args or None in enc_kwargs.values() or None in enc_out:
            for key in [k for k in arrays if k.startswith(base + ".")]:
                del arrays[key]
            continue
        spec.append({"path": path, "args": enc_args, "kwargs": enc_kwargs, "out": enc_out,
                     "tuple": isinstance(out, tuple)})
    arrays[f"{prefix}.calls"] = np.frombuffer(json.dumps(spec).encode(), np.uint8).copy()
    return arrays


def _decode(enc: dict, fixture: Mapping):
    return np.array(fixture[enc["array"]]) if "array" in enc else enc["value"]


def _resolve(model, path: str):
    node = model
    for part in path.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def _calls(fixture: Mapping, prefix: str) -> list[dict]:
    return json.loads(np.asarray(fixture[f"{prefix}.calls"]).tobytes())


def _inputs(call: dict, fixture: Mapping) -> tuple[list, dict]:
    return [_decode(a, fixture) for a in call["args"]], {k: _decode(v, fixture) for k, v in call["kwargs"].items()}


def _first_input_difference(model, fixture: Mapping, prefix: str) -> str | None:
    """Run the student's model (a kit ``Layer`` in this process) on the reference's input
    and name the first sub-layer that it calls with other inputs than the reference does."""
    from gptkit.layer import Layer

    calls = _calls(fixture, prefix)
    if not isinstance(model, Layer) or not calls or calls[-1]["path"]:
        return None  # a graded submission's stand-in, or no record of the model's own call
    args, kwargs = _inputs(calls[-1], fixture)
    try:
        with record_trace(model) as mine:
            model(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the comparison already failed; this only adds a pointer
        return None
    theirs = {path: (a, kw) for path, a, kw, _ in mine}
    for call in sorted(calls[:-1], key=lambda c: mine.started.index(c["path"]) if c["path"] in theirs else 0):
        if call["path"] not in theirs:
            continue
        ref_args, ref_kwargs = _inputs(call, fixture)
        got_args, got_kwargs = theirs[call["path"]]
        for i, expected in enumerate(ref_args):
            got = got_args[i] if i < len(got_args) else None
            problem = _differs(got, expected, 1e-5, 1e-4) if not isinstance(expected, str) else None
            if problem:
                return f"`{call['path']}` is called with argument {i + 1} unlike the reference's ({_brief(problem)})"
        for name, expected in ref_kwargs.items():
            problem = _differs(got_kwargs.get(name), expected, 1e-5, 1e-4) if not isinstance(expected, str) else None
            if problem:
                return f"`{call['path']}` is called with {name}= unlike the reference's ({_brief(problem)})"
    return None


def _replay(model, fixture: Mapping, prefix: str):
    for call in _calls(fixture, prefix):
        path = call["path"]
        if not path:
            continue  # the model itself: the test compares its output
        outs = [_decode(o, fixture) for o in call["out"]]
        expected = tuple(outs) if call["tuple"] else outs[0]
        try:
            layer = _resolve(model, path)
        except (AttributeError, IndexError, TypeError, KeyError):
            continue  # the student's model is laid out differently here: nothing to compare
        args, kwargs = _inputs(call, fixture)
        if len(outs) == 1 and args and isinstance(args[0], np.ndarray) and np.array_equal(args[0], outs[0]):
            continue  # an identity here (dropout in eval mode): it tells nothing
        try:
            actual, error = layer(*args, **kwargs), None
        except Exception as exc:  # noqa: BLE001 - the student's sub-layer crashed on the reference's input
            actual, error = None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"
        yield path, actual, expected, error


def first_difference(model, fixture: Mapping, *, atol: float = 1e-4, rtol: float = 1e-4,
                     prefix: str = PREFIX) -> str | None:
    """Feed each sub-layer of the student's ``model`` the inputs its namesake in the
    reference received (stored by :func:`trace_arrays`) and name the first whose output
    differs, with its parts that agree; None when the fixture has no trace."""
    if f"{prefix}.calls" not in fixture:
        return None
    steps = []
    for path, actual, expected, error in _replay(model, fixture, prefix):
        if error:
            return f"{FIRST} `{path}`: given the reference's input, it raised {error}"
        steps.append(path)
        problem = _differs(actual, expected, atol, rtol)
        if problem:
            parts = [p[len(path) + 1:] for p in steps if p.startswith(path + ".")]
            agree = f"; its parts {_short(parts)} agree, so a step between them differs" if parts else ""
            return f"{FIRST} `{path}` (given the reference's input, {_brief(problem)}){agree}"
    if not steps:
        return None
    passed = _first_input_difference(model, fixture, prefix)
    return (f"{FIRST} the whole model, in how it joins its sub-layers (each agrees on the reference's inputs)"
            + (f": {passed}" if passed else " (the positions, the mask, the residual stream, or after the last one)"))

