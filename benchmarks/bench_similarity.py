"""`grader similarity` on a made-up class: N submissions of labs 01–06, each the example
student alice's code disguised differently (local variables renamed, comments rewritten,
functions reordered, spacing and blank lines changed). Every pair is a copy, so every pair
is compared in full and flagged: the slowest class there is.

    uv run --extra similarity python benchmarks/bench_similarity.py [N ...]   (default 50 100 200)

Prints a markdown table: the check's wall time (reading the submissions, tokenizing,
fingerprinting, comparing every pair), its CPU time (the check runs in one process, so on
a busy machine this is the time it would take on an idle one), and the time to write its
outputs.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, print_summary  # noqa: E402 - common puts the kit on sys.path

from grader import similarity  # noqa: E402

ALICE = ROOT / "examples" / "submissions" / "alice"
LABS = sorted(d.name[:2] for d in (ALICE / "labs").iterdir() if (d / "src").is_dir())


def _disguise():
    path = ROOT / "tests" / "grader" / "similarity_class" / "disguise.py"
    spec = importlib.util.spec_from_file_location("disguise", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.disguise


def make_class(root: Path, n: int) -> None:
    disguise = _disguise()
    files = sorted(ALICE.glob("labs/*/src/*.py"))
    texts = {f: f.read_text(encoding="utf-8") for f in files}
    for i in range(n):
        for f in files:
            out = root / f"student{i:03d}" / f.relative_to(ALICE)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(disguise(texts[f], seed=i), encoding="utf-8")


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [50, 100, 200]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        make_class(Path(tmp) / "class", max(sizes))
        everyone = sorted((Path(tmp) / "class").iterdir())
        for n in sizes:
            t0, c0 = time.perf_counter(), time.process_time()
            check = similarity.run(everyone[:n], LABS)
            t_check, c_check = time.perf_counter() - t0, time.process_time() - c0
            t0 = time.perf_counter()
            similarity.write_outputs(check, Path(tmp) / f"out{n}")
            t_write = time.perf_counter() - t0
            pairs = sum(len(p) for p in check.pairs.values())
            rows.append(f"| {n} | {pairs} | {len(check.flagged())} | {t_check:.1f} | {c_check:.1f} | "
                        f"{t_write:.1f} | {1000 * c_check / n:.0f} |")
            summary = (f"`grader similarity` compares {n} students ({pairs:,} pairs over labs {', '.join(LABS)}) in "
                       f"{t_check:.1f} s wall, {1000 * c_check / n:.0f} ms of CPU per student")
    print(f"machine: {machine()}")
    print()
    print(f"`grader similarity`, labs {', '.join(LABS)}, every student a disguised copy of every other "
          "(every pair compared in full)")
    print()
    print("| students | pairs scored | pairs flagged | check, wall (s) | check, CPU (s) | outputs (s) | "
          "CPU ms per student |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    print()
    print_summary(summary)


if __name__ == "__main__":
    main()
