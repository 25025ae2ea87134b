"""``grader tolerances``: a certificate that every tolerance the tests use is defensible.

Each comparison a lab test makes through ``assert_close`` is recorded (the hook in
``gptkit.testing.tolerance_log``) as its worst error measured against its bound,

    ratio = max |actual − expected| / (atol + rtol·|expected|)     (the test passes at ≤ 1)

on a panel of *correct* implementations and on every catalogued *bug*. A comparison is
certified when

- every correct implementation stays within a tenth of its bound (ratio ≤ 0.1: the
  tolerance is at least 10× the worst honest rounding error), and
- every catalogued bug that fails it by tolerance fails it by at least 10× (ratio ≥ 10:
  the tolerance is at most a tenth of the smallest bug's error); bugs caught by other
  means (a shape, a NaN, another comparison) do not count against it.

The panel of correct implementations (``--variants``):

- ``reference``: the solutions;
- ``float64``: the solutions computed in float64 (:func:`promote_module`: every public
  function and method of a lab module takes float32 arrays, and the float32 arrays held
  by the layers it is given, as float64 copies, and gives float32 back);
- ``functional``, ``objects``: the honest corpus (tests/grader/honest), written
  independently in two styles;
- each entry of ``solutions/tolerances.toml``: an alternative formulation written as
  a small edit of the reference (one-pass variance, einsum for @, …);
- ``kernel-<name>``: the reference under each OpenBLAS kernel this machine runs
  (``OPENBLAS_CORETYPE``; the kernel that really runs is read back with threadpoolctl);
- ``threads-<n>``: the reference with ``OPENBLAS_NUM_THREADS=n``.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gptkit.testing.layout import KIT_ROOT, lab_dirs, lab_of, lab_test_paths, selected
from gptkit.testing.tolerance_log import ENV
from grader import catalogue
from grader.pytest_run import run_pytest

CORRECT_MARGIN = 0.1  # a correct implementation uses at most this share of the bound
BUG_MARGIN = 10.0  # a bug that fails a comparison by tolerance exceeds the bound this many times
REPORT_JSON = KIT_ROOT / "docs" / "tolerances.json"
REPORT_MD = KIT_ROOT / "docs" / "tolerances.md"
SETTINGS_TOML = KIT_ROOT / "solutions" / "tolerances.toml"  # beside the solutions: it quotes them
HONEST = KIT_ROOT / "tests" / "grader" / "honest"
KERNELS = ("Haswell", "SkylakeX", "Zen", "Sandybridge", "Nehalem", "Prescott")
THREADS = (1, 2, 7, 16)
RUN_SECONDS = 1800


# -- the float64 variant ------------------------------------------------------------------

_state = threading.local()
_LAB_MODULES: set[str] = set()
_KEEP = {"state_dict", "load_state_dict", "parameters", "named_parameters", "named_layers", "train", "eval",
         "num_parameters"}


def _is_lab_object(value) -> bool:
    return type(value).__module__ in _LAB_MODULES or type(value).__module__ == "gptkit.layer"


class _Promotion:
    """The float32 arrays swapped for float64 copies during one outermost call."""

    def __init__(self):
        self.swaps: list[tuple[object, object, np.ndarray, np.ndarray]] = []  # (holder, key, original, copy)
        self.objects: list[object] = []
        self.seen: set[int] = set()
        self.copies: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # (original, copy): one per array, however many hold it
        self.promoted = False

    def value(self, v):
        if isinstance(v, np.ndarray) and v.dtype == np.float32:
            self.promoted = True
            if id(v) not in self.copies:
                self.copies[id(v)] = (v, v.astype(np.float64))
            return self.copies[id(v)][1]
        if _is_lab_object(v):
            self.holder(v)
        elif isinstance(v, (list, dict)):
            self.container(v)
        return v

    def container(self, c) -> None:
        if id(c) in self.seen:
            return
        self.seen.add(id(c))
        for key in range(len(c)) if isinstance(c, list) else list(c):
            old = c[key]
            new = self.value(old)
            if new is not old:
                c[key] = new
                self.swaps.append((c, key, old, new))

    def holder(self, obj) -> None:
        if id(obj) in self.seen or not hasattr(obj, "__dict__"):
            return
        self.seen.add(id(obj))
        self.objects.append(obj)
        for name, old in list(vars(obj).items()):
            new = self.value(old)
            if new is not old:
                setattr(obj, name, new)
                self.swaps.append((obj, name, old, new))

    def restore(self) -> None:
        for holder, key, old, new in reversed(self.swaps):
            now = holder[key] if isinstance(holder, (list, dict)) else getattr(holder, key)
            now = old if now is new else _demote(now)  # the original back, or what the call put there
            if isinstance(holder, (list, dict)):
                holder[key] = now
            else:
                setattr(holder, key, now)
        for original, copy in self.copies.values():  # what the call wrote into a copy (an attribute, an out=)
            back = copy.astype(np.float32)
            if original.flags.writeable and not np.array_equal(back, original, equal_nan=True):
                original[...] = back
        for obj in self.objects if self.promoted else ():  # float64 arrays left in new attributes (caches, grads)
            for name, v in list(vars(obj).items()):
                if isinstance(v, np.ndarray) and v.dtype == np.float64:
                    setattr(obj, name, v.astype(np.float32))


def _demote(v):
    if isinstance(v, np.ndarray) and v.dtype == np.float64:
        return v.astype(np.float32)
    if isinstance(v, np.float64):
        return np.float32(v)
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return tuple(_demote(x) for x in v)
    if isinstance(v, list):
        return [_demote(x) for x in v]
    if isinstance(v, dict):
        return {k: _demote(x) for k, x in v.items()}
    if isinstance(v, Iterator) and not isinstance(v, (str, bytes)):
        return (_demote(x) for x in v)
    return v


def _in_float64(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if getattr(_state, "active", False):  # already inside a promoted call
            return fn(*args, **kwargs)
        _state.active = True
        p = _Promotion()
        try:
            args = [p.value(a) for a in args]
            kwargs = {k: p.value(v) for k, v in kwargs.items()}
            out = fn(*args, **kwargs)
            return _demote(out) if p.promoted else out
        finally:
            p.restore()
            _state.active = False
    return call


def promote_module(name: str) -> None:
    """Make lab module ``name`` compute in float64: every public function, and every
    public method (and ``forward``/``__call__``) of its classes, takes float32 arrays (as
    arguments, or held by the layers it is given) as float64 copies and gives float32
    results back; arrays it wrote into are written back in float32. Only the outermost
    call converts, so the whole computation below it runs in float64 (a constant a
    solution writes as ``np.float32`` stays float32). The names under ``[float64] keep``
    in solutions/tolerances.toml are left alone (they write files, or return views of what
    a layer keeps)."""
    module = sys.modules[name]
    _LAB_MODULES.add(name)
    keep = set(_settings().get("float64", {}).get("keep", []))
    for attr, obj in list(vars(module).items()):
        if getattr(obj, "__module__", None) != name or attr.startswith("_") or attr in keep:
            continue
        if isinstance(obj, type):
            for meth, f in list(vars(obj).items()):
                if callable(f) and not isinstance(f, type) and meth not in _KEEP and f"{attr}.{meth}" not in keep and (
                        not meth.startswith("_") or meth == "__call__"):
                    setattr(obj, meth, _in_float64(f))
        elif callable(obj):
            setattr(module, attr, _in_float64(obj))


FOOTER = "\n\nimport grader.tolerances as _tolerances  # grader tolerances: the float64 variant\n" \
         "_tolerances.promote_module(__name__)\n"


def float64_tree(dest: Path, source: Path = KIT_ROOT / "solutions") -> Path:
    tree = dest / "float64"
    shutil.copytree(source, tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for lab in lab_dirs(tree):
        for module in lab.modules():
            path = lab.code_dir / f"{module}.py"
            path.write_text(path.read_text(encoding="utf-8") + FOOTER, encoding="utf-8")
    return tree


# -- the panel -----------------------------------------------------------------------------


@dataclass
class Variant:
    id: str
    what: str
    tree: Callable[[Path], Path]  # builds (or names) the implementation tree in a scratch folder
    env: dict = field(default_factory=dict)
    labs: list[str] | None = None  # the labs it is measured on (None: every lab asked for)

    def labs_within(self, labs: list[str] | None) -> list[str] | None:
        if self.labs is None:
            return labs
        return [lab for lab in self.labs if selected(lab, labs)]


def _edit_tree(edits: tuple[catalogue.Edit, ...], name: str) -> Callable[[Path], Path]:
    def build(dest: Path) -> Path:
        tree = dest / name
        shutil.copytree(KIT_ROOT / "solutions", tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        catalogue.apply_bug(catalogue.Bug("", name, "", edits, ()), tree)
        return tree
    return build


@functools.cache
def _settings(path: Path = SETTINGS_TOML) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def formulation_variants(path: Path = SETTINGS_TOML) -> list[Variant]:
    out = []
    for entry in _settings(path).get("variant", []):
        raw = entry.get("edits") or [{"find": entry["find"], "replace": entry["replace"]}]
        edits = tuple(catalogue.Edit(e.get("file", entry.get("file", "")), e["find"], e["replace"]) for e in raw)
        labs = entry.get("labs") or sorted({e.file.split("/")[0] for e in edits})
        out.append(Variant(entry["id"], entry["what"], _edit_tree(edits, entry["id"]), labs=labs))
    return out


def uncertified(path: Path = SETTINGS_TOML) -> dict[str, str]:
    """The comparisons accepted without a certificate: key → why its margin cannot be met."""
    return {e["key"]: e["why"] for e in _settings(path).get("uncertified", [])}


def blas_kernel(env: dict | None = None) -> str | None:
    """The OpenBLAS kernel NumPy runs under ``env`` (None when it crashes: not this CPU's)."""
    code = ("import numpy as np, threadpoolctl; a = np.ones((64, 64)); a @ a; "
            "print([i.get('architecture') for i in threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas'][0])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **(env or {})})
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def kernel_variants(names=KERNELS) -> list[Variant]:
    """One variant per distinct kernel that runs here (a name this CPU cannot run, or one
    that falls back to a kernel already listed, is left out)."""
    seen = {blas_kernel()}
    out = []
    for name in names:
        env = {"OPENBLAS_CORETYPE": name}
        got = blas_kernel(env)
        if got and got not in seen:
            seen.add(got)
            out.append(Variant(f"kernel-{got}", f"the reference on OpenBLAS's {got} kernel", lambda d: KIT_ROOT / "solutions", env))
    return out


def panel(variants: list[str] | None = None, kernels=KERNELS, threads=THREADS) -> list[Variant]:
    solutions = lambda d: KIT_ROOT / "solutions"  # noqa: E731
    out = [Variant("reference", "the solutions", solutions),
           Variant("float64", "the solutions computed in float64, results cast to float32", float64_tree)]
    for style in ("functional", "objects"):
        if (HONEST / style / "labs").is_dir():  # measured on the labs the corpus holds
            out.append(Variant(style, f"the honest corpus, {style} style", lambda d, s=style: HONEST / s / "labs",
                               labs=[lab.name for lab in lab_dirs(HONEST / style / "labs")]))
    out += formulation_variants()
    if kernels:
        out += kernel_variants(kernels)
    out += [Variant(f"threads-{n}", f"the reference with OPENBLAS_NUM_THREADS={n}", solutions,
                    {"OPENBLAS_NUM_THREADS": str(n)}) for n in threads or ()]
    if variants:
        known = {v.id for v in out}
        unknown = [v for v in variants if v not in known and not any(k.startswith(v) for k in known)]
        if unknown:
            raise ValueError(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        out = [v for v in out if v.id in variants or any(v.id.startswith(p) for p in variants)]
    return out


# -- running and reading the records ---------------------------------------------------------


def comparison_key(test: str, what: str) -> str:
    """One comparison: the test and what it compares (numbers in ``what`` read as ``#``,
    so that a comparison made once per example or per layer is one comparison)."""
    return f"{test} :: {re.sub(r'[0-9]+', '#', what)}"


@dataclass
class Measured:
    """One run's records: the worst error per comparison, and the tests that failed."""
    worst: dict[str, dict] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    output: str = ""
    labs: list[str] | None = None  # the labs measured (None: all)


def read_log(path: Path) -> dict[str, dict]:
    worst: dict[str, dict] = {}
    if not path.is_file():
        return worst
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "ratio" not in row:
            continue
        key = comparison_key(row["test"], row["what"])
        w = worst.setdefault(key, {"test": row["test"], "what": row["what"], "atol": row["atol"], "rtol": row["rtol"],
                                   "ratio": 0.0, "max_abs": 0.0, "max_rel": 0.0, "calls": 0})
        w["calls"] += 1
        if (row["atol"], row["rtol"]) != (w["atol"], w["rtol"]):  # several bounds: keep the tightest
            w["atol"], w["rtol"] = min(w["atol"], row["atol"]), min(w["rtol"], row["rtol"])
        for k in ("ratio", "max_abs", "max_rel"):
            w[k] = max(w[k], row[k])
    return worst


def measure(tree: Path, labs: list[str] | None, live: bool, env: dict | None = None) -> Measured:
    """Run the labs' tests on ``tree`` with the recorder on."""
    with tempfile.TemporaryDirectory(prefix="kit-tol-") as tmp:
        log = Path(tmp) / "log.jsonl"
        marker = None if live else "not torch"
        start = time.monotonic()
        _, results, output = run_pytest(tree, marker, args=lab_test_paths(labs), timeout=RUN_SECONDS,
                                        env={**(env or {}), ENV: str(log)})
        m = Measured(read_log(log), seconds=time.monotonic() - start, output=output[-3000:], labs=labs)
    m.failed = [r.nodeid for r in results if r.outcome in ("failed", "error")]
    return m


def measure_bug(bug: catalogue.Bug, live: bool) -> Measured:
    try:
        with catalogue.bugged_tree(bug) as tree:
            return measure(tree, [bug.lab], live)
    except catalogue.CatalogueError as exc:
        return Measured(output=str(exc))


# -- the certificate -------------------------------------------------------------------------


def certify(correct: dict[str, Measured], bugs: dict[str, Measured]) -> dict[str, dict]:
    """Per comparison: the worst correct error, the smallest failing bug's error, the verdict."""
    rows: dict[str, dict] = {}
    for vid, m in correct.items():
        for key, w in m.worst.items():
            row = rows.setdefault(key, {"lab": lab_of(w["test"]), "test": w["test"], "what": w["what"],
                                        "atol": w["atol"], "rtol": w["rtol"], "correct": None, "bug": None})
            if row["correct"] is None or w["ratio"] > row["correct"]["ratio"]:
                row["correct"] = {"ratio": w["ratio"], "max_abs": w["max_abs"], "max_rel": w["max_rel"], "by": vid}
    for bid, m in bugs.items():
        for key, w in m.worst.items():
            if key not in rows or w["ratio"] <= 1:  # passed with the bug: not caught here
                continue
            row = rows[key]
            if row["bug"] is None or w["ratio"] < row["bug"]["ratio"]:
                row["bug"] = {"ratio": w["ratio"], "max_abs": w["max_abs"], "by": bid}
            row.setdefault("bugs_failing", []).append(bid)
    accepted = uncertified()
    for key, row in rows.items():
        row["status"] = verdict(row)
        if key in accepted:
            row["accepted"] = accepted[key]
    return dict(sorted(rows.items()))


def verdict(row: dict) -> str:
    c, b = row["correct"]["ratio"], (row["bug"] or {}).get("ratio")
    problems = []
    if c > 1:
        problems.append("a correct variant fails it")
    elif c > CORRECT_MARGIN:
        problems.append("too tight")
    if b is not None and b < BUG_MARGIN:
        problems.append("too loose for a bug")
    return "; ".join(problems) or "certified"


def machine() -> dict:
    import threadpoolctl

    blas = [i for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
    cpu = platform.processor() or ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu, "cores": os.cpu_count(), "system": platform.platform(terse=True),
            "python": platform.python_version(), "numpy": np.__version__,
            "openblas": blas[0].get("version") if blas else None,
            "kernel": blas[0].get("architecture") if blas else None, "torch": torch_version}


@dataclass
class Certificate:
    rows: dict[str, dict]
    machine: dict
    panel: list[dict]
    bugs: list[dict]
    labs: list[str] | None
    live: bool
    catalogued: dict[str, int] = field(default_factory=dict)  # per lab: the bugs that could run

    def to_json(self) -> dict:
        return {"margins": {"correct_at_most": CORRECT_MARGIN, "bug_at_least": BUG_MARGIN},
                "machine": self.machine, "labs": self.labs or "all", "live": self.live,
                "panel": self.panel, "bugs": self.bugs, "catalogued": self.catalogued, "comparisons": self.rows}

    @property
    def broken(self) -> list[str]:
        return [k for k, r in self.rows.items() if r["status"] != "certified" and not r.get("accepted")]


def _cache_path(cache: Path, name: str) -> Path:
    return cache / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".json")


def _cached(cache: Path | None, name: str, make: Callable[[], Measured]) -> Measured:
    """``make()``, or its result kept in ``cache`` by an earlier run (``--cache DIR``)."""
    path = _cache_path(cache, name) if cache else None
    if path and path.is_file():
        return Measured(**json.loads(path.read_text(encoding="utf-8")))
    m = make()
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(m.__dict__), encoding="utf-8")
    return m


def run(labs: list[str] | None = None, variants: list[str] | None = None, kernels=KERNELS, threads=THREADS,
        live: bool = False, bugs: bool = True, log: Callable[[str], None] = print, cache: Path | None = None,
        jobs: int = 1, bug_labs: list[str] | None = None, cached_bugs_only: bool = False) -> Certificate:
    correct: dict[str, Measured] = {}
    panel_info = []
    with tempfile.TemporaryDirectory(prefix="kit-tol-trees-") as tmp:
        for v in panel(variants, kernels, threads):
            if v.labs_within(labs) == []:
                continue
            m = _cached(cache, f"variant-{v.id}", lambda v=v: measure(v.tree(Path(tmp)), v.labs_within(labs), live,
                                                                       v.env))
            correct[v.id] = m
            panel_info.append({"id": v.id, "what": v.what, "env": v.env, "labs": m.labs or "all",
                               "seconds": round(m.seconds, 1),
                               "comparisons": len(m.worst), "failed_tests": m.failed})
            log(f"{v.id:24} {m.seconds:6.1f} s  {len(m.worst):4} comparisons  "
                + (f"{len(m.failed)} test(s) FAILED: {', '.join(m.failed[:3])}" if m.failed else "all tests pass"))
    measured_labs = {lab_of(w["test"]) for m in correct.values() for w in m.worst.values()}
    bug_runs: dict[str, Measured] = {}
    bug_info = []
    catalogued: dict[str, int] = {}
    if bugs:
        todo = [b for b in catalogue.load_catalogue(labs=bug_labs or labs)
                if b.lab in measured_labs and (live or not b.live)]
        catalogued = {lab: sum(1 for b in todo if b.lab == lab) for lab in measured_labs}
        if cached_bugs_only and cache:
            todo = [b for b in todo if _cache_path(cache, f"bug-{b.name}").is_file()]
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            done = pool.map(lambda b: _cached(cache, f"bug-{b.name}", lambda: measure_bug(b, live)), todo)
        for bug, m in zip(todo, done):
            bug_runs[bug.name] = m
            failing = sorted(k for k, w in m.worst.items() if w["ratio"] > 1)
            bug_info.append({"id": bug.name, "seconds": round(m.seconds, 1), "fails_by_tolerance": len(failing),
                             "failed_tests": len(m.failed)})
            log(f"{bug.name:48} {m.seconds:6.1f} s  fails {len(failing)} comparison(s) by tolerance")
    return Certificate(certify(correct, bug_runs), machine(), panel_info, bug_info, labs, live, catalogued)


# -- reports ---------------------------------------------------------------------------------


def _g(x: float | None) -> str:
    return "—" if x is None else ("∞" if x == float("inf") else f"{x:.2g}")


def render_markdown(cert: dict) -> str:
    m = cert["machine"]
    lines = [
        "## Measured",
        "",
        f"{m['date']} on {m['cpu']} ({m['cores']} cores), {m['system']}; Python {m['python']}, NumPy "
        f"{m['numpy']}, OpenBLAS {m['openblas']} ({m['kernel']} kernel by default)"
        + (f", torch {m['torch']}" if m.get("torch") else "") + ". Live (torch) tests "
        + ("included." if cert["live"] else "not included: the stored-fixture and property tests alone."),
        "",
        "| variant | what | labs | seconds | comparisons | failed tests |",
        "|---|---|---|---:|---:|---|",
    ]
    for p in cert["panel"]:
        failed = ", ".join(f"`{t}`" for t in p["failed_tests"][:3]) + (" …" if len(p["failed_tests"]) > 3 else "")
        labs = p.get("labs", "all")
        labs = labs if isinstance(labs, str) else ", ".join(lab[:2] for lab in labs)
        labs += f" ({p['date'][:10]})" if p.get("date") else ""
        lines.append(f"| `{p['id']}` | {p['what']} | {labs} | {p['seconds']:.0f} | {p['comparisons']} | "
                     f"{failed or 'none'} |")
    missed = [b["id"] for b in cert["bugs"] if not b.get("failed_tests")]
    lines += ["", f"{len(cert['bugs'])} catalogued bugs run "
              f"({sum(b['seconds'] for b in cert['bugs']):.0f} s in all): "
              + (f"**no test fails with {', '.join(missed)}**." if missed else "each makes at least one test fail."), ""]
    rows = cert["comparisons"]
    broken = {k: r for k, r in rows.items() if r["status"] != "certified"}
    lines += [f"{len(rows) - len(broken)} of {len(rows)} comparisons certified.", ""]
    by_lab: dict[str, list] = {}
    for key, r in rows.items():
        by_lab.setdefault(r["lab"], []).append(r)
    ran = {b["id"].split("/", 1)[0] for b in cert["bugs"]}
    for lab, group in sorted(by_lab.items()):
        n = sum(1 for b in cert["bugs"] if b["id"].startswith(lab + "/"))
        of = cert.get("catalogued", {}).get(lab, n)
        lines += [f"### {lab}", "",
                  (f"{n} of {of} catalogued bugs run: the bug column is the smallest ratio of a bug that fails the comparison "
                   "by tolerance (— where none does)." if lab in ran else
                   "**The catalogued bugs were not run for this lab**: the bug column is empty, the margin against "
                   "bugs unmeasured."), "",
                  "| test · what | atol | rtol | worst correct (÷ bound) | by | smallest bug (÷ bound) | by | verdict |",
                  "|---|---:|---:|---:|---|---:|---|---|"]
        for r in group:
            test = r["test"].split("::", 1)[1] if "::" in r["test"] else r["test"]
            bug = r["bug"] or {}
            lines.append(f"| `{test}` · {r['what'].replace('|', '/')} | {r['atol']:g} | {r['rtol']:g} | "
                         f"{_g(r['correct']['ratio'])} | {r['correct']['by']} | {_g(bug.get('ratio'))} | "
                         f"{bug.get('by', '—').split('/', 1)[-1]} | {r['status']} |")
        lines.append("")
    return "\n".join(lines)


MARK = "<!-- grader tolerances writes below this line -->"


def merge_reports(old: dict, new: dict) -> dict:
    """``new`` (a run on some labs) in place of those labs' part of ``old``: their
    comparisons and bug runs are replaced, every other lab's kept as measured. The panel
    lists the runs of both, each with its date, so a lab's rows say which run made them; a
    run of a variant that a later run of it repeats on all of its labs made none of the
    rows left, and is dropped (else each partial run would add its lines again)."""
    labs = {r["lab"] for r in new["comparisons"].values()} | set(new.get("catalogued", {}))
    date = new["machine"]["date"]
    rows = {k: r for k, r in old["comparisons"].items() if r["lab"] not in labs}
    rows.update(new["comparisons"])
    panel = [p if "date" in p else {**p, "date": old["machine"]["date"]} for p in old["panel"]]
    panel += [{**p, "date": date} for p in new["panel"]]

    def covers(later: dict, earlier: dict) -> bool:
        wide, narrow = later.get("labs", "all"), earlier.get("labs", "all")
        return later["id"] == earlier["id"] and (wide == "all" or narrow != "all" and set(narrow) <= set(wide))

    panel = [p for i, p in enumerate(panel) if not any(covers(q, p) for q in panel[i + 1 :])]
    return {**new, "labs": "all" if old.get("labs") == "all" else sorted(set(old.get("labs") or []) | labs),
            "live": old.get("live", False) and new.get("live", False),
            "panel": panel,
            "bugs": [b for b in old["bugs"] if b["id"].split("/", 1)[0] not in labs] + new["bugs"],
            "catalogued": {**{k: v for k, v in old.get("catalogued", {}).items() if k not in labs},
                           **new.get("catalogued", {})},
            "comparisons": dict(sorted(rows.items(), key=lambda kv: kv[1]["lab"]))}


def write_reports(cert: Certificate, json_path: Path = REPORT_JSON, md_path: Path = REPORT_MD,
                  merge: bool = False) -> None:
    """The report of ``cert``; with ``merge``, its labs replace theirs in the stored report
    and the other labs' rows stay (a run with ``--labs``)."""
    data = cert.to_json()
    if merge and json_path.is_file():
        data = merge_reports(load_report(json_path), data)
    json_path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    head = md_path.read_text(encoding="utf-8").split(MARK)[0] if md_path.is_file() else "# Tolerances\n\n"
    md_path.write_text(head.rstrip("\n") + "\n\n" + MARK + "\n\n" + render_markdown(data) + "\n", encoding="utf-8")


def load_report(path: Path = REPORT_JSON) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))
