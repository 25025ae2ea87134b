"""Stored fixtures: ``tests/NN_name/fixtures/<case>.npz``, written byte-for-byte
reproducibly (fixed zip timestamps, sorted keys) so regenerating them is a no-op."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from gptkit.testing.layout import KIT_ROOT

TESTS_DIR = KIT_ROOT / "tests"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def fixture_path(lab: str, case: str, tests_dir: Path = TESTS_DIR) -> Path:
    return Path(tests_dir) / lab / "fixtures" / f"{case}.npz"


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Like ``np.savez_compressed`` but deterministic: same arrays → same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            data = io.BytesIO()
            np.lib.format.write_array(data, np.array(arrays[key], order="C"), allow_pickle=False)  # 0-d stays 0-d
            zf.writestr(info, data.getvalue())
    tmp = path.with_suffix(".npz.tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


_cache: dict[Path, dict[str, np.ndarray]] = {}


class Fixture(dict):
    """A stored fixture's arrays by name; ``f[name]`` is a new copy each time, so that what
    lab code does to an array a test passed it never reaches the next ``f[name]`` (nor what
    the test expects from it)."""

    def __getitem__(self, key):
        return super().__getitem__(key).copy()


def load_fixture(lab: str, case: str) -> Fixture:
    """The arrays of one stored fixture (read once per session, never pickled)."""
    path = fixture_path(lab, case)
    if path not in _cache:
        if not path.is_file():
            raise FileNotFoundError(
                f"fixture {path.relative_to(KIT_ROOT)} is missing: run `uv run grader fixtures`"
            )
        with np.load(path, allow_pickle=False) as data:
            _cache[path] = {k: data[k] for k in data.files}
    return Fixture({k: v.copy() for k, v in _cache[path].items()})


def fixture_params(fixture: dict[str, np.ndarray], prefix: str = "param.") -> dict[str, np.ndarray]:
    """The arrays a fixture stores under ``prefix``, named without it; a catalogued
    mistake's stored outputs (``<name>@<bug id>``) are left out."""
    return {k[len(prefix):]: v for k, v in fixture.items() if k.startswith(prefix) and "@" not in k}


# What a catalogued mistake outputs is stored beside the right answer: ``<output>@<bug id>``
# holds the array, ``label@<bug id>`` the bug's concept (``solutions/NN_name/bugs.toml``).
def diagnosis_key(output: str, bug_id: str) -> str:
    return f"{output}@{bug_id}"


def label_key(bug_id: str) -> str:
    return f"label@{bug_id}"


def stored_diagnoses(fixture: dict[str, np.ndarray], output: str) -> dict[str, np.ndarray]:
    """``{label: what that mistake outputs}`` for one output of a fixture, for
    ``assert_close(..., diagnoses=...)``."""
    prefix = diagnosis_key(output, "")
    return {str(fixture[label_key(key[len(prefix):])]): value
            for key, value in sorted(fixture.items()) if key.startswith(prefix)}


def diagnosis_label(fixture: dict[str, np.ndarray], bug_id: str) -> str:
    return str(fixture[label_key(bug_id)])


def eos_choices(new_tokens: np.ndarray, skip=()) -> dict[str, int] | None:
    """For generated tokens ``new_tokens`` (B, n) decoded without an EOS: one token id that
    every row emits before its last step, at different steps (``"all"``: the loop must stop
    early, the last row's EOS appended), one that only some rows emit (``"some"``) and one
    that no row emits (``"none"``); None when this batch has no such three. Ids in ``skip``
    (the padding id, the start token) are never chosen."""
    new_tokens = np.asarray(new_tokens)
    B, n = new_tokens.shape
    found: dict[str, int] = {}
    for t in range(int(new_tokens.max()) + 2):
        if t in skip:
            continue
        rows = [b for b in range(B) if t in new_tokens[b]]
        first = {int(np.argmax(new_tokens[b] == t)) for b in rows}
        if len(rows) == B and max(first) < n - 1 and len(first) > 1:
            found.setdefault("all", t)
        elif 0 < len(rows) < B:
            found.setdefault("some", t)
        elif not rows:
            found.setdefault("none", t)
    return found if len(found) == 3 else None
