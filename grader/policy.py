"""A static review of lab files: the lines that suggest an attempt on the grader.

Advisory only. What it finds never stops a file from running and never changes a score:
scores come from the tests alone, and what keeps a grade safe is the sandbox
(``grader/sandbox``: a process for the tests and another for the lab code, bubblewrap,
seccomp, Landlock, limits). A finding becomes a note "for review", with its line, in the
instructor's gradebook and class report; the student's feedback shows it as a neutral
note, and ``grader check`` shows it to the student before they submit.

It is silent on ordinary Python: every builtin a program uses to do its work
(``getattr``, ``hasattr``, ``setattr``, ``vars``, ``open`` …) and the standard library's
modules that compute, not reach into the interpreter (``collections``, ``itertools``,
``functools``, ``copy``, ``re``, ``dataclasses``, ``enum``, ``heapq``, ``os.path``,
``json``, ``struct`` …). It notes:

- imports of modules that reach into the interpreter or the machine (``gc``,
  ``inspect``, ``ctypes``, ``importlib``, ``subprocess``, ``socket``, ``signal`` …), of
  the kit's test machinery (``pytest``, ``hypothesis``, ``grader``, ``gptkit.testing``),
  and of any module outside the standard library that the lab does not use (``torch``:
  the labs are NumPy; the rubric's ``allowed_imports`` lists a lab's own, e.g. SciPy);
- the attributes of ``os``, ``sys``, ``numpy`` and ``types`` that start processes, send
  signals, touch descriptors, frames, code objects or the import machinery;
- ``eval``, ``exec``, ``compile``, ``__import__``, ``globals`` and ``breakpoint``, unless
  the file defines a name of its own so called;
- attributes that lead from any object to frames, code, globals or raw memory
  (``f_back``, ``__globals__``, ``__subclasses__``, ``.ctypes`` …), also written as a
  string (``getattr(x, "__globals__")``);
- strings naming the kit's files or other processes (``solutions/``, ``tests/``,
  fixtures, compiled ``.pyc`` files, ``/proc``, the gradebook …);
- special methods that fake comparisons or hook NumPy's array protocol (``__eq__``,
  ``__array_ufunc__`` …), where a test compares what lab code returns;
- assignments into an imported module (monkeypatching), with ``=``, ``del`` or
  ``setattr``.

Names are followed through imports and aliases (``import gc as g``, ``from os import
kill``), file-wide: a review, not a proof. A syntax error is not reported here: the
tests report it, with its line, when they import the file.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Module (dotted; its submodules come with it) → why its import is worth a look.
REVIEW_MODULES: dict[str, str] = {
    **dict.fromkeys(("gc", "inspect", "ctypes", "_ctypes", "cffi", "importlib", "imp", "pkgutil", "zipimport",
                     "runpy", "marshal", "dill", "cloudpickle", "code", "codeop", "dis",
                     "builtins", "__main__", "sysconfig", "site", "atexit", "faulthandler", "tracemalloc",
                     "trace", "pdb", "bdb", "_thread", "_posixsubprocess"),
                    "it reaches into the interpreter: its objects, frames, code or import machinery"),
    **dict.fromkeys(("subprocess", "socket", "signal", "multiprocessing", "pty", "fcntl", "resource", "mmap",
                     "select", "selectors", "asyncio", "posix", "pwd", "grp", "termios", "ssl",
                     "http", "urllib", "ftplib", "smtplib", "webbrowser"),
                    "it reaches the machine: processes, signals, descriptors, files or the network"),
    **dict.fromkeys(("pytest", "_pytest", "hypothesis", "grader", "gptkit.testing", "conftest"),
                    "it is the kit's test machinery, not a lab's toolkit"),
    **dict.fromkeys(("gptkit.checkpoints", "gptkit.llama_checkpoints", "gptkit.demo", "gptkit.train",
                     "gptkit.parallel", "gptkit.command"),
                    "it is the kit's own code around the labs, not one of the helpers students use"),
    **dict.fromkeys(("torch", "tensorflow", "jax", "jaxlib", "transformers", "safetensors", "tiktoken",
                     "tokenizers", "sklearn", "numba", "cupy"),
                    "the labs are built in NumPy: this library computes what the lab asks you to write"),
}

# Qualified attribute (its sub-attributes come with it) → why a use is worth a look.
REVIEW_ATTRS: dict[str, str] = {
    **{f"os.{a}": "it starts or signals processes, or works on raw file descriptors" for a in """
        system popen fork forkpty kill killpg _exit abort execl execle execlp execlpe execv execve execvp
        execvpe spawnl spawnle spawnlp spawnlpe spawnv spawnve spawnvp spawnvpe posix_spawn posix_spawnp
        dup dup2 fdopen open read write pread pwrite pipe pipe2 closerange chroot setuid setgid seteuid
        setegid setreuid setregid setsid setpgid getppid pidfd_open memfd_create unshare setns
        register_at_fork sched_setaffinity plock wait waitpid wait3 wait4 waitid
    """.split()},
    **{f"sys.{a}": "it reaches the interpreter's frames, modules, hooks or exit" for a in """
        _getframe _current_frames _current_exceptions modules meta_path path_hooks path_importer_cache
        settrace setprofile gettrace getprofile addaudithook audit exit excepthook displayhook
        breakpointhook unraisablehook __stdout__ __stderr__ __stdin__ _xoptions setswitchinterval remote_exec
    """.split()},
    **{f"numpy.{a}": "it reaches raw memory, the test helpers or NumPy's internals" for a in """
        ctypeslib testing _core core f2py distutils
    """.split()},
    **{f"types.{a}": "it builds or reads code objects, frames or functions" for a in """
        CodeType FunctionType FrameType TracebackType CellType
    """.split()},
}

REVIEW_BUILTINS: dict[str, str] = {
    **dict.fromkeys(("eval", "exec", "compile", "__import__"), "it runs or imports code built at run time"),
    "globals": "it hands out the module's namespace",
    "breakpoint": "it starts a debugger",
    "__builtins__": "it reaches the builtins' namespace",
}

# Attributes that lead from any object (types are not tracked) to frames, code, globals,
# the class hierarchy or raw memory. Also noted when written as a string constant.
OBJECT_REVIEW_ATTRS = _names("""
    f_back f_globals f_locals f_builtins f_code f_trace tb_frame tb_next gi_frame gi_code cr_frame cr_code
    ag_frame ag_code co_code co_consts co_names __globals__ __code__ __closure__ __subclasses__ __bases__
    __base__ __mro__ __builtins__ __loader__ __spec__ __reduce__ __reduce_ex__ __traceback__
    __array_interface__ __array_struct__ ctypes
