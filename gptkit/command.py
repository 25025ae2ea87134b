"""What the kit's commands for students (``gptkit.demo``, ``gptkit.train``) share: they
run on the implementation tree that ``--impl`` names, they fail in one line that says
what to do, never with a traceback, they keep freed memory for reuse
(``keep_freed_memory``, also used by the benchmarks), and they read text through that
tree's lab 10 tokenizer (``lab_gpt2_tokenizer``)."""

from __future__ import annotations

import ctypes
import sys
from typing import Callable

from gptkit.testing.layout import bind_tree, resolve_impl


class CommandError(Exception):
    """A problem the user can fix; printed as one line."""


def keep_freed_memory(threshold: int = 32 << 20) -> bool:
    """Let this process reuse freed blocks of up to ``threshold`` bytes instead of giving
    them back to the kernel; True where the C library took the setting (glibc), else False.

    A NumPy loop allocates the same large temporaries every step. glibc's defaults give
    such blocks back to the kernel when they are freed, so each step touches their pages
    anew: measured on the kit's training configuration (lab 07, 2 cores), 10,500 page
    faults per step, 83 ms a step against 59 ms with this setting. Call it once, early;
    freed memory up to 4 × ``threshold`` then stays in the process.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows): nothing to set
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(mallopt(M_TRIM_THRESHOLD, 4 * threshold))


def use_impl(impl: str) -> None:
    """Make the labs of ``--impl`` (labs, solutions or a path) importable by module name."""
    try:
        bind_tree(resolve_impl(impl))
    except ValueError as exc:
        raise CommandError(f"--impl={impl}: {exc}") from None


def lab_gpt2_tokenizer():
    """GPT-2's tokenizer as lab 10 of the tree ``use_impl`` bound builds it (the student's
    ``Tokenizer.from_gpt2_files`` by default) from the GPT-2 files the kit ships: text in
    and out with no network and no ``transformers``."""
    from gptkit.data import gpt2_files

    try:
        import tokenizer  # lab 10's module, from the tree use_impl put on sys.path
    except ImportError as exc:
        raise CommandError(f"no lab 10 tokenizer in this tree ({exc}): give token ids with --ids") from None
    return tokenizer.Tokenizer.from_gpt2_files(*gpt2_files())


def run_command(prog: str, run: Callable[[], int], *, also: tuple[type[Exception], ...] = (),
                after_progress: bool = False) -> int:
    """``run()``'s exit status; a ``CommandError`` is printed as ``prog: …`` (status 2), a
    stub's ``NotImplementedError`` ("Lab 0N …") names the lab to finish (status 1), and the
    errors in ``also`` are printed with their type (status 1). ``after_progress``: a
    progress bar may hold the last line of stderr, so the message starts on a new one.
    Freed memory is kept for reuse (``keep_freed_memory``) before ``run()`` starts."""
    keep_freed_memory()
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
