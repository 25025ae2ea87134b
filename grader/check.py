"""``grader check [LAB …]``: a student's labs run as the grader will run them, before they
are handed in.

It grades the copy it runs in (``labs/NN_name/src``) with ``grader grade``'s own machinery:
the same sandbox (bubblewrap where it is installed, else resource limits and the audit
hook), the same time and memory limits, the same tests, and the static review's notes.
As in ``grade``, every lab runs on the student's own earlier labs and every file in its
``src/`` is taken; a student's copy holds only the public tests, and the instructor's
grader also runs hidden tests.
Nothing here changes a grade: it shows what the grader will see.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gptkit.testing.layout import KIT_ROOT, LAB_DIR_RE, lab_dirs

CACHE = ".grader-check"  # in the copy's root: the sandbox's copy of the kit, kept between runs


def lab_names(targets: list[str], root: Path = KIT_ROOT) -> list[str]:
    """``labs/03_layernorm_ffn``, ``03_layernorm_ffn``, ``03``, ``lab03`` or ``3`` → lab names."""
    known = [lab.name for lab in lab_dirs(root / "labs")]
    out = []
    for t in targets:
        name = Path(t.rstrip("/\\")).name
        m = re.fullmatch(r"(?:lab)?(\d{1,2})", name)
        number = m.group(1).zfill(2) if m else name[:2] if LAB_DIR_RE.match(name) else None
        found = [k for k in known if number and k[:2] == number]
        if not found:
            raise ValueError(f"no lab matches {t!r}; labs are {', '.join(known)}")
        out += [k for k in found if k not in out]
    return out


def render(result, *, isolation: str, hidden: bool) -> str:
    from grader.outputs import REVIEW, first_line, is_review, pts

    lines = []
    for lab, lr in result.labs.items():
        passed = sum(t.outcome == "passed" for t in lr.tests)
        lines.append(f"{lab}: {passed} of {len(lr.tests)} tests passed ({pts(lr.points)} / {pts(lr.max_points)} points)")
        failed = [t for t in lr.tests if t.outcome != "passed"]
        if failed and all(t.outcome == "not run" for t in lr.tests) and len({t.message for t in failed}) == 1:
            lines.append(f"  none ran: {first_line(failed[0].message, 200)}")  # e.g. not handed in: said once
            failed = []
        for t in failed[:8]:
            name = "a hidden test" if t.hidden else t.nodeid.split("::")[-1]
            lines.append(f"  ✗ {name}: {first_line(t.message, 200) or t.outcome}")
        if len(failed) > 8:
            lines.append(f"  … and {len(failed) - 8} more")
        for f in lr.flags:
            if not is_review(f):
                lines.append(f"  note: {f}")
        review = [f.removeprefix(REVIEW) for f in lr.flags if is_review(f)]
        if review:
            lines.append("  for your instructor's review (it changes no score):")
            lines += [f"    {f}" for f in review]
    lines += [f"note: {f}" for f in result.flags]
    lines.append("")
    lines.append(f"Ran in the grader's sandbox ({isolation} isolation), with its time and memory limits. Scores come "
                 "from the tests alone" + ("." if hidden else "; the grader also runs hidden tests, which this copy "
                                           "does not hold."))
    if isolation != "bwrap":
        lines.append("bubblewrap is not installed here: the grader's own machine may refuse more than this one did.")
    lines.append(points_line(result))
    return "\n".join(lines)


def points_line(result) -> str:
    """The last line: each lab's points and the total, as ``grader grade`` gives them."""
    from grader.outputs import pts

    labs = ", ".join(f"{lab[:2]} {pts(lr.points)}/{pts(lr.max_points)}" for lab, lr in result.labs.items())
    return f"points: {labs}; total {pts(result.total)} / {pts(result.max_total)}"



def run(targets: list[str], *, out_dir: Path | None = None, echo=print, json_out: str | None = None) -> int:
    """Check the labs named in ``targets`` (all labs when empty); 0 when every test passed.
    ``json_out``: also write the result there, in ``result.json``'s form."""
    from grader.grade import Grader

    labs = lab_names(targets) if targets else None
    grader = Grader(out_dir or KIT_ROOT / CACHE, labs, log=lambda m: None)
    (grader.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
    echo(f"checking {', '.join(grader.labs)} as the grader runs them …")
    grader.prepare()
    result = grader.grade("you", KIT_ROOT)
    echo(render(result, isolation=grader.isolation, hidden=grader.reference))
    if json_out:
        Path(json_out).write_text(json.dumps(result.to_json(), indent=1), encoding="utf-8")
    ok = not result.error and all(t.outcome == "passed" for lr in result.labs.values() for t in lr.tests)
    return 0 if ok else 1
