"""``grader grade``: grade a class of untrusted submissions.

For each student and each lab: build a scratch folder with the kit's pristine tests
(public and hidden) and the student's own files of that lab and of every lab before it
(lab N imports the student's earlier labs, as it does under ``uv run pytest``; no
reference code of any lab reaches a process that runs student code), run it in the
sandbox, and score the tests from the sandbox's own reports. Scores come from the tests alone: the static review
(``grader/policy.py``) only adds notes "for review". Results are written per student,
atomically, as soon as that student is done, so a batch that is killed and started again
only grades who is left.

Where the kit has no reference solutions (a student's copy, for ``grader check``), the
same files are graded the same way, and every test the lab's run reports counts (no
calibration on the reference).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gptkit.testing.layout import KIT_ROOT, lab_dirs, lab_of
from grader import handin, policy
from grader.progress import watch_labs
from grader.rubric import LabRubric, load_rubric
from grader.sandbox import protocol, runner
from grader.stubs import expected_stubs
from grader.submission import Submission, SubmissionError, discover, expected_files, read_submission, unique_ids

HIDDEN_DIR = "tests/hidden"
RESULT_FILE = "result.json"
REVIEW_NOTES_SHOWN = 5  # per lab; the rest are counted
HIDDEN_FAILED = "a hidden test failed"  # what a student reads of one, with its docstring's first line
MEMORY_NEAR = 0.9  # a lab process whose peak memory reached this share of the limit met it
HYPOTHESIS_CONSTANTS = ".hypothesis"  # in the cached kit: Hypothesis's storage, filled by _precompile


@dataclass
class TestRecord:
    __test__ = False  # a record of a test, not a test for pytest to collect

    nodeid: str
    lab: str
    hidden: bool
    outcome: str  # passed | failed | error | skipped | not run
    points: float
    max_points: float
    message: str
    seconds: float


@dataclass
class LabResult:
    lab: str
    points: float = 0.0
    max_points: float = 0.0
    flags: list[str] = field(default_factory=list)
    tests: list[TestRecord] = field(default_factory=list)


@dataclass
class StudentResult:
    student: str
    source: str
    submission_digest: str = ""
    kit_digest: str = ""
    total: float = 0.0
    max_total: float = 0.0
    labs: dict[str, LabResult] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    error: str = ""  # set when the submission could not be graded at all
    isolation: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: dict) -> "StudentResult":
        labs = {k: LabResult(**{**v, "tests": [TestRecord(**t) for t in v["tests"]]}) for k, v in data["labs"].items()}
        return StudentResult(**{**data, "labs": labs})


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def kit_digest(labs: list[str]) -> str:
    """Changes whenever anything that decides a grade changes."""
    h = hashlib.sha256()
    files = [KIT_ROOT / "tests" / "conftest.py", KIT_ROOT / "pyproject.toml", Path(__file__),
             Path(runner.__file__), *runner.boot_files().values(), KIT_ROOT / "grader" / "rubric.toml",
             KIT_ROOT / "grader" / "policy.py", KIT_ROOT / "grader" / "handin.py"]
    for sub in ("gptkit",):
        files += sorted((KIT_ROOT / sub).rglob("*.py"))
    for lab in labs:
        for base in (KIT_ROOT / "tests" / lab, KIT_ROOT / HIDDEN_DIR / lab, KIT_ROOT / "solutions" / lab):
            if base.is_dir():
                files += sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for f in files:
        h.update(str(f.relative_to(KIT_ROOT)).encode() + b"\0")
        h.update(f.read_bytes())
    h.update(",".join(labs).encode())
    return h.hexdigest()[:16]


def _share_cores(jobs: int) -> dict[int, set[int]]:
    """Slot → the cores its submission runs on, when ``jobs`` submissions are graded side by
    side and each can have cores of its own; otherwise none (the scheduler decides)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return {}
    if jobs < 2 or len(cores) < jobs:
        return {}
    per = len(cores) // jobs
    return {slot: set(cores[slot * per:(slot + 1) * per]) for slot in range(jobs)}


