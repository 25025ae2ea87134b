"""Grader overhead: grading N identical complete submissions with `--jobs 2` against
running the same tests bare with pytest on each submission, 2 at a time.

    uv run python benchmarks/bench_grader.py [N]

Prints both wall times and their ratio (target: the grader's overhead under 50%, i.e.
a ratio under 1.5). The two take turns, two submissions at a time, so that other work on
the machine weighs on both alike. The grader's one-off calibration run is timed
separately.
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
    common.print_summary(f"grading costs {t_grade / t_bare:.2f}× the time of running the same tests bare "
                         f"({n} submissions, isolation: {g.isolation})")

if __name__ == "__main__":
    main()
