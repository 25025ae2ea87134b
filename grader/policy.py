"""What a lab module may touch: plain NumPy. Checked statically before any of it runs.

The policy is an allow-list. Lab code may use

- the modules its rubric entry lists (numpy, math, typing, … and earlier labs' modules),
  and of each only the attributes listed in ``MODULE_ATTRS`` below (NumPy's numerical
  API, ``math``'s functions, a few typing and dataclasses names, the kit's helpers) or,
  for an earlier lab's module, the names the kit's own stub of that module defines;
- the builtins in ``ALLOWED_BUILTINS`` (``type`` only as ``type(x).__name__`` or in a
  comparison);
- any public attribute of an object that is not a module (``x.shape``, ``self.weight``),
  private ones only on ``self``/``cls``, and of the special ``__x__`` attributes only
  ``ALLOWED_DUNDER_ATTRS``;

and every name its own file binds. Anything else is reported with the line it is on.
Beyond that: no assignment into a module (monkeypatching), no module passed around as a
value (``f = np``, ``def g(m=np)``: every use of a module is a visible ``np.x`` chain), no
rebinding of an imported module's name, no special methods beyond
``ALLOWED_DUNDER_DEFS`` (objects that fake comparisons or conversions), no special names
bound by assignment (``__eq__ = …``), and no use of a module- or class-level name that
shadows a builtin lab code may not use (``open = open``: until it runs, it is the builtin).

How far names are tracked: scopes are followed as Python does (module, class, function,
lambda, comprehension; ``global``/``nonlocal``), so ``def f(input): …`` is fine and
``import numpy as np`` inside a function is checked like one at the top. Values are not
tracked: an object that is not a module is judged by its attributes' names alone, which
is why the few public attributes that lead to frames, code or raw memory
(``OBJECT_DENIED_ATTRS``) are refused on every object.

This check is the first line and gives readable feedback; it is not what keeps the
grader safe. Student code runs in its own sandboxed process, which holds up without it.

Rubric keys (grader/rubric.toml) widen the allow-list per lab: ``allowed_imports``
(modules), ``allowed_names`` (builtins, e.g. ``open``), ``allowed_attrs`` (a bare
attribute name, e.g. ``memmap``, allowed on any module or object, or a dotted
``module.name``, e.g. ``json.dump``, allowed on that module only).
"""

from __future__ import annotations

import ast
import builtins
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gptkit

