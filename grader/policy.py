"""What a lab module may do: plain NumPy. Checked statically before any of it runs.

Student code in these labs needs NumPy, ``math``, the kit's helpers and earlier labs'
modules, nothing else. A module that imports or reaches anything else (the OS, the file
system, the test machinery, PyTorch), rewrites NumPy, or defines objects that fake
comparisons is flagged and not run. The sandbox's runtime guards back this up.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

# Builtins that reach outside plain computation, or look things up by string.
DENIED_NAMES = {
    "eval", "exec", "compile", "open", "__import__", "globals", "locals", "vars",
    "getattr", "setattr", "delattr", "breakpoint", "input", "exit", "quit", "help",
    "__builtins__", "__loader__", "__spec__", "memoryview",
}
# NumPy entry points that read or write files, load code, or patch the test helpers.
DENIED_NUMPY_ATTRS = {
    "load", "save", "savez", "savez_compressed", "savetxt", "loadtxt", "genfromtxt",
    "fromfile", "tofile", "fromregex", "memmap", "DataSource", "ctypeslib", "f2py",
    "distutils", "testing", "lib", "dump", "dumps", "show_config", "show_runtime",
    "get_include", "ctypes",
}
ALLOWED_DUNDERS = {"__init__", "__call__", "__repr__", "__name__", "__doc__"}
DENIED_SUBMODULES = ("numpy.ctypeslib", "numpy.f2py", "numpy.distutils", "numpy.testing",
                     "numpy.lib", "gptkit.testing")


@dataclass(frozen=True)
class Violation:
    line: int
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


def _module_allowed(name: str, allowed: list[str]) -> bool:
    if any(name == d or name.startswith(d + ".") for d in DENIED_SUBMODULES):
        return False
    return any(name == a or name.startswith(a + ".") for a in allowed)


def check_source(source: str, allowed_modules: list[str], *, allowed_names=(), allowed_attrs=()) -> list[Violation]:
    """Policy violations in one module's source (empty list: fine to run).

    ``allowed_modules`` lists importable top-level names or dotted prefixes (e.g.
    "numpy", "scipy.special", and the earlier labs' module names); ``allowed_names`` and
    ``allowed_attrs`` lift single denials for a lab that needs them (lab 05 reads
    checkpoint files: ``open``, ``.memmap``). A syntax error is
    not reported here: the tests report it, with its line, when they import the file.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[Violation] = []
    module_aliases: set[str] = set()
    allowed_text = ", ".join(sorted({a.split(".")[0] if a != "scipy.special" else a for a in allowed_modules}))

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _module_allowed(alias.name, allowed_modules):
                    out.append(Violation(line, f"imports {alias.name} (allowed: {allowed_text})"))
                module_aliases.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                out.append(Violation(line, "uses a relative import"))
            elif not _module_allowed(mod, allowed_modules):
                out.append(Violation(line, f"imports from {mod} (allowed: {allowed_text})"))
            else:
                for alias in node.names:
                    full = f"{mod}.{alias.name}"
                    if alias.name == "*":
                        out.append(Violation(line, f"uses `from {mod} import *`"))
                    elif any(full == d or full.startswith(d + ".") for d in DENIED_SUBMODULES) or (
                        mod.split(".")[0] == "numpy" and alias.name in DENIED_NUMPY_ATTRS
                        and alias.name not in allowed_attrs
                    ):
                        out.append(Violation(line, f"imports {full}, which is not allowed in a lab"))
        elif isinstance(node, ast.Name) and node.id in DENIED_NAMES and node.id not in allowed_names:
            out.append(Violation(line, f"uses `{node.id}`, which labs may not use"))
        elif isinstance(node, ast.Attribute):
            attr = node.attr
            if attr in ALLOWED_DUNDERS or attr in allowed_attrs:
                pass
            elif attr.startswith("__") and attr.endswith("__"):
                out.append(Violation(line, f"touches the special attribute `{attr}`"))
            elif attr.startswith("_") and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                out.append(Violation(line, f"touches the private attribute `{attr}` of another object"))
            elif attr in DENIED_NUMPY_ATTRS:
                out.append(Violation(line, f"uses `.{attr}`, which reads/writes files or patches the tests"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = node.name
            if name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDERS:
                out.append(Violation(line, f"defines `{name}` (objects with custom comparison or "
                                           "conversion behaviour are not allowed)"))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            pass

    # Assignments into an imported module (monkeypatching numpy, the kit, the tests).
    def targets_of(node):
        if isinstance(node, (ast.Assign, ast.Delete)):
            return node.targets
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            return [node.target]
        return []

    def patched_module(target):
        if isinstance(target, (ast.Tuple, ast.List)):
            return next((m for m in map(patched_module, target.elts) if m), None)
        if isinstance(target, ast.Starred):
            return patched_module(target.value)
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return None
        root = target
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        return root.id if isinstance(root, ast.Name) and root.id in module_aliases else None

    for node in ast.walk(tree):
        for t in targets_of(node):
            mod = patched_module(t)
            if mod:
                out.append(Violation(node.lineno, f"modifies the module `{mod}` (monkeypatching)"))
    return sorted(set(out), key=lambda v: (v.line, v.what))
