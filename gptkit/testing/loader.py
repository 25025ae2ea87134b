"""Tests reach the code under test through ``lab("module")`` and nothing else.

The conftest puts the chosen implementation tree's lab folders on ``sys.path``; this
module imports from there lazily, at the first attribute access inside a test, so a
student's syntax error or missing function fails that lab's tests with a readable
message instead of breaking collection for every lab.

When the grader runs the tests, the lab code lives in another process: ``lab()`` then
hands out stand-ins from ``remote.py`` and this process never imports student code.
"""

from __future__ import annotations

import importlib
import traceback

import pytest

from gptkit.testing import remote
from gptkit.testing.layout import module_lab

_current_root = None  # set by the conftest: the implementation tree under test


def set_root(root) -> None:
    global _current_root
    _current_root = root


def _where(module: str) -> str:
    """The file as the student knows it: labs/NN_name/src/<module>.py."""
    if remote.active() is not None:
        return f"labs/{remote.active().module_labs.get(module, '<lab>')}/src/{module}.py"
    lab = module_lab(module, _current_root) if _current_root is not None else None
    if lab is None:
        return f"{module}.py"
    if lab.code_dir.name != "src" and lab.code_dir.parent.name == "solutions":
        return f"solutions/{lab.name}/{module}.py"
    return f"labs/{lab.name}/src/{module}.py"


class _LabModule:
    """A lazy stand-in for one lab module (``causal_mask``, ``layers``, …)."""

    def __init__(self, name: str):
        self._name = name

    def _load(self):
        r = remote.active()
        try:
            return r.module(self._name) if r is not None else importlib.import_module(self._name)
        except NotImplementedError:
            raise
        except remote.TestTimeLimit:
            raise
        except BaseException as exc:  # syntax errors, bad imports, sys.exit or crashes at import time
            line = ""
            err = getattr(exc, "lab_error", None)
            if err is not None:  # raised in the lab process
                kind = err.get("name") or type(exc).__name__
                if type(err.get("line")) is int:
                    line = f" (line {err['line']})"
                pytest.fail(f"could not import {_where(self._name)}{line}: {kind}: {err.get('msg', exc)}",
                            pytrace=False)
            frames = traceback.extract_tb(exc.__traceback__)
            if isinstance(exc, SyntaxError) and exc.lineno:
                line = f" (line {exc.lineno})"
            elif frames:
                line = f" (line {frames[-1].lineno})"
            pytest.fail(
                f"could not import {_where(self._name)}{line}: {type(exc).__name__}: {exc}",
                pytrace=False,
            )

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        module = self._load()
        r = remote.active()
        try:
            return r.module_attr(self._name, module, attr) if r is not None else getattr(module, attr)
        except AttributeError as exc:
            if getattr(exc, "lab_error", None) is not None and f"'{attr}'" not in str(exc):
                raise  # raised by lab code while the module's attribute was computed
            pytest.fail(
                f"{_where(self._name)} has no `{attr}`: the tests call it by that name "
                f"(was it renamed or deleted?)",
                pytrace=False,
            )

    def __repr__(self) -> str:
        return f"<lab module {self._name!r}>"


def lab(module: str) -> _LabModule:
    """The module ``module`` of the implementation under test, imported on first use."""
    return _LabModule(module)


