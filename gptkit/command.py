"""What the kit's commands for students (``gptkit.demo``, ``gptkit.train``) share: they
run on the implementation tree that ``--impl`` names, and they fail in one line that
says what to do, never with a traceback."""

from __future__ import annotations

import sys
from typing import Callable

from gptkit.testing.layout import bind_tree, resolve_impl


class CommandError(Exception):
    """A problem the user can fix; printed as one line."""


def use_impl(impl: str) -> None:
    """Make the labs of ``--impl`` (labs, solutions or a path) importable by module name."""
    try:
        bind_tree(resolve_impl(impl))
    except ValueError as exc:
        raise CommandError(f"--impl={impl}: {exc}") from None


def run_command(prog: str, run: Callable[[], int], *, also: tuple[type[Exception], ...] = (),
                after_progress: bool = False) -> int:
    """``run()``'s exit status; a ``CommandError`` is printed as ``prog: …`` (status 2), a
    stub's ``NotImplementedError`` ("Lab 0N …") names the lab to finish (status 1), and the
    errors in ``also`` are printed with their type (status 1). ``after_progress``: a
    progress bar may hold the last line of stderr, so the message starts on a new one."""
    try:
        return run()
    except CommandError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except NotImplementedError as exc:
        new_line = "\n" if after_progress else ""
        print(f"{new_line}{prog}: your code is not finished yet: {exc}. Finish that lab first "
              f"(its tests: uv run pytest -m lab{str(exc)[4:6]})", file=sys.stderr)
        return 1
    except also as exc:
        print(f"{prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
