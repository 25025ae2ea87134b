"""Run every benchmark and write its report into docs/performance.md.

    uv run --extra torch --extra similarity python -m benchmarks [--only NAME]... [--quick] [--list]

A benchmark is a file ``benchmarks/bench_<name>.py``: a script that prints its report as
markdown, the first line ``machine: …`` (``common.machine()``: the CPU, its cores, the
Python version, then its own thread counts and library versions), and, where it has one,
a last line ``summary: …``. Adding a benchmark means adding such a file (and, if it needs
arguments, an entry in ``ARGS``); nothing else changes.

The benchmarks run one after another, each in a process of its own (each sets its BLAS
threads before NumPy loads, and none shares the machine with another). A report replaces
what lies between ``<!-- BEGIN bench_<name> -->`` and ``<!-- END bench_<name> -->`` in
docs/performance.md (a benchmark without them gets a section at the end), under a line
saying when it ran, for how long and from which source (``source()``: a fingerprint of
the script, which tests/kit/test_docs.py holds to the script as it is now). The block
between ``<!-- BEGIN run -->`` and ``<!-- END run -->`` says where and with what the last
full run ran (a run with ``--only`` adds a line), and the summaries go to README.md
between ``<!-- BEGIN benchmark-summaries -->`` and its end marker. A benchmark that fails
keeps its previous report, and the command exits with status 1.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOC = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
COMMAND = "uv run --extra torch --extra similarity python -m benchmarks"

# The arguments a benchmark runs with, where it needs some (the rest run with none: every
# core's thread for NumPy's BLAS and for PyTorch, and their default sizes).
ARGS: dict[str, list[str]] = {
    "bench_grader": ["8"],  # submissions graded (and run bare) in the comparison
    "bench_assistant": ["--write"],  # 3 seeds at 1 and 2 threads; the table also goes to docs/11_assistant.md
}

# Smaller sizes for ``--quick``: a check that every benchmark and this script work end to
# end in a few minutes, not a measurement (its reports say which arguments they ran with).
QUICK: dict[str, list[str]] = {  # one thread: no BLAS thread spins waiting for a busy core
    "bench_forward": ["--threads", "1", "--repeats", "1"],
    "bench_generation": ["--threads", "1", "--new-tokens", "16", "--repeats", "1"],
    "bench_llama": ["--threads", "1", "--new-tokens", "16", "--repeats", "1"],
    "bench_seq2seq": ["--threads", "1", "--new-tokens", "8", "--repeats", "1"],
    "bench_training": ["--threads", "1", "--steps", "100", "--eval-every", "50", "--eval-iters", "2"],
    "bench_grader": ["2"],
    "bench_assistant": ["--tiny", "--seeds", "0", "--thread-counts", "1", "--steps", "2"],
    "bench_inference": ["--threads", "1", "--seq", "256", "--new-tokens", "8", "--repeats", "1", "--prompts", "2",
                        "--windows", "8"],
}

SUMMARY = "summary: "


def discover() -> list[str]:
    """Every benchmark's name (``bench_<name>``), in alphabetical order."""
    return sorted(p.stem for p in HERE.glob("bench_*.py"))


def markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"


def sections(text: str) -> dict[str, str]:
    """``{name: text between its markers}`` for every marked section of ``text``."""
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- BEGIN (\S+) -->\n(.*?)<!-- END \1 -->", text, re.S)}


def replace_section(text: str, name: str, body: str, heading: str | None = None) -> str:
    """``text`` with the section ``name`` holding ``body``; a section not there yet is
    appended, under ``heading`` when one is given."""
    begin, end = markers(name)
    body = body.rstrip("\n") + "\n"
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: f"{begin}\n{body}{end}", text, count=1)
    return text.rstrip("\n") + "\n\n" + (f"{heading}\n\n" if heading else "") + f"{begin}\n{body}{end}\n"


