"""``uv run grader <command>``: the instructor's entry point."""

from __future__ import annotations

import argparse
import sys

from gptkit.testing.layout import KIT_ROOT


def _labs_option(s: argparse.ArgumentParser, what: str) -> None:
    """``--labs 01,03``: which labs a command covers; read back with ``_labs``."""
    s.add_argument("--labs", help=f"comma-separated lab numbers {what}, e.g. 01,03 (default: all)")


def _labs(value: str | None) -> list[str] | None:
    return [v.strip().zfill(2) if v.strip().isdigit() else v.strip() for v in value.split(",")] if value else None


def cmd_stubs(args) -> int:
    from grader import stubs

    if args.check:
        stale = stubs.stale_stubs()
        for p in stale:
            print(f"stale: {p.relative_to(KIT_ROOT)}")
        print("stubs are current" if not stale else f"{len(stale)} stub(s) out of date: run `uv run grader stubs`")
        return 1 if stale else 0
    changed = stubs.write_stubs()
    for p in changed:
        print(f"wrote {p.relative_to(KIT_ROOT)}")
    print(f"{len(changed)} stub(s) written" if changed else "stubs already current")
    return 0


def cmd_fixtures(args) -> int:
    from grader import fixtures

    if args.noise:
        return _fixture_noise(args)
    rep = fixtures.generate(_labs(args.labs), check=args.check)
    for p in rep.written:
        print(f"wrote {p.relative_to(KIT_ROOT)}")
    for p in rep.removed:
        print(f"removed {p.relative_to(KIT_ROOT)}")
    for p in rep.stale:
        print(f"stale: {p.relative_to(KIT_ROOT)}")
    for s in rep.skipped:
        print(f"skipped {s}")
    print(f"{len(rep.written)} written, {len(rep.unchanged)} unchanged, {len(rep.stale)} stale, "
          f"{len(rep.skipped)} lab(s) skipped")
    return 1 if rep.stale else 0


def _fixture_noise(args) -> int:
    import json

    from grader import fixtures

    variants = [v.strip() for v in args.variants.split(",")] if args.variants else None
    report = fixtures.noise_panel(_labs(args.labs), only=variants)
    worst = sorted(report["arrays"].items(), key=lambda kv: -kv[1]["deviation"])
    for key, row in worst[:10]:
        print(f"{row['deviation']:8.3g} of the bound  {key}  ({row['by']})")
    over = [key for key, row in worst if not row["deviation"] <= fixtures.NOISE_MARGIN]
    print(f"{len(report['arrays'])} arrays rebuilt by {len(report['panel'])} variants; "
          f"{len(over)} beyond {fixtures.NOISE_MARGIN:g} of the staleness bound")
    if args.write:
        if (args.labs or variants) and fixtures.NOISE_JSON.is_file():
            report = fixtures.merge_noise(json.loads(fixtures.NOISE_JSON.read_text(encoding="utf-8")), report,
                                          _labs(args.labs), variants)
        fixtures.NOISE_JSON.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {fixtures.NOISE_JSON.relative_to(KIT_ROOT)}")
    return 1 if over else 0


def cmd_catalogue(args) -> int:
    from grader import catalogue

    bugs = catalogue.load_catalogue(labs=_labs(args.labs))
    live = not args.no_live
    print(catalogue.mode_line(live))
    results = catalogue.check_catalogue(bugs, jobs=args.jobs, live=live)
    for r in results:
        print(catalogue.describe(r))
    bad = [r for r in results if not r.ok]
    print(f"{len(results) - len(bad)} of {len(results)} bugs caught, the first failure naming the mistake")
    return 1 if bad else 0


def cmd_validate(args) -> int:
    from grader import validate

    sections = validate.run(jobs=args.jobs, labs=_labs(args.labs))
    print(validate.render(sections))
    ok = all(s.ok for s in sections)
    print("the kit is valid" if ok else "the kit is NOT valid: see FAIL above")
    return 0 if ok else 1


