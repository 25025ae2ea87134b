"""``grader gradescope OUT.zip``: an autograder bundle for Gradescope.

Gradescope unzips the bundle into ``/autograder/source``, runs ``setup.sh`` once to
build the image, then ``run_autograder`` per submission with the student's files in
``/autograder/submission``; the score is read from ``/autograder/results/results.json``.
The bundle is this kit (solutions and hidden tests included: it never reaches
students), and ``run_autograder`` grades with the same sandbox as ``grader grade``. It
runs as root in a container where bubblewrap usually cannot work: the grader then takes
the "root without bubblewrap" walls (``docs/instructors.md``, Trust): a network namespace
per sandboxed process, the drop to unprivileged users with no capabilities, through a
public copy of the kit's Python where those users cannot read it; or it refuses, and
results.json says why, in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from gptkit.testing.layout import KIT_ROOT

SETUP_SH = """#!/usr/bin/env bash
# Gradescope image set-up: uv, bubblewrap for the sandbox, the kit's locked environment.
set -euo pipefail
if command -v apt-get >/dev/null 2>&1; then
  apt-get update -q && apt-get install -y -q bubblewrap python3-pip || true
fi
python3 -m pip install --quiet uv || python3 -m pip install --quiet --break-system-packages uv
cd /autograder/source
uv sync --frozen
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# One submission: grade /autograder/submission, write /autograder/results/results.json.
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
cd "$ROOT/source"
uv run --frozen python -m grader.gradescope --run --root "$ROOT"
"""

# What the bundle carries: everything grading needs, nothing it does not.
INCLUDE = ["pyproject.toml", "uv.lock", "README.md", "gptkit", "grader", "labs", "solutions", "tests"]


def _tracked_files() -> list[Path] | None:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *INCLUDE], cwd=KIT_ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return [KIT_ROOT / p for p in out.stdout.decode().split("\0") if p]


def build_bundle(out_zip: Path) -> int:
    """Write the bundle; returns the number of files in it."""
    files = _tracked_files()
    if files is None:  # not a git checkout: take the folders as they are
        files = []
        for name in INCLUDE:
            p = KIT_ROOT / name
            files += [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    out_zip = Path(out_zip)
    out_zip.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_zip.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(files):
            if f.is_file():
                zf.write(f, str(f.relative_to(KIT_ROOT)))
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o755 << 16
            zf.writestr(info, text)
    tmp.replace(out_zip)
    return len(files) + 2


def run(root: Path) -> int:
    """Inside Gradescope: grade the one submission and write results.json."""
    from grader.grade import Grader
    from grader.outputs import gradescope_json

    submission = root / "submission"
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    work = results / "grading"
    if os.geteuid() == 0:
        # Run as root in a container without a working bubblewrap, the grader drops every
        # sandboxed process to an unprivileged user (runner.py, runtime.py): those users
        # must be able to pass through to the scratch folders (o+x, no listing).
        for folder in (root, results):
            folder.chmod(folder.stat().st_mode | 0o711)
    try:
        grader = Grader(work, log=lambda m: print(m, file=sys.stderr))
        (work / ".scratch").mkdir(parents=True, exist_ok=True)
        grader.prepare()
        r = grader.grade("submission", submission)
        payload = gradescope_json(r)
    except Exception as exc:  # noqa: BLE001 - Gradescope must always get a results.json
        payload = {"score": 0, "output": f"The autograder failed: {type(exc).__name__}: {exc}",
                   "visibility": "visible", "tests": []}
    (results / "results.json").write_text(json.dumps(payload, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    print(f"score {payload['score']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.gradescope")
    p.add_argument("--run", action="store_true", help="grade /autograder/submission (inside Gradescope)")
    p.add_argument("--root", default=os.environ.get("AUTOGRADER_ROOT", "/autograder"))
    args = p.parse_args(argv)
    if args.run:
        return run(Path(args.root))
    p.error("use `grader gradescope OUT.zip` to build a bundle")
    return 2


if __name__ == "__main__":
    sys.exit(main())