def versions() -> str:
    """The versions of what the benchmarks measure, and the BLAS NumPy calls."""
    found = [f"Python {platform.python_version()}"]
    for dist in ("numpy", "torch", "transformers"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    try:
        import numpy  # noqa: F401  (loads the BLAS that threadpoolctl describes)
        from threadpoolctl import threadpool_info

        found += [f"{pool.get('internal_api')} {pool.get('version')} ({pool.get('threading_layer', '')} threading, "
                  f"{pool.get('num_threads')} threads by default)" for pool in threadpool_info()
                  if pool.get("user_api") == "blas"]
    except ImportError:
        pass
    return ", ".join(found)


def source(name: str) -> str:
    """The fingerprint of a benchmark's script (the first 12 hex digits of its SHA-256):
    a report's stamp carries it, so a script changed since its report shows."""
    return hashlib.sha256((HERE / f"{name}.py").read_bytes()).hexdigest()[:12]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def arguments(name: str, quick: bool) -> list[str]:
    return QUICK.get(name, ARGS.get(name, [])) if quick else ARGS.get(name, [])


def run_one(name: str, args: list[str]) -> tuple[int, str, float]:
    """Run one benchmark, echoing its report as it comes; (exit status, report, seconds)."""
    cmd = [sys.executable, str(HERE / f"{name}.py"), *args]
    print(f"== {name}: {' '.join([Path(cmd[1]).relative_to(ROOT).as_posix(), *cmd[2:]])}", flush=True)
    start = time.perf_counter()
    # The kit's root on the path too, so that a script may import ``benchmarks.common``.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in proc.stdout:
        print(f"   {line}", end="", flush=True)
        lines.append(line)
    status = proc.wait()
    seconds = time.perf_counter() - start
    print(f"== {name}: {'done' if status == 0 else f'FAILED (exit status {status})'} in {seconds:.0f} s", flush=True)
    return status, "".join(lines), seconds


def check_report(name: str, report: str) -> str | None:
    """What is wrong with a report, or None: its first line must be ``machine: …``."""
    if not report.lstrip().startswith("machine: "):
        return f"{name}'s report does not begin with 'machine: '"
    return None


def summaries_block(doc: str) -> str:
    """The README's headline figures: where and when they were measured (the run block),
    then every report's summary line under its benchmark's name."""
    found = sections(doc)
    run = found.get("run", "")
    when = re.search(r"started (\S+ \S+ UTC)", run)
    where = re.search(r"^- Machine: (.+?)\.?$", run, re.M)
    small = " at small sizes (`--quick`: a check, not a measurement)"
    first = run.splitlines()[0] if run else ""
    lines = [f"Measured {when.group(1) if when else 'at an unknown date'} on "
             f"{where.group(1) if where else 'an unknown machine'}{small if '--quick' in first else ''}"
             f"{', each benchmark run alone since then dated on its line' if 'Since then' in run else ''}:", ""]
    for name, body in found.items():
        alone = re.search(rf"^- Since then, `{re.escape(name)}` alone, (\S+ \S+ UTC)(.*)$", run, re.M)
        note = f" ({alone.group(1)}{small if '--quick' in alone.group(2) else ''})" if alone else ""
        for line in body.splitlines():
            if line.startswith(SUMMARY):
                lines.append(f"- `{name}`{note}: {line[len(SUMMARY):].strip().rstrip('.')}.")
    return "\n".join(lines) if len(lines) > 2 else ""


def main(argv: list[str] | None = None) -> int:
    all_names = discover()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(n[6:] for n in all_names)}")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (QUICK): check that everything runs, in minutes; not a measurement")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and their arguments, run nothing")
    args = parser.parse_args(argv)
    if args.list:
        for name in all_names:
            print(" ".join([f"benchmarks/{name}.py", *arguments(name, args.quick)]))
        return 0
    names = all_names
    if args.only:
        wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in args.only]
        unknown = [n for n in wanted if n not in all_names]
        if unknown:
            parser.error(f"no benchmark named {', '.join(unknown)} (there are: {', '.join(all_names)})")
        names = [n for n in all_names if n in wanted]

    started, start, failed = now(), time.perf_counter(), []
    for name in names:
        status, report, seconds = run_one(name, arguments(name, args.quick))
        problem = f"exit status {status}" if status else check_report(name, report)
        if problem:
            failed.append(f"{name} ({problem})")
            continue
        stamp = (f"*Generated {now()} in {seconds:.0f} s by `benchmarks/{name}.py"
                 f"{''.join(' ' + a for a in arguments(name, args.quick))}` "
                 f"(source {source(name)}; alone: `{COMMAND} --only {name[6:]}{' --quick' if args.quick else ''}`).*\n\n")
        # Written as each benchmark ends, so a long run that stops keeps what it finished.
        DOC.write_text(replace_section(DOC.read_text(), name, stamp + report.lstrip(), heading=f"## {name}"))
    total = time.perf_counter() - start

    sys.path.insert(0, str(HERE))
    from common import machine

    quick = " --quick" if args.quick else ""
    small = " (small sizes: a check, not a measurement)" if args.quick else ""
    doc = DOC.read_text()
    previous = sections(doc).get("run", "")
    if names == all_names or "Last run:" not in previous:
        run = (f"Last run: {'every benchmark' if names == all_names else ', '.join(names)}, started {started}, "
               f"{total:.0f} s in all, by `{COMMAND}"
               f"{''.join(' --only ' + n[6:] for n in names) if names != all_names else ''}{quick}`{small}.\n\n"
               f"- Machine: {machine()}.\n"
               f"- Versions: {versions()}.\n"
               f"- Threads: each benchmark's NumPy BLAS and PyTorch use {os.cpu_count()} (every logical core) "
               f"unless its first line says otherwise.\n")
    else:  # a partial run: the full run's description stays, with a line per benchmark run since
        lines = [line for line in previous.rstrip("\n").splitlines()
                 if not any(line.startswith(f"- Since then, `{n}`") for n in names)]
        lines += [f"- Since then, `{n}` alone, {started}{small}." for n in names]
        run = "\n".join(lines) + "\n"
    doc = replace_section(doc, "run", run)
    DOC.write_text(doc)
    README.write_text(replace_section(README.read_text(), "benchmark-summaries", summaries_block(doc)))
    print(f"wrote {DOC.relative_to(ROOT)} and the summaries in {README.relative_to(ROOT)} ({total:.0f} s)")
    if failed:
        print("FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