def cmd_grade(args) -> int:
    from pathlib import Path

    from grader.grade import Grader
    from grader.progress import Progress
    from grader.sandbox import runner
    from grader.sandbox.runner import Limits
    from grader.submission import SubmissionError, discover

    if args.similarity:
        from grader.similarity import missing

        if missing():
            print(f"grader grade --similarity: {missing()}", file=sys.stderr)
            return 2
    limits = Limits(wall_seconds=args.timeout, lab_seconds=args.lab_timeout,
                    test_seconds=args.test_timeout, memory_mb=args.memory)
    try:
        grader = Grader(Path(args.out), _labs(args.labs), limits=limits, force=args.force,
                        log=lambda m: print(m, file=sys.stderr))
        total = len(discover([Path(p) for p in args.paths]))
    except SubmissionError as exc:
        print(f"grader grade: {exc}", file=sys.stderr)
        return 2
    if total == 0:
        print("grader grade: no submissions found", file=sys.stderr)
        return 2
    print(f"grading {total} submission(s), labs {', '.join(grader.labs)}, {args.jobs} at a time, "
          f"isolation: {grader.isolation} → {grader.out_dir}", file=sys.stderr)
    if grader.isolation != "bwrap":
        print("warning: bubblewrap (bwrap) is not available: submissions run with resource limits and an "
              "audit hook but without a private file system; install bubblewrap for full isolation",
              file=sys.stderr)
    if warning := runner.namespaces_warning(grader.isolation):
        print(warning, file=sys.stderr)
    (grader.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
    grader.prepare()  # calibration first: the status line's estimate counts grading time alone
    progress = Progress(total, len(grader.labs))
    results = grader.run_batch([Path(p) for p in args.paths], jobs=args.jobs, on_done=progress.update,
                               on_lab=progress.lab)
    print(grader.summary)
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"not graded: {r.student}: {r.error}")
    print(f"\nwrote {grader.out_dir / 'gradebook.csv'}, {grader.out_dir / 'report.html'} and "
          f"students/<id>/{{result.json,feedback.md,results.json}}")
    if args.similarity:
        from grader.similarity import command

        print()
        return command(args.paths, grader.out_dir, grader.labs, prog="grader grade --similarity")
    return 0


def cmd_similarity(args) -> int:
    from grader.similarity import command

    return command(args.paths, args.out, _labs(args.labs), args.threshold, args.reference)


def cmd_release(args) -> int:
    from grader.release import ReleaseError, release

    notes: list[str] = []
    try:
        entries = release(args.out, force=args.force, notes=notes)
    except ReleaseError as exc:
        print(f"grader release: {exc}", file=sys.stderr)
        return 1
    print(f"wrote the student copy to {args.out}: {', '.join(entries)}")
    if notes:
        print(f"{len(notes)} file(s) in labs/ differ from the stubs that solutions/ generates; the release holds "
              "the generated stubs, and these files were left as they are:")
        print("\n".join(f"  {n}" for n in notes))
    print("checked: no solutions, hidden tests, bug catalogue or instructors' pages; no solution line in any "
          "file (its grader offers `grader check` alone)")
    return 0


def cmd_gradescope(args) -> int:
    from grader.gradescope import build_bundle

    n = build_bundle(args.out)
    print(f"wrote {args.out}: {n} files (setup.sh, run_autograder, the kit); upload it as the "
          "autograder of a Gradescope programming assignment")
    return 0


def cmd_check(args) -> int:
    from grader import check

    try:
        return check.run(args.labs, json_out=args.json)
    except ValueError as exc:
        print(f"grader check: {exc}", file=sys.stderr)
        return 2


