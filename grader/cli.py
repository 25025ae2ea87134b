"""``uv run grader <command>``: the instructor's entry point."""

from __future__ import annotations

import argparse
import sys

from gptkit.testing.layout import KIT_ROOT


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


def cmd_catalogue(args) -> int:
    from grader import catalogue

    bugs = catalogue.load_catalogue(labs=_labs(args.labs))
    results = catalogue.check_catalogue(bugs, jobs=args.jobs)
    for r in results:
        print(catalogue.describe(r))
    bad = [r for r in results if not r.ok]
    print(f"{len(results) - len(bad)} of {len(results)} bugs caught and explained")
    return 1 if bad else 0


def cmd_validate(args) -> int:
    from grader import validate

    sections = validate.run(jobs=args.jobs, labs=_labs(args.labs))
    print(validate.render(sections))
    ok = all(s.ok for s in sections)
    print("the kit is valid" if ok else "the kit is NOT valid: see FAIL above")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grader", description="Instructor tools for the NumPy GPT lab kit.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("stubs", help="regenerate labs/*/src from solutions/ (the single source of truth)")
    s.add_argument("--check", action="store_true", help="only report stubs that are out of date (exit 1 if any)")
    s.set_defaults(func=cmd_stubs)

    s = sub.add_parser("fixtures", help="regenerate tests/*/fixtures/*.npz from the solutions (and HuggingFace)")
    s.add_argument("--check", action="store_true", help="only report fixtures that would change (exit 1 if any)")
    s.add_argument("--labs", help="comma-separated lab numbers, e.g. 01,03 (default: all)")
    s.set_defaults(func=cmd_fixtures)

    s = sub.add_parser("catalogue", help="run the lab tests against every catalogued student bug")
    s.add_argument("--labs", help="comma-separated lab numbers (default: all)")
    s.add_argument("--jobs", type=int, default=2, help="bugs checked in parallel (default 2)")
    s.set_defaults(func=cmd_catalogue)

    s = sub.add_parser("validate", help="check the whole kit: stubs, fixtures, solutions, bug catalogue")
    s.add_argument("--labs", help="comma-separated lab numbers (default: all)")
    s.add_argument("--jobs", type=int, default=2, help="parallel jobs (default 2)")
    s.set_defaults(func=cmd_validate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