KIT_ROOT = Path(__file__).resolve().parents[1]


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# NumPy's numerical API: array creation, shapes, indexing, elementwise maths, reductions,
# sorting and searching, linear algebra, dtypes and constants. Curated by hand, on
# purpose: no file I/O (load, save, fromfile, memmap, tofile …), no global state
# (seterr, set_printoptions, the legacy np.random.* functions), no internals (core,
# lib, ctypeslib, testing, f2py, char, rec …). Add a name here when honest lab code
# needs it.
NUMPY_API = _names("""
    abs absolute add all allclose amax amin angle any append arange arccos arccosh arcsin
    arcsinh arctan arctan2 arctanh argmax argmin argpartition argsort argwhere around array
    array_equal array_equiv array_split asanyarray asarray ascontiguousarray astype atleast_1d
    atleast_2d atleast_3d average bincount bitwise_and bitwise_count bitwise_not bitwise_or
    bitwise_xor block bool bool_ broadcast_arrays broadcast_shapes broadcast_to byte bytes_
    can_cast cbrt ceil character choose clip column_stack complex128 complex64
    complexfloating concat concatenate conj conjugate copy copysign copyto cos cosh
    count_nonzero cross cumprod cumsum cumulative_prod cumulative_sum deg2rad degrees diag
    diag_indices diagflat diagonal diff digitize divide divmod dot double dsplit dstack dtype
    e ediff1d einsum einsum_path empty empty_like equal errstate euler_gamma exp exp2
    expand_dims expm1 extract eye fabs fill_diagonal finfo fix flatnonzero flexible flip
    fliplr flipud float16 float32 float64 float_power floating floor floor_divide fmax fmin
    fmod frexp frombuffer fromiter full full_like gcd generic geomspace gradient greater
    greater_equal half heaviside histogram hsplit hstack hypot identity iinfo indices inexact
    inf inner insert int16 int32 int64 int8 int_ intc integer interp intersect1d intp invert
    isclose iscomplexobj isfinite isin isinf isnan isneginf isposinf isreal isrealobj
    isscalar issubdtype ix_ kron lcm ldexp left_shift less less_equal lexsort linspace log
    log10 log1p log2 logaddexp logaddexp2 logical_and logical_not logical_or logical_xor
    logspace longdouble longlong matmul matrix_transpose matvec max maximum mean median
    meshgrid min minimum mod modf moveaxis multiply nan nan_to_num nanargmax nanargmin
    nancumprod nancumsum nanmax nanmean nanmedian nanmin nanpercentile nanprod nanquantile
    nanstd nansum nanvar ndarray ndim negative newaxis nextafter nonzero not_equal number
    object_ ones ones_like outer pad partition percentile permute_dims pi piecewise positive
    pow power prod promote_types ptp put put_along_axis putmask quantile rad2deg radians
    ravel ravel_multi_index reciprocal remainder repeat reshape result_type right_shift rint
    roll rollaxis rot90 round searchsorted select setdiff1d shape short sign signbit
    signedinteger sin sinc single sinh size sort spacing split sqrt square squeeze stack std
    str_ subtract sum swapaxes take take_along_axis tan tanh tensordot tile trace transpose
    trapezoid tri tril tril_indices triu triu_indices true_divide trunc ubyte uint uint16
    uint32 uint64 uint8 uintc uintp ulonglong union1d unique unique_all unique_counts
    unique_inverse unique_values unravel_index unsignedinteger unwrap ushort var vdot vecdot
    vecmat vsplit vstack where zeros zeros_like
""")

# Module (dotted name) → the attributes lab code may use on it. A name that is itself a
# key here (``numpy`` → ``random``) is a submodule. Earlier labs' modules are not listed:
# their allow-list is what the kit's stub of the module defines (see ``lab_api``).
MODULE_ATTRS: dict[str, frozenset[str]] = {
    "numpy": NUMPY_API | {"random", "linalg"},
    # Randomness through a Generator only (``rng = np.random.default_rng(seed)``, or
    # gptkit's make_rng): the legacy np.random.* functions share one global state.
    "numpy.random": _names("default_rng Generator SeedSequence BitGenerator PCG64"),
    "numpy.linalg": _names("""
        norm vector_norm matrix_norm inv pinv solve det slogdet eig eigh eigvals eigvalsh svd
        svdvals qr cholesky lstsq matrix_rank matrix_power multi_dot LinAlgError cond outer
        cross diagonal trace matmul vecdot matrix_transpose tensordot
    """),
    "math": _names("""
        acos acosh asin asinh atan atan2 atanh cbrt ceil comb copysign cos cosh degrees dist e
        erf erfc exp exp2 expm1 fabs factorial floor fmod frexp fsum gamma gcd hypot inf
        isclose isfinite isinf isnan isqrt lcm ldexp lgamma log log10 log1p log2 modf nan
        nextafter perm pi pow prod radians remainder sin sinh sqrt tan tanh tau trunc ulp
    """),
    "__future__": _names("annotations"),
    # Names for annotations and small helpers; never the module's own imports (sys, …)
    # nor get_type_hints (it evaluates strings).
    "typing": _names("""
        Annotated Any Callable ClassVar Collection Container Dict Final FrozenSet Generator
        Generic Hashable Iterable Iterator List Literal Mapping MutableMapping MutableSequence
        MutableSet NamedTuple Never NoReturn Optional Protocol Reversible Self Sequence Set
        Sized SupportsFloat SupportsIndex SupportsInt Tuple Type TypeAlias TypeVar TypedDict
        TYPE_CHECKING Union cast final overload
    """),
    "collections": _names("abc"),
    "collections.abc": _names("""
        Callable Collection Container Generator Hashable Iterable Iterator Mapping
        MutableMapping MutableSequence MutableSet Reversible Sequence Set Sized
    """),
    "dataclasses": _names("dataclass field fields replace asdict astuple is_dataclass InitVar "
                          "KW_ONLY FrozenInstanceError"),
    # The kit's helpers: gptkit/__init__.py's __all__ is the one list of what students may
    # import (never gptkit.testing, gptkit.checkpoints nor gptkit.demo).
    "gptkit": frozenset(gptkit.__all__) | _names("checks init layer state gpt2"),
    "gptkit.checks": _names("as_float_array check_last_dim check_length check_ndim"),
    "gptkit.init": _names("make_rng normal"),
    "gptkit.layer": _names("Layer"),
    "gptkit.state": _names("state_diff StateDiff"),
    "gptkit.gpt2": _names("gpt2_parameter_names gpt2_parameter_shapes"),
    # Only where a lab's rubric entry allows the import.
    "scipy": _names("special"),
    "scipy.special": _names("""
        erf erfc erfinv erfcinv expit logit softmax log_softmax logsumexp gamma gammaln
        digamma ndtr ndtri log_ndtr xlogy xlog1py expm1 log1p entr rel_entr beta betaln
    """),
    "json": _names("loads load dumps JSONDecodeError"),
    "pathlib": _names("Path PurePath PurePosixPath"),
}