def cmd_tolerances(args) -> int:
    from pathlib import Path

    from grader import tolerances

    def ints(value):
        return tuple(int(v) for v in value.split(",") if v.strip()) if value else ()

    kernels = tuple(k for k in args.kernels.split(",") if k) if args.kernels is not None else tolerances.KERNELS
    threads = ints(args.threads) if args.threads is not None else tolerances.THREADS
    variants = [v.strip() for v in args.variants.split(",")] if args.variants else None
    if args.write and args.labs and (args.no_bugs or args.variants or args.cached_bugs_only):
        print("grader tolerances: --write with --labs replaces those labs' rows whole: measure their whole "
              "panel and their bugs (no --no-bugs, --variants or --cached-bugs-only)", file=sys.stderr)
        return 2
    live = args.live and tolerances.catalogue.torch_installed()
    if args.live and not live:
        print("grader tolerances: torch is not installed: the live tests are left out", file=sys.stderr)
    try:
        cert = tolerances.run(_labs(args.labs), variants, kernels, threads, live=live, bugs=not args.no_bugs,
                              log=lambda m: print(m, file=sys.stderr), jobs=args.jobs,
                              cache=Path(args.cache) if args.cache else None, bug_labs=_labs(args.bug_labs),
                              cached_bugs_only=args.cached_bugs_only)
    except ValueError as exc:
        print(f"grader tolerances: {exc}", file=sys.stderr)
        return 2
    print(tolerances.render_markdown(cert.to_json()))
    if args.write:
        tolerances.write_reports(cert, merge=bool(args.labs))
        print(f"wrote {tolerances.REPORT_MD.relative_to(KIT_ROOT)} and {tolerances.REPORT_JSON.relative_to(KIT_ROOT)}",
              file=sys.stderr)
    for key in cert.broken:
        print(f"NOT CERTIFIED ({cert.rows[key]['status']}): {key}")
    return 1 if cert.broken else 0