class Grader:
    def __init__(self, out_dir: Path, labs: list[str] | None = None, *, limits: runner.Limits | None = None,
                 force: bool = False, log=print):
        self.out_dir = Path(out_dir).resolve()
        self.limits = limits or runner.Limits()
        # A student's copy has no reference solutions: no calibration, no hidden tests.
        self.reference = (KIT_ROOT / "solutions").is_dir()
        self.force = force
        self.log = log
        self.source = KIT_ROOT / ("solutions" if self.reference else "labs")  # the labs' own files
        all_labs = [lab.name for lab in lab_dirs(self.source)]
        self.labs = [name for name in all_labs if not labs or name in labs or name[:2] in labs]
        if labs and not self.labs:
            raise SubmissionError(f"no lab matches {labs}; labs are {', '.join(all_labs)}")
        self.rubric = load_rubric()
        missing = [lab for lab in self.labs if lab not in self.rubric]
        if missing:
            raise SubmissionError(f"grader/rubric.toml has no entry for {', '.join(missing)}")
        self.all_wanted = expected_files(self.source)
        self.wanted = {k: v for k, v in self.all_wanted.items() if k in self.labs}
        self.digest = kit_digest(self.labs)
        self.cache = self.out_dir / ".cache" / self.digest
        self.isolation = runner.isolation_mode()
        self.cpu_sets: dict[int, set[int]] = {}  # run_batch's: slot → its cores
        self.graded_tests: dict[str, list[str]] = {}
        self.on_lab = None  # run_batch's: on_lab(student, lab, over) as each lab of a submission starts, ends
        # What a lab left as the stub looks like (the full kit only: a student's copy has
        # no pristine stubs), and which modules each lab's code and tests use.
        self.stubs = handin.stub_texts(expected_stubs()) if self.reference else {}
        self.kit_uses = handin.kit_uses(self.source, KIT_ROOT / "tests", KIT_ROOT / HIDDEN_DIR, list(self.all_wanted))

    # -- one-time preparation ----------------------------------------------------------
    def prepare(self) -> None:
        self.cache.mkdir(parents=True, exist_ok=True)
        self._build_kit_template()
        if not self.reference:
            return  # graded: every test the student's run reports (see _score)
        calib = self.cache / "calibration.json"
        if calib.is_file():
            self.graded_tests = json.loads(calib.read_text())
            return
        self.log(f"calibrating: running the tests on the reference solutions ({self.isolation} isolation) …")
        ref = Submission("reference", KIT_ROOT / "solutions")
        for lab in self._read_wanted():
            ref.files[lab] = {p.name: p.read_bytes() for p in sorted((KIT_ROOT / "solutions" / lab).glob("*.py"))}
        raw_by_lab = self._run_submission(ref, slot=0)
        problems, graded = [], {}
        for lab in self.labs:
            tests = [e for e in raw_by_lab.events if isinstance(e, protocol.TestResult) and e.lab == lab
                     and lab_of(e.nodeid) == lab]
            graded[lab] = sorted(e.nodeid for e in tests if e.outcome == "passed")
            problems += [f"{e.nodeid}: {e.message[:300]}" for e in tests if e.outcome in ("failed", "error")]
            if not graded[lab]:
                problems.append(f"{lab}: no test passed on the reference solution")
        if problems or raw_by_lab.killed:
            detail = "\n  ".join(problems + ([raw_by_lab.killed] if raw_by_lab.killed else []))
            raise RuntimeError(f"the reference solutions do not pass in the grader's sandbox:\n  {detail}\n"
                               f"sandbox output:\n{raw_by_lab.output[-3000:]}")
        self.graded_tests = graded
        write_atomic(calib, json.dumps(graded, indent=1))

    def _build_kit_template(self) -> None:
        kit = self.cache / "kit"
        if (kit / ".complete").is_file():
            return
        if kit.exists():
            shutil.rmtree(kit)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(KIT_ROOT / "gptkit", kit / "gptkit", ignore=ignore)
        (kit / "tests").mkdir(parents=True)
        shutil.copy2(KIT_ROOT / "tests" / "conftest.py", kit / "tests" / "conftest.py")
        for lab in self.labs:
            shutil.copytree(KIT_ROOT / "tests" / lab, kit / "tests" / lab,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "make_fixtures.py"))
            hidden = KIT_ROOT / HIDDEN_DIR / lab
            if hidden.is_dir():
                shutil.copytree(hidden, kit / HIDDEN_DIR / lab, ignore=ignore)
        # pytest's configuration only: markers and options, not the project's scripts.
        text = (KIT_ROOT / "pyproject.toml").read_text(encoding="utf-8")
        ini = text[text.index("[tool.pytest.ini_options]"):]
        (kit / "pyproject.toml").write_text(ini, encoding="utf-8")
        for name, src in runner.boot_files().items():
            shutil.copy2(src, kit / name)
        self._precompile(kit, self.source)
        for p in kit.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        (kit / ".complete").write_text("")

    @staticmethod
    def _precompile(kit: Path, impl: Path) -> None:
        """Bytecode for the kit, made once here: the test and lab processes run with -B on a
        read-only copy, so each would otherwise compile the kit's modules, and rewrite and
        compile every test module, again for every submission (about 0.9 s of CPU for labs
        01-06). The tests' bytecode is what pytest's assertion rewriting writes while it
        collects them; a copy keeps the sources' times, so it stays valid. Best effort:
        without it grading is slower, not different."""
        import compileall

        compileall.compile_dir(str(kit), quiet=2)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPATH"] = str(kit)
        try:
            subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            f"--impl={impl}", "tests"], cwd=kit, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        except (OSError, subprocess.TimeoutExpired):
            pass
        # Hypothesis reads the constants of every local module's source (the kit's) to mix
        # into what it draws, and caches them in its storage folder, keyed by the source's
        # hash. Each submission starts with an empty folder, so each lab's process parsed
        # the kit's sources again (about 0.45 s of CPU for labs 01-06): the cache is made
        # here once and copied in (``HYPOTHESIS_CONSTANTS``). The same constants either way.
        fill = ("import sys, types\n"
                "from pathlib import Path\n"
                "from hypothesis.internal.constants_ast import constants_from_module\n"
                "for i, path in enumerate(sorted(Path(sys.argv[1]).rglob('*.py'))):\n"
                "    module = types.ModuleType(f'kit_module_{i}')\n"
                "    module.__file__ = str(path)\n"
                "    constants_from_module(module)\n")
        env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(kit / HYPOTHESIS_CONSTANTS)
        try:
            subprocess.run([sys.executable, "-c", fill, str(kit)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=600)
        except (OSError, subprocess.TimeoutExpired):
            pass

    # -- one submission -------------------------------------------------------------------
    def _lab_modules(self, lab: str, sub: Submission) -> list[str]:
        """Modules beyond the standard library that ``lab``'s code uses without a review note:
        the rubric's, the kit's lab modules, and the student's own modules (helpers included)."""
        rub: LabRubric = self.rubric[lab]
        kit = [m for mods in self.all_wanted.values() for m in mods]
        own = {rel.split("/")[0].removesuffix(".py") for files in sub.files.values() for rel in files
               if rel.endswith(".py")}
        return rub.allowed_imports + kit + sorted(own)

    def review(self, lab: str, sub: Submission) -> list[str]:
        """The static review's notes on a lab's files ("labs/…/x.py line 3: imports gc: …")."""
        out = []
        allowed = self._lab_modules(lab, sub)
        for rel, data in sub.python_files(lab).items():
            text = data.decode("utf-8", "replace")
            for finding in policy.review_source(text, allowed):
                out.append(f"labs/{lab}/src/{rel} {finding}")
        return out

    def name_clashes(self, sub: Submission) -> list[str]:
        """Top-level names (modules, helper packages, data files) that two labs of one
        submission both hold, or that a lab holds under another lab's module name: Python
        imports the first lab's file in both, as ``uv run pytest`` does, so the note says so."""
        owner: dict[str, str] = {m: lab for lab, mods in self.all_wanted.items() for m in mods}
        seen: dict[str, str] = {}
        notes = []
        for lab in sorted(sub.files):
            for top in sorted({rel.split("/")[0] for rel in sub.files[lab]}):
                name = top.removesuffix(".py")
                first = seen.get(name) or (owner.get(name) if owner.get(name) != lab else None)
                if first and first != lab:
                    notes.append(f"labs/{lab}/src/{top} has the name of a file of labs/{first}/src: Python finds "
                                 f"lab {first[:2]}'s first in both labs (rename one)")
                else:
                    seen.setdefault(name, lab)
        return notes

    def _run_submission(self, sub: Submission, slot: int, runnable: list[str] | None = None) -> runner.RawRun:
        """Lab N's tree holds the submission's files of labs ≤ N, each lab in its own folder."""
        runnable = self.labs if runnable is None else runnable
        if not runnable:
            return runner.RawRun(isolation=self.isolation)
        scratch = Path(tempfile.mkdtemp(prefix="grade-", dir=self.out_dir / ".scratch"))
        try:
            kit = self.cache / "kit"
            if self.isolation == "bwrap":  # it mounts the cached kit read-only here
                (scratch / "kit").mkdir()
            else:
                shutil.copytree(kit, scratch / "kit", ignore=shutil.ignore_patterns(".complete", HYPOTHESIS_CONSTANTS))
            jobs = []
            for lab in runnable:
                tree = scratch / "impl" / lab
                for name in [name for name in self.all_wanted if name <= lab]:
                    d = tree / name
                    d.mkdir(parents=True, exist_ok=True)
                    for rel, data in sub.files.get(name, {}).items():
                        (d / rel).parent.mkdir(parents=True, exist_ok=True)
                        (d / rel).write_bytes(data)
                tests = [f"tests/{lab}"]
                if (kit / HIDDEN_DIR / lab).is_dir():
                    tests.append(f"{HIDDEN_DIR}/{lab}")
                jobs.append({"lab": lab, "tests": tests})
            for p in (scratch / "impl").rglob("*"):
                p.chmod(0o755 if p.is_dir() else 0o644)
            (scratch / "work").mkdir()
            (scratch / "tmp").mkdir()
            if (self.cache / "kit" / HYPOTHESIS_CONSTANTS).is_dir():
                shutil.copytree(self.cache / "kit" / HYPOTHESIS_CONSTANTS, scratch / runner.HYPOTHESIS_DIR)
            scratch.chmod(0o755)
            module_labs = {m: name for name, mods in self.all_wanted.items() for m in mods}
            told = (lambda lab, over: self.on_lab(sub.student, lab, over)) if self.on_lab else None
            with watch_labs(scratch / "slogs", [j["lab"] for j in jobs], told):
                return runner.run(scratch, jobs, self.limits, slot=slot, mode=self.isolation,
                                  module_labs=module_labs, cpus=self.cpu_sets.get(slot), kit=kit)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def grade(self, student: str, path: Path, slot: int = 0) -> StudentResult:
        start = time.monotonic()
        res = StudentResult(student, str(path), kit_digest=self.digest, isolation=self.isolation)
        try:
            sub = read_submission(student, path, self._read_wanted())
        except SubmissionError as exc:
            res.error = str(exc)
            res.flags.append(f"not graded: {exc}")
            self._score_empty(res, f"not graded: {exc}")
            return res
        res.submission_digest = sub.digest()
        res.flags += sub.notes + self.name_clashes(sub)
        runnable, not_run, notes = [], {}, {}
        for lab in self.labs:
            missing = [m for m in self.wanted[lab] if m not in sub.modules(lab)]
            notes[lab] = self.review(lab, sub)
            for rel, data in sub.python_files(lab).items():
                try:
                    compile(data, f"labs/{lab}/src/{rel}", "exec", dont_inherit=True)
                except SyntaxError as exc:
                    res.flags.append(f"syntax error in labs/{lab}/src/{rel} line {exc.lineno}: {exc.msg}")
                except ValueError as exc:  # e.g. null bytes
                    res.flags.append(f"labs/{lab}/src/{rel} cannot be compiled: {exc}")
                except (RecursionError, MemoryError):
                    pass  # nested past this process's room (generated code): its lab process, with more, decides
            why = handin.not_handed_in(lab, missing, sub.files.get(lab, {}), self.stubs.get(lab))
            if why:
                not_run[lab] = why
            else:
                runnable.append(lab)
        res.flags += handin.flags(not_run)
        raw = self._run_submission(sub, slot, runnable)
        if raw.killed:
            res.flags.append(raw.killed)
        self._score(res, raw, not_run, notes)
        module_labs = {m: name for name, mods in self.all_wanted.items() for m in mods}
        handin.dependency_notes(res, handin.depends_on(self.kit_uses, module_labs, sub.files), set(not_run))
        res.seconds = round(time.monotonic() - start, 2)
        return res

    @functools.cache
    def concept(self, nodeid: str) -> str:
        """What a student reads of a hidden test that failed: the first line of its
        docstring (the kit's text), never its message."""
        path, _, name = nodeid.partition("::")
        name = name.split("[")[0].split("::")[-1]
        try:
            tree = ast.parse((self.cache / "kit" / path).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return HIDDEN_FAILED
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                doc = (ast.get_docstring(node) or "").strip().splitlines()
                return f"{HIDDEN_FAILED}: {doc[0]}" if doc else HIDDEN_FAILED
        return HIDDEN_FAILED

    def _read_wanted(self) -> dict[str, list[str]]:
        """The labs to read from a submission: its graded labs and the earlier labs they
        import."""
        last = max(self.labs)
        return {lab: mods for lab, mods in self.all_wanted.items() if lab <= last}

    def _score_empty(self, res: StudentResult, why: str) -> None:
        self._score(res, runner.RawRun(), {lab: why for lab in self.labs})

    def _score(self, res: StudentResult, raw: runner.RawRun, not_run: dict[str, str],
               notes: dict[str, list[str]] | None = None) -> None:
        """Points from the test process's events alone. A lab whose test process did not end
        cleanly, or that reported one test twice, gets nothing from what it reported. The
        static review's ``notes`` become flags "for review" and change no point."""
        by_lab: dict[str, list] = {}
        for e in raw.events:
            by_lab.setdefault(e.lab, []).append(e)
        for lab in self.labs:
            lr = LabResult(lab)
            events = by_lab.get(lab, [])
            if self.reference:
                nodeids = self.graded_tests.get(lab, [])
            else:  # a student's copy: what ran, less what skipped (no torch, no real weights)
                nodeids = sorted({e.nodeid for e in events if isinstance(e, (protocol.TestStart, protocol.TestResult))
                                  and lab_of(e.nodeid) == lab}
                                 - {e.nodeid for e in events if isinstance(e, protocol.TestResult)
                                    and e.outcome == "skipped"})
            points = self.rubric[lab].split(nodeids)
            lab_notes = (notes or {}).get(lab, [])
            lr.flags += [f"for review: {n}" for n in lab_notes[:REVIEW_NOTES_SHOWN]]
            if len(lab_notes) > REVIEW_NOTES_SHOWN:
                lr.flags.append(f"for review: {len(lab_notes) - REVIEW_NOTES_SHOWN} more line(s) of the same kind")

            def first(kind):
                return next((e for e in events if isinstance(e, kind)), None)

            results: dict[str, protocol.TestResult] = {}
            duplicated = set()
            for e in events:
                if isinstance(e, protocol.TestResult):
                    if e.nodeid in results:
                        duplicated.add(e.nodeid)
                    results[e.nodeid] = e
            duplicated = sorted(duplicated)
            started = [e.nodeid for e in events if isinstance(e, protocol.TestStart)]
            timeout, end, crash, stopped = (first(k) for k in (protocol.LabTimeout, protocol.LabEnd,
                                                                protocol.LabCrash, protocol.LabStopped))
            # Flags come from what the grader and its test process measured themselves, never
            # from text the lab process wrote (its audit hook's reports, its exceptions' names
            # and messages): lab code can neither add, nor remove, nor reword one.
            seen = raw.observed.get(lab, {})
            printed = raw.lab_output_bytes.get(lab, 0)
            if printed >= self.limits.max_file_mb * 1024 * 1024:
                lr.flags.append(f"output limit: the lab printed more than {self.limits.max_file_mb} MB")
            elif printed > 1024 * 1024:
                lr.flags.append(f"the lab printed {printed / 1e6:.1f} MB")
            # pytest exits 0 or 1 when it ran everything; 2 when the plugin stopped the lab itself.
            clean = (end is not None and not end.signal and not duplicated and not crash
                     and (end.exit in (0, 1) or (end.exit == 2 and stopped is not None)))
            why_none = ""
            if lab in not_run:
                why_none = not_run[lab]
            elif duplicated:
                why_none = f"no result: the test process reported {duplicated[0]} twice, so none of its results count"
                lr.flags.append(f"the results of this lab were inconsistent ({len(duplicated)} reported twice)")
            elif timeout:
                why_none = f"no result: the lab's tests were stopped after the {timeout.seconds:g} s wall-clock backstop"
                lr.flags.append(f"time limit: the lab's tests ran past {timeout.seconds:g} s (wall clock)")
            elif raw.killed:
                why_none = f"no result: {raw.killed}"
            elif crash:
                why_none = f"no result: the test process stopped ({crash.what[:200]})"
                lr.flags.append(f"test run crashed: {crash.what[:200]}")
            elif not clean:
                how = (f"exit code {end.exit}, signal {end.signal}" if end is not None else "it never reported its end")
                why_none = f"no result: the lab's test process did not end cleanly ({how})"
                lr.flags.append(f"the test process ended abnormally ({how})")
            for nodeid in nodeids:
                hidden = nodeid.startswith(HIDDEN_DIR + "/")
                e = results.get(nodeid)
                if e is not None and hidden:  # its message may carry its inputs, or text the lab wrote
                    e = dataclasses.replace(e, message=self.concept(nodeid) if e.outcome != "passed" else "")
                if why_none:
                    rec = TestRecord(nodeid, lab, hidden, "not run", 0.0, points[nodeid], why_none, 0.0)
                elif e is not None:
                    ok = e.outcome == "passed"
                    rec = TestRecord(nodeid, lab, hidden, e.outcome, points[nodeid] if ok else 0.0,
                                     points[nodeid], e.message, e.duration)
                else:
                    why = "no result: the test did not run"
                    if stopped:
                        why = f"not run: the lab's tests were stopped once {stopped.what}"
                    elif started and started[-1] not in results:
                        why = f"no result: the test process died while running {started[-1].split('::')[-1]}"
                    rec = TestRecord(nodeid, lab, hidden, "not run", 0.0, points[nodeid], why, 0.0)
                lr.tests.append(rec)
            self.rubric[lab].withhold(lr.tests)  # shape and property tests count only with the values right
            if seen.get("disk"):
                lr.flags.append(f"disk quota: the lab code kept more than the {self.limits.disk_mb} MB allowed in "
                                "its scratch folder; the grader stopped its process")
            if seen.get("memory", 0) >= MEMORY_NEAR * self.limits.memory_mb:
                lr.flags.append(f"memory limit: a lab process reached {seen['memory']} MB of the "
                                f"{self.limits.memory_mb} MB allowed")
            timed = [nodeid for nodeid, e in results.items() if e.outcome != "passed" and not why_none
                     and (e.cpu >= (e.limit or self.limits.test_seconds) * 0.9
                          or e.duration >= self.limits.test_wall_seconds)]
            if timed:
                lr.flags.append(f"time limit: {len(timed)} test(s) ran past their CPU-time limit "
                                f"({self.limits.test_seconds:g} s a test)")
            if stopped and not why_none and "CPU time" in stopped.what:
                lr.flags.append(f"time limit: the lab's tests were stopped once {stopped.what}")
            if seen.get("died"):
                lr.flags.append(f"the lab code's process ended by itself {seen['died']} time(s) "
                                "(os._exit, a crash or a limit)")
            lr.points = round(sum(t.points for t in lr.tests), 4)
            lr.max_points = round(sum(t.max_points for t in lr.tests), 4)
            res.labs[lab] = lr
        res.total = round(sum(lr.points for lr in res.labs.values()), 4)
        res.max_total = round(sum(lr.max_points for lr in res.labs.values()), 4)

    # -- a batch ----------------------------------------------------------------------------
    def student_dir(self, student: str) -> Path:
        return self.out_dir / "students" / student

    def existing(self, student: str, path: Path) -> StudentResult | None:
        f = self.student_dir(student) / RESULT_FILE
        if self.force or not f.is_file():
            return None
        try:
            old = StudentResult.from_json(json.loads(f.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError):
            return None
        if old.kit_digest != self.digest:
            return None
        if old.error:
            return None  # retry what could not be graded
        try:
            digest = read_submission(student, path, self._read_wanted()).digest()
        except SubmissionError:
            return None
        return old if digest == old.submission_digest else None

    def run_batch(self, paths: list[Path], jobs: int = 1, on_done=None, on_lab=None) -> list[StudentResult]:
        from grader import outputs

        (self.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
        unique = unique_ids(discover(paths))
        self.prepare()
        self.on_lab = on_lab
        results: dict[str, StudentResult] = {}
        todo = []
        for student, p in unique:
            old = self.existing(student, p)
            if old is not None:
                results[student] = old
                if on_done:
                    on_done(old, True)
            else:
                todo.append((student, p))
        free_slots = list(range(max(1, jobs)))
        self.cpu_sets = _share_cores(len(free_slots))

        def work(item):
            student, p = item
            slot = free_slots.pop()
            try:
                try:
                    r = self.grade(student, p, slot)
                except Exception as exc:  # noqa: BLE001 - one student's failure never stops the batch
                    r = StudentResult(student, str(p), kit_digest=self.digest, isolation=self.isolation)
                    r.error = f"grader error: {type(exc).__name__}: {exc}"
                    r.flags.append(r.error)
                    self._score_empty(r, r.error)
                    (self.out_dir / "logs").mkdir(parents=True, exist_ok=True)
                    write_atomic(self.out_dir / "logs" / f"{student}.txt", traceback.format_exc())
                outputs.write_student(self, r)
                return r
            finally:
                free_slots.append(slot)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(work, item) for item in todo]
            for fut in as_completed(futures):
                r = fut.result()
                results[r.student] = r
                if on_done:
                    on_done(r, False)
        ordered = [results[s] for s, _ in unique if s in results]
        outputs.write_class(self, ordered)
        return ordered