ALLOWED_BUILTINS = _names("""
    abs all any ascii bin bool bytearray bytes callable chr classmethod complex dict divmod
    enumerate filter float format frozenset hash hex id int isinstance issubclass iter len
    list map max min next object oct ord pow print property range repr reversed round set
    slice sorted staticmethod str sum super tuple zip
    NotImplemented Ellipsis __name__
    Exception ArithmeticError AssertionError AttributeError EOFError FileNotFoundError
    FloatingPointError IndexError KeyError LookupError NotImplementedError OSError
    OverflowError RuntimeError StopIteration TypeError UnicodeDecodeError UnicodeError
    ValueError ZeroDivisionError
    Warning UserWarning RuntimeWarning DeprecationWarning
""")
# Allowed only in the forms below; ``type(name, bases, namespace)`` builds classes from a
# dict (a way round the special-method rules), so ``type`` is not a free-standing value.
RESTRICTED_BUILTINS = _names("type")
TYPE_RESULT_ATTRS = _names("__name__ __qualname__")

ALLOWED_DUNDER_ATTRS = _names("__init__ __call__ __repr__ __str__ __name__ __qualname__ __doc__")
ALLOWED_DUNDER_DEFS = _names("__init__ __call__ __repr__ __str__ __post_init__")
ALLOWED_DUNDER_BINDINGS = _names("__all__")
# Public attributes that lead, on whatever object has them, to frames, code, raw memory or
# files. Objects' types are not tracked, so these are refused on every object.
OBJECT_DENIED_ATTRS = _names("""
    ctypes cffi tofile dump dumps
    gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await cr_origin ag_frame ag_code ag_await
    f_back f_globals f_locals f_builtins f_code f_trace tb_frame tb_next
    co_code co_consts co_names
""")

WHAT_LABS_MAY_USE = ("lab code may use NumPy's numerical API, math, the kit's gptkit helpers, earlier "
                     "labs' functions and classes and a few typing names; the list is in grader/policy.py")
# Why some often-tried names are off the list, said in the violation instead of the above.
HINTS = {
    **dict.fromkeys(("load", "save", "savez", "savez_compressed", "loadtxt", "savetxt", "genfromtxt",
                     "fromfile", "memmap", "fromregex", "DataSource"), "lab code does not read or write files"),
    **dict.fromkeys(("seed", "rand", "randn", "randint", "random", "normal", "uniform", "choice",
                     "permutation", "shuffle", "RandomState", "get_state", "set_state"),
                    "draw random numbers from a Generator: rng = np.random.default_rng(seed), or gptkit's make_rng"),
    **dict.fromkeys(("seterr", "set_printoptions", "printoptions", "setbufsize"),
                    "it changes NumPy's global settings for the whole test run; np.errstate is fine"),
}

_BUILTIN_NAMES = frozenset(dir(builtins))


@dataclass(frozen=True)
class Violation:
    line: int
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


