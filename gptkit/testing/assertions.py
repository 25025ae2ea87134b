"""Array comparisons whose failures read like a tutor's note, not a wall of numbers."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from gptkit.testing import tolerance_log


def _type_name(value) -> str:
    from gptkit.testing import remote  # graded: a stand-in names the lab code's own type

    try:
        return remote.type_name(value)
    except Exception:  # noqa: BLE001 - a name for a message
        return type(value).__name__


def assert_ndarray(actual, by: str, *, dtype=None, shape=None) -> np.ndarray:
    """The result a test is about to inspect is a real NumPy array: ``np.ndarray`` itself,
    not a subclass and not an object that only looks like one (indexes, has a ``shape``).
    ``by`` names what returned it ("causal_mask(4, 6)"); ``dtype`` a dtype, or a string of
    dtype kinds ("iu": any integer); ``shape`` a tuple. Returns the array."""
    __tracebackhide__ = True
    if type(actual) is not np.ndarray:
        kind = _type_name(actual)
        what = ("a NumPy scalar" if isinstance(actual, np.generic) else
                f"a subclass of np.ndarray ({kind})" if isinstance(actual, np.ndarray) else
                f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind} object")
        raise AssertionError(f"{by} returned {what}, not a NumPy array (np.ndarray)")
    if dtype is not None:
        ok = actual.dtype.kind in dtype if isinstance(dtype, str) else actual.dtype == np.dtype(dtype)
        if not ok:
            want = ({"b": "bool", "iu": "integer", "i": "signed integer", "f": "floating-point"}.get(dtype, dtype)
                    if isinstance(dtype, str) else str(np.dtype(dtype)))
            msg = f"{by} returned an array of dtype {actual.dtype}, expected {want}"
            if want == "float32" and actual.dtype == np.float64:
                msg += (" (float32 inputs must give float32 output: a float64 constant, np.sqrt of a Python int "
                        "or an array made without dtype= can promote everything to float64)")
            raise AssertionError(msg)
    if shape is not None and actual.shape != tuple(shape):
        raise AssertionError(f"{by} returned an array of shape {actual.shape}, expected {tuple(shape)}")
    return actual


def _as_array(actual, what: str) -> np.ndarray:
    __tracebackhide__ = True
    if type(actual) is not np.ndarray and not isinstance(actual, np.generic):
        kind = _type_name(actual)
        raise AssertionError(f"{what}: expected a NumPy array, got {'an' if kind[:1].lower() in 'aeiou' else 'a'} "
                             f"{kind} object" + (" (a subclass of np.ndarray)" if isinstance(actual, np.ndarray) else ""))
    arr = np.asarray(actual)
    if arr.dtype == object:
        raise AssertionError(f"{what}: expected a numeric array, got an object array")
    return arr


def mismatch_summary(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> str | None:
    """None when close; otherwise one line: how many differ, the largest difference, where."""
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    bad = ~np.isclose(a, e, atol=atol, rtol=rtol, equal_nan=False)
    if not bad.any():
        return None
    diff = np.where(bad, np.abs(a - e), 0.0)
    diff = np.where(np.isnan(diff), np.inf, diff)
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
    idx_t = tuple(int(i) for i in idx)
    return (
        f"{int(bad.sum())} of {bad.size} elements differ (atol={atol:g}, rtol={rtol:g}); "
        f"largest difference {float(diff[idx]):.3g} at index {idx_t}: "
        f"expected {float(e[idx]):.6g}, got {float(a[idx]):.6g}"
    )


def _matching(arr: np.ndarray, diagnoses: Mapping[str, np.ndarray] | None, atol: float, rtol: float) -> list[str]:
    """The labels of the ``diagnoses`` whose output ``arr`` matches (same shape, within the
    comparison's tolerance), in the order given."""
    found = []
    for label, candidate in (diagnoses or {}).items():
        candidate = np.asarray(candidate)
        if candidate.shape == arr.shape and arr.dtype.kind in "fiub" and candidate.dtype.kind in "fiub" \
                and mismatch_summary(arr, candidate, atol, rtol) is None:
            found.append(label)
    return found


def assert_close(
    actual,
    expected,
    *,
    what: str,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    hint: str | None = None,
    diagnoses: Mapping[str, np.ndarray] | None = None,
    locate: Callable[[], str | None] | None = None,
) -> None:
    """Assert ``actual`` ≈ ``expected`` with a short message naming ``what`` went wrong.

    ``diagnoses`` maps a description of a known mistake (e.g. "the scores were not
    divided by √d") to what that mistake would produce; when ``actual`` matches one,
    the message says so. ``locate``, called only on a mismatch, names where the result
    first departs from the reference (``gptkit.testing.firstdiff``).
    """
    __tracebackhide__ = True
    arr = _as_array(actual, what)
    expected = np.asarray(expected)
    if arr.shape != expected.shape:  # a known mistake can change the shape too (a weight left untransposed)
        named = "".join(f"Your result matches {label}. " for label in _matching(arr, diagnoses, atol, rtol)[:1])
        raise AssertionError(f"{what}: {named}expected shape {expected.shape}, got {arr.shape}"
                             + (f". {hint}" if hint else ""))
    if arr.dtype.kind not in "fiub":
        raise AssertionError(f"{what}: expected a numeric array, got dtype {arr.dtype}")
    finite_expected = np.isfinite(expected)
    broken = ~np.isfinite(arr) & finite_expected
    if broken.any():
        first = tuple(int(i) for i in np.argwhere(broken)[0])
        msg = (
            f"{what}: {int(broken.sum())} of {arr.size} values are NaN or infinite where a "
            f"finite number was expected (first at index {first})"
        )
        raise AssertionError(msg + (f". {hint}" if hint else ""))
    if tolerance_log.enabled():  # the tolerance certificate's recorder (grader tolerances)
        tolerance_log.record(what, arr, expected, atol, rtol)
    summary = mismatch_summary(arr, expected, atol, rtol)
    if summary is None:
        return
    # The diagnosis first, then where it departs, then the numbers, then the hint.
    named = [f"Your result matches {label}" for label in _matching(arr, diagnoses, atol, rtol)[:1]]
    if locate is not None:
        try:
            where = locate()
        except Exception as exc:  # noqa: BLE001 - a pointer must never hide the failure it explains
            where = f"(could not locate the first difference: {type(exc).__name__})"
        if where:
            named.append(f"{where[0].upper()}{where[1:]}")
    msg = f"{what}: " + "".join(f"{n}. " for n in named) + summary
    if hint:
        msg += f". {hint}"
    raise AssertionError(msg)


def assert_float32(actual, what: str) -> None:
    """Float32 in must give float32 out: no silent float64 promotion."""
    __tracebackhide__ = True
    arr = _as_array(actual, what)
    if arr.dtype != np.float32:
        raise AssertionError(
            f"{what}: float32 inputs must give float32 output, got {arr.dtype} "
            f"(a float64 constant, np.sqrt of a Python int or an array made without "
            f"dtype= can promote everything to float64)"
        )


def assert_causal(
    run: Callable[[np.ndarray], np.ndarray],
    x: np.ndarray,
    t: int,
    future: Callable[[tuple[int, ...]], np.ndarray],
    *,
    what: str,
    outputs: str = "outputs",
    cause: str = "a position is attending to the future",
    atol: float = 1e-6,
) -> None:
    """Changing the tokens after position ``t`` must not change ``run``'s outputs at
    positions 0…t (the sequence axis is axis 1).

    ``future(shape)`` gives the new values for positions t+1…; a failure reads
    "<what> at positions 0…t: …. changing tokens after position t changed earlier
    <outputs>: <cause>".
    """
    __tracebackhide__ = True
    changed = x.copy()
    changed[:, t + 1:] = future(changed[:, t + 1:].shape)
    before = run(x.copy())  # lab code gets copies: what it does to them changes neither run
    assert_close(run(changed)[:, : t + 1], _as_array(before, what)[:, : t + 1], what=f"{what} at positions 0…{t}", atol=atol,
                 hint=f"changing tokens after position {t} changed earlier {outputs}: {cause}")


class _Raises:
    """Context manager behind :func:`raises_clearly`."""

    def __init__(self, exc, when: str, mentions: str | None):
        self.exc = exc if isinstance(exc, tuple) else (exc,)
        self.when, self.mentions = when, mentions

    def __enter__(self):
        return self

    def __exit__(self, etype, value, tb):
        __tracebackhide__ = True
        names = " or ".join(e.__name__ for e in self.exc)
        if etype is None:
            raise AssertionError(f"{self.when}: expected a {names}, but nothing was raised")
        if issubclass(etype, NotImplementedError):
            return False  # an unfinished stub: let its own message through
        if not issubclass(etype, self.exc):
            raise AssertionError(f"{self.when}: expected a {names}, got {etype.__name__}: {value}") from value
        if self.mentions and self.mentions.lower() not in str(value).lower():
            raise AssertionError(
                f"{self.when}: the {etype.__name__} should mention {self.mentions!r} so the user "
                f"knows what went wrong; it says: {value}"
            ) from value
        return True


def assert_rejects_bad_x(layer: Callable, name: str, width: int, wrong_width: int) -> None:
    """A layer on x (B, T, D) refuses x of another width and a 2-D x with a ValueError that
    says which (``name``: the layer as built, e.g. "MultiHeadAttention(12, 3)")."""
    __tracebackhide__ = True
    with raises_clearly(ValueError, when=f"{name} on x of width {wrong_width}", mentions="last dimension"):
        layer(np.zeros((1, 3, wrong_width), np.float32))
    with raises_clearly(ValueError, when=f"{name.split('(')[0]} on a 2-D x", mentions="dimensions"):
        layer(np.zeros((3, width), np.float32))


def raises_clearly(exc, *, when: str, mentions: str | None = None) -> _Raises:
    """Like ``pytest.raises``, but a miss reads "<when>: expected a ValueError, but nothing
    was raised", and the error's text must mention ``mentions`` when given."""
    return _Raises(exc, when, mentions)


class _Explains:
    """Context manager behind :func:`explains_errors`."""

    def __init__(self, what: str, hint: str):
        self.what, self.hint = what, hint

    def __enter__(self):
        return self

    def __exit__(self, etype, value, tb):
        __tracebackhide__ = True
        if etype is None or issubclass(etype, (NotImplementedError, AssertionError)) or not issubclass(etype, Exception):
            return False  # success, an unfinished stub, a failed check or an interrupt: as they are
        raise AssertionError(f"{self.what} raised {etype.__name__}: {value}. {self.hint}") from value


def explains_errors(what: str, hint: str) -> _Explains:
    """Turn an unexpected error inside the block (a crash in the student's code on valid
    input) into a failure that says what was being done and what usually causes it."""
    return _Explains(what, hint)
