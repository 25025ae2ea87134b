"""Grader overhead: grading N identical complete submissions with `--jobs 2` against
running the same tests bare with pytest on each submission, 2 at a time.

    uv run python benchmarks/bench_grader.py [N]

Prints both wall times and their ratio (target: the grader's overhead under 50%, i.e.
a ratio under 1.5). The two take turns, two submissions at a time, so that other work on
the machine weighs on both alike. The grader's one-off calibration run is timed
separately.

Then what a student runs, in a student copy (`grader release`) holding the same labs:
`uv run grader check` (its first run, which builds its cached copy of the kit, and a
second) against `uv run pytest` on the same labs, taking turns (target: check under 1.5×
pytest).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402
from grader.grade import Grader  # noqa: E402
from grader.sandbox.runner import Limits  # noqa: E402

ALICE = ROOT / "examples" / "submissions" / "alice"
LABS = sorted(d.name[:2] for d in (ALICE / "labs").iterdir() if (d / "src").is_dir())  # every lab she did


def bare(sub: Path) -> None:
    tests = [str(ROOT / "tests" / d.name) for d in sorted((ROOT / "tests").iterdir()) if d.name[:2] in LABS]
    tests += [str(ROOT / "tests" / "hidden" / d.name) for d in sorted((ROOT / "tests" / "hidden").iterdir())
              if d.name[:2] in LABS]
    # One BLAS thread per run, as in the grader's sandbox: two runs share the two cores.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--impl={sub / 'labs'}",
                    "-m", "not torch", *tests], cwd=ROOT, check=True, capture_output=True, env=env)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subs = tmp / "class"
        for i in range(n):
            shutil.copytree(ALICE, subs / f"student{i:03d}")
        g = Grader(tmp / "out", LABS, limits=Limits(), log=lambda *_: None)
        (g.out_dir / ".scratch").mkdir(parents=True)
        t0 = time.perf_counter()
        g.prepare()
        t_calib = time.perf_counter() - t0
        t_bare = t_grade = 0.0
        results = []
        everyone = sorted(subs.iterdir())
        for i in range(0, n, 2):  # turns: two bare runs side by side, then the grader on the same two
            pair = everyone[i:i + 2]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(bare, pair))
            t_bare += time.perf_counter() - t0
            t0 = time.perf_counter()
            results += g.run_batch(pair, jobs=2)
            t_grade += time.perf_counter() - t0
        assert all(r.total == r.max_total for r in results), "every copy is complete"
    common.print_machine(None, f"; grader isolation: {g.isolation}")
    print(f"{n} identical complete submissions, labs {', '.join(LABS)}, 2 at a time (`grader grade --jobs 2`; "
          "bare pytest two side by side, one BLAS thread each), taking turns")
    print()
    common.print_table(["run", "seconds", "per submission"],
                       [["bare pytest", f"{t_bare:.2f}", f"{t_bare / n:.2f}"],
                        ["grader grade --jobs 2", f"{t_grade:.2f}", f"{t_grade / n:.2f}"],
                        ["one-off calibration", f"{t_calib:.2f}", ""]])
    print(f"- ratio grader / bare: {t_grade / t_bare:.2f} (overhead {100 * (t_grade / t_bare - 1):+.0f}%; "
          "target: under 1.5)")
    print()
    t_pytest, t_first, t_check = check_vs_pytest()
    print()
    print(f"A student copy holding the same labs ({', '.join(LABS)}), each command through `uv run`:")
    print()
    common.print_table(["run", "seconds"],
                       [["uv run pytest -m 'labNN or …'", f"{t_pytest:.2f}"],
                        ["uv run grader check (first run: builds its copy of the kit)", f"{t_first:.2f}"],
                        ["uv run grader check (later runs)", f"{t_check:.2f}"]])
    print(f"- ratio check / pytest: {t_check / t_pytest:.2f} (first run {t_first / t_pytest:.2f}; target: under 1.5)")
    print()
    common.print_summary(f"grading costs {t_grade / t_bare:.2f}× the time of running the same tests bare "
                         f"({n} submissions, isolation: {g.isolation}); `grader check` {t_check / t_pytest:.2f}× "
                         "`uv run pytest` on the same labs")


def check_vs_pytest(rounds: int = 2) -> tuple[float, float, float]:
    """Seconds of `uv run pytest` and of `uv run grader check` (first run, then the best of
    later ones) in a student copy holding alice's labs."""
    from grader.release import release

    # The copy's own environment and modules: not this kit's (`python -m benchmarks` puts
    # the kit on PYTHONPATH, which would bind the copy's tests to the kit's stubs).
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    marks = " or ".join(f"lab{lab}" for lab in LABS)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "kit"
        release(copy)
        shutil.copytree(ALICE / "labs", copy / "labs", dirs_exist_ok=True)
        subprocess.run(["uv", "sync", "--frozen", "-q"], cwd=copy, env=env, check=True, capture_output=True)

        def timed(*cmd) -> float:
            t0 = time.perf_counter()
            run = subprocess.run(["uv", "run", "--frozen", *cmd], cwd=copy, env=env, capture_output=True, text=True)
            if run.returncode:
                raise SystemExit(f"`uv run {' '.join(cmd)}` in the student copy exited {run.returncode}:\n"
                                 + (run.stdout + run.stderr)[-4000:])
            return time.perf_counter() - t0

        pytest_cmd = ("pytest", "-q", "-p", "no:cacheprovider", "-m", marks)
        t_pytest = [timed(*pytest_cmd)]
        t_first = timed("grader", "check", *LABS)
        t_check = []
        for _ in range(rounds):  # turns, so that other work on the machine weighs on both alike
            t_pytest.append(timed(*pytest_cmd))
            t_check.append(timed("grader", "check", *LABS))
    return min(t_pytest), t_first, min(t_check)

if __name__ == "__main__":
    main()