@lru_cache(maxsize=None)
def lab_api(module: str, root: Path = KIT_ROOT) -> frozenset[str] | None:
    """The public names the kit's stub of an earlier lab's module defines, or None.

    Read from ``labs/NN_name/src/<module>.py`` (the copy students start from): its
    functions, classes and constants, not what it imports.
    """
    for stub in sorted(root.glob(f"labs/*/src/{module}.py")):
        tree = ast.parse(stub.read_text(encoding="utf-8"))
        names: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        return frozenset(n for n in names if not n.startswith("_"))
    return None


class _Scope:
    def __init__(self, kind: str, parent: _Scope | None):
        self.kind = kind  # "module", "class", "function" (lambdas too) or "comprehension"
        self.parent = parent
        self.bound: set[str] = set()
        self.declared_global: set[str] = set()
        self.declared_nonlocal: set[str] = set()
        self.modules: dict[str, str] = {}  # name → dotted module it is bound to by an import
        self.other_bindings: dict[str, int] = {}  # name → line, bound by anything but an import

    @property
    def module(self) -> _Scope:
        s = self
        while s.parent is not None:
            s = s.parent
        return s


class _Checker:
    def __init__(self, allowed_modules: Iterable[str], allowed_names: Iterable[str],
                 allowed_attrs: Iterable[str], lab_apis: Mapping[str, Iterable[str]] | None):
        self.allowed_modules = list(allowed_modules)
        self.allowed_names = set(allowed_names)
        attrs = set(allowed_attrs)
        self.allowed_attr_anywhere = {a for a in attrs if "." not in a}
        self.allowed_attr_dotted = {a for a in attrs if "." in a}
        self.tables: dict[str, frozenset[str]] = dict(MODULE_ATTRS)
        for mod in self.allowed_modules:
            if mod not in self.tables:
                api = lab_apis.get(mod) if lab_apis is not None else lab_api(mod)
                self.tables[mod] = frozenset(api or ())
        self.out: list[Violation] = []
        self.parent: dict[ast.AST, ast.AST] = {}
        self.loads: list[tuple[ast.Name, _Scope]] = []
        self.chains: list[tuple[ast.Attribute, _Scope]] = []
        self.store_targets: list[tuple[ast.AST, _Scope]] = []
        self.scopes: list[_Scope] = []

    def flag(self, node: ast.AST | int, what: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 0)
        self.out.append(Violation(line, what))

    # -- imports ------------------------------------------------------------------------
    def importable(self, name: str) -> bool:
        if name in self.allowed_modules:
            return True
        return name in MODULE_ATTRS and any(name.startswith(a + ".") for a in self.allowed_modules)

    def allowed_on_module(self, module: str, attr: str) -> bool:
        return (attr in self.tables.get(module, ()) or attr in self.allowed_attr_anywhere
                or f"{module}.{attr}" in self.allowed_attr_dotted)

    def is_module(self, dotted: str) -> bool:
        return dotted in self.tables

    def allowed_text(self) -> str:
        return ", ".join(sorted(set(self.allowed_modules)))

    # -- pass 1: scopes and what each name refers to ------------------------------------
    def bind(self, scope: _Scope, name: str, line: int, module: str | None = None, *, is_def: bool = False) -> None:
        if name in scope.declared_nonlocal:
            return
        target = scope.module if name in scope.declared_global else scope
        target.bound.add(name)
        if module is not None:
            if target.modules.get(name, module) != module:
                self.flag(line, f"binds `{name}` to two different modules")
            target.modules[name] = module
        else:
            target.other_bindings.setdefault(name, line)
        if name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDER_BINDINGS and not is_def:
            self.flag(line, f"binds the special name `{name}` (objects with custom comparison or "
                            "conversion behaviour, and changes to Python's machinery, are not allowed)")

    def walk(self, node: ast.AST, scope: _Scope) -> None:
        for child in ast.iter_child_nodes(node):
            self.parent[child] = node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if not isinstance(node, ast.Lambda):
                self.bind(scope, node.name, node.lineno, is_def=True)
                if (node.name.startswith("__") and node.name.endswith("__")
                        and node.name not in ALLOWED_DUNDER_DEFS):
                    self.flag(node, f"defines `{node.name}` (objects with custom comparison or "
                                    "conversion behaviour are not allowed)")
                for d in node.decorator_list:
                    self.walk(d, scope)
                if node.returns:
                    self.walk(node.returns, scope)
            a = node.args
            for d in [*a.defaults, *[d for d in a.kw_defaults if d is not None]]:
                self.walk(d, scope)
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
            for p in params:
                self.parent[p] = node
                if p.annotation is not None:
                    self.parent[p.annotation] = p
                    self.walk(p.annotation, scope)
            inner = _Scope("function", scope)
            self.scopes.append(inner)
            for p in params:
                self.bind(inner, p.arg, getattr(p, "lineno", node.lineno))
            for stmt in (node.body if isinstance(node.body, list) else [node.body]):
                self.walk(stmt, inner)
        elif isinstance(node, ast.ClassDef):
            self.bind(scope, node.name, node.lineno)
            for e in [*node.decorator_list, *node.bases, *node.keywords]:
                self.walk(e, scope)
            inner = _Scope("class", scope)
            self.scopes.append(inner)
            for stmt in node.body:
                self.walk(stmt, inner)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            gens = node.generators
            self.walk(gens[0].iter, scope)  # evaluated in the enclosing scope
            inner = _Scope("comprehension", scope)
            self.scopes.append(inner)
            for i, g in enumerate(gens):
                self.parent[g] = node
                for c in ast.iter_child_nodes(g):
                    self.parent[c] = g
                self.walk(g.target, inner)
                if i:
                    self.walk(g.iter, inner)
                for cond in g.ifs:
                    self.walk(cond, inner)
            for part in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]):
                self.walk(part, inner)
        elif isinstance(node, ast.NamedExpr):
            # ``(x := …)`` in a comprehension binds x in the scope around the comprehension.
            home = scope
            while home.kind == "comprehension":
                home = home.parent
            self.walk(node.value, scope)
            self.parent[node.target] = node
            self.bind(home, node.target.id, node.lineno)
            self.loads.append((node.target, scope))  # it is read there too, as the expression's value
        elif isinstance(node, ast.Global):
            scope.declared_global.update(node.names)
        elif isinstance(node, ast.Nonlocal):
            scope.declared_nonlocal.update(node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                self.check_import(node, alias, scope)
        elif isinstance(node, ast.ImportFrom):
            self.check_import_from(node, scope)
        else:
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    self.loads.append((node, scope))
                else:
                    self.bind(scope, node.id, node.lineno)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.bind(scope, node.name, node.lineno)
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                self.bind(scope, node.name, node.lineno)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                self.bind(scope, node.rest, node.lineno)
            if isinstance(node, ast.Attribute):
                outer = self.parent.get(node)
                if not (isinstance(outer, ast.Attribute) and outer.value is node):
                    self.chains.append((node, scope))
            if isinstance(node, (ast.Assign, ast.Delete)):
                self.store_targets += [(t, scope) for t in node.targets]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
                self.store_targets.append((node.target, scope))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                self.store_targets.append((node.optional_vars, scope))
            for child in ast.iter_child_nodes(node):
                self.walk(child, scope)

    def check_import(self, node: ast.Import, alias: ast.alias, scope: _Scope) -> None:
        name = alias.name
        if not self.importable(name):
            self.flag(node, f"imports {name}, which lab code may not import (allowed: {self.allowed_text()})")
        if alias.asname:
            if self.importable(name):
                self.bind(scope, alias.asname, node.lineno, module=name)
            else:
                self.bind(scope, alias.asname, node.lineno, module="<refused>")
        else:
            root = name.split(".")[0]
            ok = self.is_module(root) and any(m == root or m.startswith(root + ".") for m in self.allowed_modules)
            self.bind(scope, root, node.lineno, module=root if ok else "<refused>")

    def check_import_from(self, node: ast.ImportFrom, scope: _Scope) -> None:
        mod = node.module or ""
        if node.level:
            self.flag(node, "uses a relative import")
            return
        submodules_only = all(self.importable(f"{mod}.{a.name}") for a in node.names)
        if not self.importable(mod) and not submodules_only:
            self.flag(node, f"imports from {mod}, which lab code may not import (allowed: {self.allowed_text()})")
            for alias in node.names:
                if alias.name != "*":
                    self.bind(scope, alias.asname or alias.name, node.lineno, module="<refused>")
            return
        for alias in node.names:
            local = alias.asname or alias.name
            full = f"{mod}.{alias.name}"
            if alias.name == "*":
                self.flag(node, f"uses `from {mod} import *` (import the names you need)")
            elif self.is_module(full) and self.importable(full) and alias.name in self.tables[mod]:
                self.bind(scope, local, node.lineno, module=full)
            elif self.allowed_on_module(mod, alias.name) and not self.is_module(full):
                if mod == "__future__":
                    continue
                self.bind(scope, local, node.lineno)
            else:
                why = HINTS.get(alias.name) if mod.startswith("numpy") else None
                self.flag(node, f"imports `{alias.name}` from {mod}, which lab code may not use"
                                f"{self.suggest(mod, alias.name)} ({why or WHAT_LABS_MAY_USE})")
                self.bind(scope, local, node.lineno, module="<refused>" if self.is_module(full) else None)

    # -- pass 2: judging names and attribute chains --------------------------------------
    def resolve(self, name: str, scope: _Scope) -> _Scope | None:
        """The scope that binds ``name`` as seen from ``scope``; None: a builtin (or undefined)."""
        s, first = scope, True
        while s is not None:
            if name in s.declared_global:
                s = s.module
            if s.kind == "class" and not first:
                s = s.parent
                continue
            if name in s.bound:
                return s
            s, first = s.parent, False
        return None

    def module_of(self, node: ast.AST, scope: _Scope) -> str | None:
        if isinstance(node, ast.Name):
            s = self.resolve(node.id, scope)
            if s is not None:
                return s.modules.get(node.id)
        return None

    def suggest(self, module: str, attr: str) -> str:
        close = difflib.get_close_matches(attr, sorted(self.tables.get(module, ())), n=1, cutoff=0.8)
        return f" (did you mean `{close[0]}`?)" if close else ""

    def shadows_denied_builtin(self, name: str) -> bool:
        return name in _BUILTIN_NAMES and name not in ALLOWED_BUILTINS and name not in self.allowed_names

    def check_names(self) -> None:
        for node, scope in self.loads:
            where = self.resolve(node.id, scope)
            up = self.parent.get(node)
            if where is not None and where.kind in ("module", "class") and self.shadows_denied_builtin(node.id):
                # ``open = open``: until the file's own binding runs, the name is the builtin.
                self.flag(node, f"uses `{node.id}`, which this file binds "
                                f"{'at module level' if where.kind == 'module' else 'in a class body'}: "
                                "that is the name of a Python builtin lab code may not use; "
                                "please pick another name")
                continue
            if where is not None:
                module = where.modules.get(node.id)
                if module and not (isinstance(up, ast.Attribute) and up.value is node) and module != "<refused>":
                    self.flag(node, f"uses the module `{node.id}` as a value (use its functions as "
                                    f"`{node.id}.name(...)`; modules may not be passed around or aliased)")
                continue
            name = node.id
            if name in ALLOWED_BUILTINS or name in self.allowed_names:
                continue
            if name in RESTRICTED_BUILTINS:
                call = up if isinstance(up, ast.Call) and up.func is node else None
                use = self.parent.get(call) if call else None
                if call and len(call.args) == 1 and not call.keywords and (
                        (isinstance(use, ast.Attribute) and use.attr in TYPE_RESULT_ATTRS)
                        or isinstance(use, ast.Compare)):
                    continue
                self.flag(node, "uses `type` other than as `type(x).__name__` or in a comparison "
                                "(use isinstance to test a type)")
            elif name in _BUILTIN_NAMES or (name.startswith("__") and name.endswith("__")):
                self.flag(node, f"uses `{name}`, which lab code may not use (allowed builtins: "
                                "the usual ones such as len, range, zip, isinstance, print)")

    def check_chains(self) -> None:
        for outer, scope in self.chains:
            attrs: list[ast.Attribute] = []
            node: ast.AST = outer
            while isinstance(node, ast.Attribute):
                attrs.append(node)
                node = node.value
            attrs.reverse()
            module = self.module_of(node, scope)
            if module == "<refused>":
                continue  # its import is already reported
            start = 0
            if module is not None:
                shown = node.id
                for i, a in enumerate(attrs):
                    shown += "." + a.attr
                    sub = f"{module}.{a.attr}"
                    if self.is_module(sub) and a.attr in self.tables[module]:
                        module = sub
                        continue
                    if self.allowed_on_module(module, a.attr):
                        module, start = None, i + 1
                        break
                    why = HINTS.get(a.attr) if module.startswith("numpy") else None
                    self.flag(a, f"uses `{shown}`, which lab code may not touch"
                                 f"{self.suggest(module, a.attr)} ({why or WHAT_LABS_MAY_USE})")
                    module, start = None, len(attrs)
                    break
                if module is not None:
                    self.flag(outer, f"uses the module `{shown}` as a value (use its functions as "
                                     f"`{shown}.name(...)`)")
                    continue
            for a in attrs[start:]:
                self.check_object_attr(a, scope)

    def check_object_attr(self, a: ast.Attribute, scope: _Scope) -> None:
        attr = a.attr
        if attr in self.allowed_attr_anywhere:
            return
        if attr.startswith("__") and attr.endswith("__"):
            if attr not in ALLOWED_DUNDER_ATTRS:
                self.flag(a, f"touches the special attribute `{attr}`")
        elif attr.startswith("_"):
            owner = a.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")
                    and self.resolve(owner.id, scope) is not None):
                self.flag(a, f"touches the private attribute `{attr}` of another object")
        elif attr in OBJECT_DENIED_ATTRS:
            self.flag(a, f"uses `.{attr}`, which reaches files, raw memory or the interpreter's internals")

    def check_stores(self) -> None:
        """Assignments into an imported module (monkeypatching numpy, the kit, the tests)."""
        def roots(t):
            if isinstance(t, (ast.Tuple, ast.List)):
                for e in t.elts:
                    yield from roots(e)
            elif isinstance(t, ast.Starred):
                yield from roots(t.value)
            elif isinstance(t, (ast.Attribute, ast.Subscript)):
                r = t
                while isinstance(r, (ast.Attribute, ast.Subscript)):
                    r = r.value
                yield r

        for target, scope in self.store_targets:
            for r in roots(target):
                if self.module_of(r, scope):
                    self.flag(target, f"modifies the module `{r.id}` (monkeypatching)")

    def check_rebinding(self) -> None:
        for s in self.scopes:
            for name in s.modules.keys() & s.other_bindings.keys():
                self.flag(s.other_bindings[name], f"rebinds `{name}`, the name of an imported module")


def check_source(source: str, allowed_modules: list[str], *, allowed_names=(), allowed_attrs=(),
                 lab_apis: Mapping[str, Iterable[str]] | None = None) -> list[Violation]:
    """Policy violations in one module's source (empty list: fine to run).

    ``allowed_modules`` lists the importable modules (e.g. "numpy", "scipy.special", and
    the earlier labs' module names; a listed module's submodules in ``MODULE_ATTRS`` come
    with it). ``allowed_names`` adds builtins (lab 05: ``open``); ``allowed_attrs`` adds
    attributes, bare (``memmap``: on any module or object) or dotted (``json.dump``).
    ``lab_apis`` maps an earlier lab's module to its public names; by default they are
    read from the kit's stubs. A syntax error is not reported here: the tests report it,
    with its line, when they import the file.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    checker = _Checker(allowed_modules, allowed_names, allowed_attrs, lab_apis)
    top = _Scope("module", None)
    checker.scopes.append(top)
    checker.walk(tree, top)
    checker.check_names()
    checker.check_chains()
    checker.check_stores()
    checker.check_rebinding()
    return sorted(set(checker.out), key=lambda v: (v.line, v.what))