""")

# Special methods that change what a comparison, a truth test or NumPy sees.
REVIEW_SPECIAL_METHODS = _names("""
    __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __bool__ __array__ __array_ufunc__ __array_function__
    __array_wrap__ __array_finalize__ __array_priority__ __array_namespace__ __getattr__ __getattribute__
    __instancecheck__ __subclasscheck__ __del__
""")

# Strings that name the kit's files, other processes or the grader's outputs.
KIT_PATHS = re.compile(r"""[/\\](solutions|tests|hidden|fixtures|sandbox|impl|kit)\b|\b(solutions|tests|hidden|fixtures)[/\\]
                         |\.pyc\b|\.\./|^/(proc|etc|sys|dev|root|home)\b|gradebook|results?\.json|conftest
                         |\.hypothesis""", re.X)

# Modules lab code uses without a note besides the standard library: NumPy, the kit's
# student helpers (gptkit's public names and these submodules) and earlier labs' modules.
BASE_MODULES = ("numpy", "gptkit")
_STDLIB = frozenset(sys.stdlib_module_names)


@dataclass(frozen=True)
class Finding:
    line: int
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


def _covered(name: str, table: Iterable[str]) -> str | None:
    """The entry of ``table`` that ``name`` is, or lies under (``os.path`` under ``os``)."""
    for key in table:
        if name == key or name.startswith(key + "."):
            return key
    return None


class _Review(ast.NodeVisitor):
    def __init__(self, modules: Iterable[str]):
        self.modules = list(BASE_MODULES) + list(modules)
        self.out: set[Finding] = set()
        self.aliases: dict[str, str] = {}  # local name → the qualified name it was imported as
        self.bound: set[str] = set()  # every name the file binds other than by import

    def note(self, node: ast.AST, what: str) -> None:
        self.out.add(Finding(getattr(node, "lineno", 0), what))

    # -- names and imports ----------------------------------------------------------------
    def collect(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name != "*":
                        self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                self.bound.add(node.id)
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)

    def check_module(self, node: ast.AST, name: str) -> None:
        key = _covered(name, REVIEW_MODULES)
        if key:
            self.note(node, f"imports `{name}`: {REVIEW_MODULES[key]}")
        elif name.split(".")[0] not in _STDLIB and not _covered(name, self.modules) and not any(
                m.startswith(name + ".") for m in self.modules):
            self.note(node, f"imports `{name}`, which is neither the standard library nor a module this lab "
                            "uses (NumPy, the kit's helpers, earlier labs)")

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.check_module(node, a.name)
            self.check_qualified(node, a.name)  # import numpy.testing

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return  # nothing is importable relative to a lab file
        self.check_module(node, node.module)
        for a in node.names:
            full = f"{node.module}.{a.name}"
            if _covered(full, REVIEW_MODULES) and not _covered(node.module, REVIEW_MODULES):
                self.check_module(node, full)
            else:
                self.check_qualified(node, full)

    def qualified(self, node: ast.AST) -> str | None:
        """``np.ctypeslib.as_array`` → ``numpy.ctypeslib.as_array`` when ``np`` is an import."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases and node.id not in self.bound:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    def check_qualified(self, node: ast.AST, name: str) -> None:
        key = _covered(name, REVIEW_ATTRS)
        if key:
            self.note(node, f"uses `{key}`: {REVIEW_ATTRS[key]}")

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in REVIEW_BUILTINS and node.id not in self.bound \
                and node.id not in self.aliases:
            self.note(node, f"uses `{node.id}`: {REVIEW_BUILTINS[node.id]}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.qualified(node)
        if name is not None:
            self.check_qualified(node, name)
        if node.attr in OBJECT_REVIEW_ATTRS:
            self.note(node, f"uses `.{node.attr}`, which leads to frames, code, globals or raw memory")
        self.generic_visit(node)

    # -- strings, special methods, stores -------------------------------------------------
    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            s = node.value
            if s in OBJECT_REVIEW_ATTRS or s in REVIEW_SPECIAL_METHODS - {"__eq__", "__ne__"}:
                self.note(node, f"names the attribute `{s}` in a string")
            elif len(s) < 300 and KIT_PATHS.search(s):
                self.note(node, f"names a path of the kit, the grader or another process: {s[:60]!r}")

    def _special(self, node: ast.AST, name: str) -> None:
        if name in REVIEW_SPECIAL_METHODS:
            self.note(node, f"defines `{name}`, which changes what a comparison or NumPy sees of an object")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._special(node, node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _stores(self, targets: Iterable[ast.AST]) -> None:
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    self._special(sub, sub.id)
                if isinstance(sub, (ast.Attribute, ast.Subscript)) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    root = sub
                    while isinstance(root, (ast.Attribute, ast.Subscript)):
                        root = root.value
                    if isinstance(root, ast.Name) and self.qualified(root) is not None:
                        self.note(sub, f"modifies the imported module `{root.id}` (monkeypatching)")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._stores(node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node) -> None:
        self._stores([node.target])
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_Delete(self, node: ast.Delete) -> None:
        self._stores(node.targets)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and f.id not in self.bound and node.args:
            if self.qualified(node.args[0]) is not None:
                self.note(node, f"modifies an imported module with `{f.id}` (monkeypatching)")
        self.generic_visit(node)


DEEP_RECURSION = 30_000  # Python frames the review may take for deeply nested (generated) code


def review_source(source: str, modules: Iterable[str] = ()) -> list[Finding]:
    """What in one lab module's source is worth an instructor's look (empty: nothing).

    ``modules`` are the modules beyond the standard library, NumPy and the kit's helpers
    that the lab uses without a note: earlier labs' modules and the rubric's
    ``allowed_imports`` (e.g. ``scipy.special``).

    The review is advisory and never fails: code nested deeper than the interpreter's
    recursion limit (a generated expression of thousands of terms) is reviewed again with
    more room, and whatever still goes wrong becomes a finding of its own (line 0).
    """
    try:
        try:
            return _review(source, modules)
        except RecursionError:
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(limit, DEEP_RECURSION))
            try:
                return _review(source, modules)
            finally:
                sys.setrecursionlimit(limit)
    except Exception as exc:  # noqa: BLE001 - advisory: a note, never a lost point
        return [Finding(0, f"the static review could not read this file ({type(exc).__name__}); "
                           "its tests alone grade it")]


def _review(source: str, modules: Iterable[str]) -> list[Finding]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    review = _Review(modules)
    review.collect(tree)
    review.visit(tree)
    return sorted(review.out, key=lambda f: (f.line, f.what))