def build_parser() -> argparse.ArgumentParser:
    full_kit = (KIT_ROOT / "solutions").is_dir()  # a student's copy offers `check` alone
    p = argparse.ArgumentParser(prog="grader", description="Instructor tools for the NumPy GPT lab kit." if full_kit
                                else "Check your labs as the grader will run them.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("check", help="run labs as the grader will (its sandbox, limits and review notes), "
                                     "before handing them in")
    s.add_argument("labs", nargs="*", help="labs to check, e.g. labs/03_layernorm_ffn or 03 (default: all)")
    s.add_argument("--json", metavar="FILE", help="also write the result, per test, as JSON (as `grader grade` does)")
    s.set_defaults(func=cmd_check)
    if not full_kit:
        return p

    s = sub.add_parser("stubs", help="regenerate labs/*/src from solutions/ (the single source of truth)")
    s.add_argument("--check", action="store_true", help="only report stubs that are out of date (exit 1 if any)")
    s.set_defaults(func=cmd_stubs)

    s = sub.add_parser("fixtures", help="regenerate tests/*/fixtures/*.npz from the solutions (and HuggingFace)")
    s.add_argument("--check", action="store_true", help="only report fixtures that would change (exit 1 if any)")
    s.add_argument("--noise", action="store_true",
                   help="rebuild every fixture under other OpenBLAS kernels, thread counts and float64, and report "
                        "how far each array lands from the stored one, as a share of the staleness bound")
    s.add_argument("--write", action="store_true", help="with --noise: store the measurement in docs/fixture_noise.json")
    s.add_argument("--variants", help="with --noise: only these variants (reference, float64, kernel-…, threads-…); "
                                      "--write then keeps the other variants' measurements")
    _labs_option(s, "whose fixtures to build")
    s.set_defaults(func=cmd_fixtures)

    s = sub.add_parser("catalogue", help="run the lab tests against every catalogued student bug")
    _labs_option(s, "to check")
    s.add_argument("--jobs", type=int, default=2, help="bugs checked in parallel (default 2)")
    s.add_argument("--no-live", action="store_true",
                   help="leave out the live PyTorch/HuggingFace tests (-m 'labNN and not torch'), as a student without torch runs")
    s.set_defaults(func=cmd_catalogue)

    s = sub.add_parser("grade", help="grade submissions: a kit copy (folder or .zip) or a folder of them")
    s.add_argument("paths", nargs="+", help="submission(s), or folder(s) holding one per student")
    s.add_argument("-o", "--out", default="grading", help="output folder (default: ./grading)")
    s.add_argument("-j", "--jobs", type=int, default=2, help="submissions graded in parallel (default 2)")
    _labs_option(s, "to grade")
    s.add_argument("--force", action="store_true", help="regrade students who already have a current result")
    s.add_argument("--timeout", type=float, default=1800,
                   help="wall-clock seconds per submission, a backstop for code that waits (default 1800)")
    s.add_argument("--lab-timeout", type=float, default=120,
                   help="CPU seconds per lab, its lab code's and its tests', as the kernel counts them: "
                        "the same verdict on an idle or a busy machine (default 120)")
    s.add_argument("--test-timeout", type=float, default=10, help="CPU seconds of lab code per test, as the kernel counts them: the same verdict on an idle or a busy machine (default 10)")
    s.add_argument("--memory", type=int, default=2048, help="address-space limit in MB (default 2048)")
    s.add_argument("--similarity", action="store_true",
                   help="then run `grader similarity` on the same submissions into the same folder")
    s.set_defaults(func=cmd_grade)

    s = sub.add_parser("similarity", help="rank pairs of students by how much of their own code they share "
                       "(starter code subtracted): evidence to look at, never a verdict")
    s.add_argument("paths", nargs="+", help="submissions as for `grade`, or the output folder of a grading")
    s.add_argument("-o", "--out", help="output folder (default: the grading folder given as PATH, else ./grading, "
                   "where `grade` writes; a gradebook there gets a `similarity` column)")
    _labs_option(s, "to compare")
    s.add_argument("--threshold", help="flag pairs scoring at least this: 0.6 for every lab, or 0.6,05=0.9 "
                   "(default: grader/similarity.toml, per lab)")
    s.add_argument("--reference", metavar="DIR",
                   help="earlier years' submissions: compared with this class, not among themselves")
    s.set_defaults(func=cmd_similarity)

    s = sub.add_parser("release", help="write the student copy (stubs, public tests, docs) to OUT")
    s.add_argument("out", help="output folder (must be empty or absent)")
    s.add_argument("--force", action="store_true", help="replace OUT if it is not empty")
    s.set_defaults(func=cmd_release)

    s = sub.add_parser("gradescope", help="write a Gradescope autograder bundle (.zip)")
    s.add_argument("out", help="the bundle to write, e.g. autograder.zip")
    s.set_defaults(func=cmd_gradescope)

    s = sub.add_parser("validate", help="check the whole kit: stubs, fixtures, solutions, bug catalogue")
    _labs_option(s, "to check")
    s.add_argument("--jobs", type=int, default=2, help="parallel jobs (default 2)")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("tolerances", help="measure every test tolerance against correct variants and the "
                                          "catalogued bugs, and certify its margins (docs/tolerances.md)")
    _labs_option(s, "to measure")
    s.add_argument("--variants", help="comma-separated correct variants (ids or prefixes, e.g. reference,float64,"
                                      "kernel; default: all)")
    s.add_argument("--kernels", help="comma-separated OPENBLAS_CORETYPE names to try (default: "
                                     "Haswell,SkylakeX,Zen,Sandybridge,Nehalem,Prescott; '' for none)")
    s.add_argument("--threads", help="comma-separated OPENBLAS_NUM_THREADS values (default 1,2,7,16; '' for none)")
    s.add_argument("--live", action="store_true", help="include the live PyTorch/HuggingFace tests (torch installed)")
    s.add_argument("--no-bugs", action="store_true", help="measure the correct variants only")
    s.add_argument("--bug-labs", help="comma-separated labs whose catalogued bugs to run (default: those of --labs)")
    s.add_argument("--jobs", type=int, default=1, help="bugs run in parallel (default 1)")
    s.add_argument("--cache", metavar="DIR", help="keep each run's records in DIR and reuse them: a long panel "
                                                  "can run in parts")
    s.add_argument("--cached-bugs-only", action="store_true", help="use only the bug runs kept in --cache (a panel "
                                                                   "run in parts); the others are reported as not run")
    s.add_argument("--write", action="store_true", help="write docs/tolerances.md (below its prose) and "
                                                        "docs/tolerances.json; with --labs, those labs' rows "
                                                        "replace theirs and the other labs' stay")
    s.set_defaults(func=cmd_tolerances)
    return p


def main(argv: list[str] | None = None) -> int:
    from grader.sandbox.runtime import SandboxRefused

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SandboxRefused as exc:  # one line: why the grader will not run lab code here
        print(f"grader: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
