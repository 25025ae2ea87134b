"""What grading produces: per student (result.json, feedback.md, Gradescope results.json)
and per class (gradebook.csv, stats.json, report.html, a printed summary)."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from collections import Counter
from pathlib import Path

from grader.grade import RESULT_FILE, StudentResult, write_atomic


def pts(x: float) -> str:
    """Points as people write them: 8.21, 10, 0.5."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _short(nodeid: str) -> str:
    return nodeid.split("/")[-1]


# Characters no output passes on as they are: control characters (in a terminal an escape
# sequence moves the cursor over the scores, sets the window's title or writes the
# clipboard) and invisible formatting (a bidi override shows text in another order than it
# is). A message is lab code's to word (an exception it raises), so each is shown by its
# code point instead.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                     "\u2066-\u206f\ufeff\ufff9-\ufffb]")


def visible(text: str) -> str:
    """``text`` with every control or invisible formatting character written as its code."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def markdown_inline(text: str) -> str:
    """``text`` (one line) for a markdown page, read as it is written: no tag (``<`` before a
    letter, ``/``, ``!`` or ``?`` is written ``&lt;``) and no link or image (``](`` is
    escaped), so a message cannot load an image or hide a link in the page."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", visible(text)).replace("](", "]\\(")


def first_line(message: str, limit: int = 300) -> str:
    """The first non-blank line of ``message``, at most ``limit`` characters, with no
    control or invisible formatting character (``visible``)."""
    line = next((visible(ln.strip()) for ln in message.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def hidden_names(r: StudentResult) -> dict[str, str]:
    """Hidden tests are shown as 'hidden test k' of their lab: no names, and as their
    message only what the grader put there (the test's concept line, or why it did not run)."""
    names = {}
    for lab, lr in r.labs.items():
        k = 0
        for t in lr.tests:
            if t.hidden:
                k += 1
                names[t.nodeid] = f"{lab} · hidden test {k}"
    return names


def feedback_markdown(r: StudentResult) -> str:
    md = markdown_inline
    out = [f"# Feedback for {md(r.student)}", ""]
    if r.error:
        out += [f"**This submission could not be graded:** {md(r.error)}", ""]
    out += [f"**Total: {pts(r.total)} / {pts(r.max_total)}**", ""]
    if r.flags:
        out += ["Notes:", *[f"- {md(f)}" for f in r.flags], ""]
    hidden = hidden_names(r)
    for lab, lr in r.labs.items():
        out += [f"## {lab}: {pts(lr.points)} / {pts(lr.max_points)}", ""]
        out += [f"- note: {md(f)}" for f in lr.flags if not is_review(f)]
        review = [md(f.removeprefix(REVIEW)) for f in lr.flags if is_review(f)]
        if review:
            out.append("- note: the grader's static review listed these lines for your instructor to read; "
                       "they change no score:")
            out += [f"  - {f}" for f in review]
        failed = [t for t in lr.tests if t.outcome != "passed"]
        passed = len(lr.tests) - len(failed)
        if _never_ran(lr) and len({t.message for t in lr.tests}) == 1:  # e.g. not handed in: said once
            out += [f"None of its {len(lr.tests)} tests ran: {md(first_line(lr.tests[0].message, 600))}.", ""]
            continue
        out.append(f"{passed} of {len(lr.tests)} tests passed.")
        if failed:
            out.append("")
        # Tests that failed for the same reason are listed together, the reason once.
        groups: dict[str, list[str]] = {}
        for t in failed:
            if t.hidden:
                groups.setdefault(first_line(t.message, 600) or "(hidden: no details)", []).append(hidden[t.nodeid])
            else:
                reason = first_line(t.message, 600) or t.outcome
                groups.setdefault(reason, []).append(f"`{_short(t.nodeid).split('::')[-1]}`")
        for reason, names in groups.items():
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            out.append(f"- {shown}: {md(reason)}")
        out.append("")
    return "\n".join(out)


def gradescope_json(r: StudentResult) -> dict:
    """Gradescope's autograder results schema."""
    hidden = hidden_names(r)
    tests = []
    for lab, lr in r.labs.items():
        for t in lr.tests:
            entry = {"name": hidden.get(t.nodeid, _short(t.nodeid)), "score": round(t.points, 4),
                     "max_score": round(t.max_points, 4), "status": "passed" if t.outcome == "passed" else "failed"}
            if t.hidden:
                entry["visibility"] = "after_published"
                if t.outcome != "passed" and t.message:
                    entry["output"] = first_line(t.message, 300)
            else:
                entry["visibility"] = "visible"
                if t.outcome != "passed":
                    entry["output"] = first_line(t.message, 1500)
            tests.append(entry)
    out = {"score": round(r.total, 4), "tests": tests, "visibility": "visible",
           "stdout_visibility": "hidden"}
    notes = [visible(n) for n in ([f"Could not be graded: {r.error}"] if r.error else []) + r.flags + [
        f for lr in r.labs.values() for f in lr.flags]]
    out["output"] = "\n".join([*(f"{lab}: {pts(lr.points)} / {pts(lr.max_points)}{_not_run(lr)}"
                                 for lab, lr in r.labs.items()), *notes])
    return out


REVIEW = "for review: "


def is_review(flag: str) -> bool:
    """A note of the static review (grader/policy.py): for a person to read, never a verdict."""
    return flag.startswith(REVIEW)


def _never_ran(lr) -> bool:
    return bool(lr.tests) and all(t.outcome == "not run" for t in lr.tests)


def _not_run(lr) -> str:
    """Why a lab did not run at all (not handed in, say), or ""."""
    return f" ({first_line(lr.tests[0].message, 300)})" if _never_ran(lr) else ""


def write_student(grader, r: StudentResult) -> None:
    d = grader.student_dir(r.student)
    write_atomic(d / "feedback.md", feedback_markdown(r))
    write_atomic(d / "results.json", json.dumps(gradescope_json(r), indent=1))
    write_atomic(d / RESULT_FILE, json.dumps(r.to_json(), indent=1))  # last: it marks the student done


def all_flags(r: StudentResult) -> list[str]:
    return r.flags + [f"{lab}: {f}" for lab, lr in r.labs.items() for f in lr.flags]


def brief_flags(r: StudentResult) -> list[str]:
    """The flags with each lab's review notes counted, not spelled out (the report lists them
    in their own section)."""
    out = list(r.flags)
    for lab, lr in r.labs.items():
        out += [f"{lab}: {f}" for f in lr.flags if not is_review(f)]
        n = sum(map(is_review, lr.flags))
        if n:
            out.append(f"{lab}: {n} line{'s' if n != 1 else ''} for review")
    return out


def gradebook_csv(labs: list[str], results: list[StudentResult]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["student", *labs, "total", "max", "flags"])
    for r in results:
        w.writerow([r.student, *[pts(r.labs[lab].points) if lab in r.labs else "" for lab in labs],
                    pts(r.total), pts(r.max_total), " | ".join(all_flags(r))])
    return buf.getvalue()


# A number that varies from student to student; a tolerance (atol=1e-05) is the test's own
# and stays, so that a grouped message still reads as the test wrote it.
_FLOAT = re.compile(r"(?<!tol=)(?<![\w.])(?:-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+e[-+]?\d+)")
_DIFFER = re.compile(r"^(?P<what>.*?): (?:Your result matches .+?\. )?\d+ of \d+ (?:elements|values) ")
_MATCHES = re.compile(r"Your result matches (.+?)(?:\.\s|\.?$)", re.S)  # up to the sentence's end


def failure_kind(message: str) -> str:
    """A failure message reduced to its concept, so one mistake made by many students
    counts as one kind: "attention weights: wrong values (matches … no 1/√d scaling)"."""
    line = re.sub(r"^(AssertionError|Failed): ", "", first_line(message, 400))
    m = _DIFFER.match(line)
    if m:
        kind = f"{m.group('what')}: wrong values"
        diag = _MATCHES.search(message)
        return kind + (f" (matches {diag.group(1)})" if diag else "")
    return _FLOAT.sub("…", line)[:160]


def class_stats(labs: list[str], results: list[StudentResult]) -> dict:
    graded = [r for r in results if not r.error]
    stats = {"students": len(results), "graded": len(graded), "labs": {}}
    for lab in labs:
        tests: dict[str, dict] = {}
        # A lab that did not run (not handed in, say) says nothing about the
        # concepts: pass rates and failure kinds count only the students whose lab ran.
        ran = [r for r in graded if lab in r.labs and not _never_ran(r.labs[lab])]
        for r in ran:
            lr = r.labs[lab]
            for t in lr.tests:
                s = tests.setdefault(t.nodeid, {"passed": 0, "total": 0, "hidden": t.hidden, "failures": Counter()})
                s["total"] += 1
                if t.outcome == "passed":
                    s["passed"] += 1
                else:
                    s["failures"][failure_kind(t.message) or t.outcome] += 1
        lab_points = [r.labs[lab].points / r.labs[lab].max_points for r in graded
                      if lab in r.labs and r.labs[lab].max_points]
        lab_fail = Counter()  # how many students hit each kind of failure
        for r in ran:
            lab_fail.update({failure_kind(t.message) or t.outcome
                             for t in r.labs[lab].tests if t.outcome != "passed" and not t.hidden})
        stats["labs"][lab] = {
            "ran": len(ran),
            "not_run": sum(1 for r in graded if lab in r.labs) - len(ran),
            "mean_fraction": sum(lab_points) / len(lab_points) if lab_points else 0.0,
            "full_marks": sum(1 for x in lab_points if x >= 0.9999),
            "common_failures": lab_fail.most_common(5),
            "tests": {k: {"pass_rate": v["passed"] / v["total"] if v["total"] else 0.0, "hidden": v["hidden"],
                          "common_failures": v["failures"].most_common(3)} for k, v in tests.items()},
        }
    return stats


def summary_table(labs: list[str], results: list[StudentResult], stats: dict) -> str:
    w = max([7, *[len(r.student) for r in results]])
    head = f"{'student':<{w}}  " + "  ".join(f"{lab[:2]:>6}" for lab in labs) + f"  {'total':>7}  flags"
    lines = [head, "-" * len(head)]
    for r in results:
        cells = "  ".join(f"{r.labs[lab].points:>6.1f}" if lab in r.labs else f"{'':>6}" for lab in labs)
        flags = brief_flags(r)
        flag = (visible(flags[0])[:60] + (f" (+{len(flags) - 1})" if len(flags) > 1 else "")) if flags else ""
        lines.append(f"{visible(r.student):<{w}}  {cells}  {r.total:>7.1f}  {flag}")
    lines.append("-" * len(head))
    lines.append(f"{'mean %':<{w}}  " + "  ".join(f"{100 * stats['labs'][lab]['mean_fraction']:>6.0f}" for lab in labs))
    for lab in labs:
        s = stats["labs"][lab]
        hardest = sorted(s["tests"].items(), key=lambda kv: kv[1]["pass_rate"])[:3]
        parts = [f"{('a hidden test' if v['hidden'] else _short(k).split('::')[-1])} {100 * v['pass_rate']:.0f}%"
                 for k, v in hardest]
        ran = f"ran for {s['ran']} of {s['ran'] + s['not_run']} students"
        lines.append(f"{lab} ({ran}): hardest tests, with the share of those students who passed each: "
                     f"{', '.join(parts)}" if parts else f"{lab} ({ran})")
        if s["common_failures"]:
            msg, n = s["common_failures"][0]
            lines.append(f"    most common failure ({n} student{'s' if n != 1 else ''}): {msg}")
    return "\n".join(lines)


def report_html(labs: list[str], results: list[StudentResult], stats: dict) -> str:
    """A self-contained page: a bar chart of lab pass rates, the hardest tests, the most
    common failures. No scripts, no external files: open it anywhere."""
    e = html.escape
    bar_w, gap, chart_h = 70, 24, 200
    bars = []
    for i, lab in enumerate(labs):
        frac = stats["labs"][lab]["mean_fraction"]
        h = max(1, int(chart_h * frac))
        x = 40 + i * (bar_w + gap)
        bars.append(f'<rect x="{x}" y="{20 + chart_h - h}" width="{bar_w}" height="{h}" fill="#3b82f6">'
                    f'<title>{e(lab)}: {100 * frac:.0f}%</title></rect>'
                    f'<text x="{x + bar_w / 2}" y="{14 + chart_h - h}" text-anchor="middle" font-size="12">{100 * frac:.0f}%</text>'
                    f'<text x="{x + bar_w / 2}" y="{chart_h + 38}" text-anchor="middle" font-size="11">{e(lab[:14])}</text>')
    width = 60 + len(labs) * (bar_w + gap)
    svg = (f'<svg role="img" aria-label="mean score per lab" width="{width}" height="{chart_h + 50}" '
           f'xmlns="http://www.w3.org/2000/svg"><line x1="36" y1="{20 + chart_h}" x2="{width}" y2="{20 + chart_h}" '
           f'stroke="#999"/>{"".join(bars)}</svg>')
    sections = []
    for lab in labs:
        s = stats["labs"][lab]
        rows = []
        for nodeid, t in sorted(s["tests"].items(), key=lambda kv: kv[1]["pass_rate"]):
            name = "(hidden test)" if t["hidden"] else _short(nodeid)
            fails = "<br>".join(f"{n}× {e(m)}" for m, n in t["common_failures"])
            pct = 100 * t["pass_rate"]
            rows.append(f'<tr><td><code>{e(name)}</code></td><td class="num"><div class="bar" '
                        f'style="width:{pct:.0f}px"></div> {pct:.0f}%</td><td>{fails}</td></tr>')
        sections.append(f"<h2>{e(lab)}</h2><p>mean {100 * s['mean_fraction']:.0f}% · {s['full_marks']} of "
                        f"{stats['graded']} with full marks · ran for {s['ran']} (pass rates below are theirs), "
                        f"not run for {s['not_run']} (not handed in, or stopped before any result)</p><table><tr><th>test</th><th>pass rate</th>"
                        f"<th>most common failures</th></tr>{''.join(rows)}</table>")
    students = "".join(
        f"<tr><td>{e(r.student)}</td>{''.join(f'<td class=num>{pts(r.labs[lab].points)}</td>' if lab in r.labs else '<td></td>' for lab in labs)}"
        f"<td class=num><b>{pts(r.total)}</b> / {pts(r.max_total)}</td><td>{e(' | '.join(brief_flags(r)))}</td></tr>"
        for r in results)
    review = "".join(f"<tr><td>{e(r.student)}</td><td>{e(lab)}</td><td><code>{e(f.removeprefix(REVIEW))}</code></td></tr>"
                     for r in results for lab, lr in r.labs.items() for f in lr.flags if is_review(f))
    review_section = ("<h2>For review</h2><p>Lines the grader's static review lists for a person to read: "
                      "code that reaches into the interpreter, the machine or the kit's files. They change no "
                      "score (scores come from the tests alone) and are not a verdict.</p>"
                      f"<table><tr><th>student</th><th>lab</th><th>line</th></tr>{review}</table>") if review else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Class report</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top;font-size:14px}}
.num{{text-align:right;white-space:nowrap}}.bar{{display:inline-block;height:10px;background:#3b82f6}}</style></head>
<body><h1>Class report</h1><p>{stats['graded']} of {stats['students']} submissions graded.</p>
<h2>Mean score per lab</h2>{svg}
{''.join(sections)}
<h2>Students</h2><table><tr><th>student</th>{''.join(f'<th>{e(lab[:2])}</th>' for lab in labs)}<th>total</th><th>flags</th></tr>{students}</table>
{review_section}
</body></html>
"""


def write_class(grader, results: list[StudentResult]) -> None:
    labs = grader.labs
    stats = class_stats(labs, results)
    write_atomic(grader.out_dir / "gradebook.csv", gradebook_csv(labs, results))
    write_atomic(grader.out_dir / "stats.json", json.dumps(stats, indent=1, default=list))
    write_atomic(grader.out_dir / "report.html", report_html(labs, results, stats))
    grader.summary = summary_table(labs, results, stats)
