"""``grader similarity``: which pairs of students share unusually much of their own code.

Per lab, each student's lab files (read exactly as ``grader grade`` reads them) are one
document. The document is tokenized the way copydetect's filter does it (names become V,
strings S; comments, spacing and blank lines vanish), so renaming and reformatting do not
hide a copy; copydetect (the winnowing algorithm MOSS uses) fingerprints it, and every
fingerprint that also occurs in the lab's starter code — the stub, the given code around
each ``# YOUR CODE HERE`` — or in the reference solution is dropped as boilerplate: only
what each student wrote is compared. Two untouched stubs share nothing and score 0.

A pair's score is copydetect's: the larger of the two fractions of a student's own code
that the other shares. A pair is flagged when its score reaches the lab's threshold
(grader/similarity.toml) and the shared passages span at least ``MIN_LINES`` lines of
their own code: a few identical one-liners are not a pattern. A flag is evidence for a
person to look at, never a verdict; it changes no score. docs/similarity.md has the
measurements behind the numbers.
"""

from __future__ import annotations

import builtins
import io
import json
import keyword
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from gptkit.testing.layout import KIT_ROOT, lab_dirs
from grader.submission import SubmissionError, discover, expected_files, read_submission, unique_ids

NOISE = 25  # copydetect's k: the shortest match that counts, in tokenized characters
GUARANTEE = 30  # every match at least this long is found (window = GUARANTEE - NOISE + 1)
MIN_LINES = 6  # a pair shares at least this many lines of the students' own code to be flagged
SETTINGS = Path(__file__).with_name("similarity.toml")
WORDING = ("Similarity is evidence for a person to look at, never a verdict: students who follow "
           "the same specification write alike, and a high score can have an innocent reason. "
           "It changes no score.")


class SimilarityError(ValueError):
    """The check cannot run at all (one line, shown to the instructor)."""


NO_COPYDETECT = ("the similarity check needs copydetect, in the kit's `similarity` extra: "
                 "`uv sync --extra similarity` (with `--extra torch` too if you use it)")


def _copydetect():
    """copydetect's CodeFingerprint (winnowed fingerprints of one document)."""
    os.environ.setdefault("MPLBACKEND", "Agg")  # copydetect imports pyplot; no display here
    try:
        from copydetect import CodeFingerprint
    except ImportError:
        raise SimilarityError(NO_COPYDETECT) from None
    return CodeFingerprint


def missing() -> str:
    """Why the check cannot run here ("" when it can), before any work is done."""
    import importlib.util

    return "" if importlib.util.find_spec("copydetect") else NO_COPYDETECT


def thresholds(labs: list[str], override: dict[str, float] | float | None = None) -> dict[str, float]:
    """lab → the score at which a pair is flagged: similarity.toml's default, its per-lab
    entries, then ``override`` (one number for every lab, or lab number/name → number)."""
    data = tomllib.loads(SETTINGS.read_text(encoding="utf-8"))
    default = float(data.get("defaults", {}).get("threshold", 0.5))
    per_lab = data.get("labs", {})
    out = {lab: float(per_lab.get(lab, {}).get("threshold", default)) for lab in labs}
    if isinstance(override, (int, float)):
        return {lab: float(override) for lab in labs}
    for key, value in (override or {}).items():
        hit = [lab for lab in labs if lab == key or lab[:2] == key.zfill(2)]
        if not hit:
            raise SimilarityError(f"--threshold {key}={value}: no lab {key} among {', '.join(labs)}")
        for lab in hit:
            out[lab] = float(value)
    return out


def parse_threshold(text: str | None) -> dict[str, float] | float | None:
    """``0.6`` (every lab) or ``0.6,05=0.9`` (a default, then per-lab values)."""
    if not text:
        return None
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, _, value = part.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise SimilarityError(f"--threshold: {part!r} is not a number (e.g. 0.6 or 05=0.9)") from None
        if not 0 < number <= 1:
            raise SimilarityError(f"--threshold: {number} is outside (0, 1]")
        out[key or "*"] = number
    return out


# -- what is compared -----------------------------------------------------------------------
def lab_text(files: dict[str, bytes], modules: list[str], lab: str) -> str:
    """A student's lab as one document: the lab's modules in a fixed order, then the
    student's own helper modules, each under its path (``files``: path under src/ → bytes)."""
    order = [f"{m}.py" for m in modules if f"{m}.py" in files]
    order += sorted(rel for rel in files if rel.endswith(".py") and rel not in order)
    parts = []
    for rel in order:
        text = files[rel].decode("utf-8", "replace").replace("\r\n", "\n")
        parts.append(f"# labs/{lab}/src/{rel}\n{text.rstrip()}\n")
    return "\n".join(parts)


def boilerplate_texts(lab: str) -> list[str]:
    """What every student of ``lab`` is given or is meant to reproduce: its stubs (the given
    code around each ``# YOUR CODE HERE``) and the reference solution."""
    texts = []
    for root in (KIT_ROOT / "labs" / lab / "src", KIT_ROOT / "solutions" / lab):
        texts += [p.read_text(encoding="utf-8") for p in sorted(root.glob("*.py")) if not p.name.startswith("_")]
    return texts


@dataclass
class Document:
    student: str
    lab: str
    text: str
    reference: bool = False  # from --reference: compared with the class, not among themselves
    fingerprint: object = None  # copydetect's CodeFingerprint of the tokenized text
    hashes: object = None  # its fingerprints and their positions in the tokenized text, in order
    positions: object = None
    first: object = None  # tokenized character i stands for text[first[i]:last[i]]
    last: object = None
    line_starts: object = None
    own_before: object = None  # own lines (not blank, not a line of the starter code) before each line


@dataclass
class Pair:
    lab: str
    a: str
    b: str
    score: float  # max(score_a, score_b)
    score_a: float  # the fraction of a's own code that b shares
    score_b: float
    lines: int  # lines of the students' own code in shared passages (the smaller side)
    flagged: bool = False
    reference: bool = False  # b is from an earlier year (--reference)
    slices_a: list[tuple[int, int]] = field(default_factory=list)  # character ranges in a's text
    slices_b: list[tuple[int, int]] = field(default_factory=list)

    def summary(self) -> dict:
        return {"lab": self.lab, "a": self.a, "b": self.b, "score": round(self.score, 3),
                "score_a": round(self.score_a, 3), "score_b": round(self.score_b, 3), "lines": self.lines,
                "flagged": self.flagged, "reference": self.reference}


@dataclass
class Check:
    labs: list[str]
    thresholds: dict[str, float]
    students: list[str]
    docs: dict[str, dict[str, Document]] = field(default_factory=dict)  # lab → student → document
    refs: dict[str, dict[str, Document]] = field(default_factory=dict)  # lab → reference id → document
    pairs: dict[str, list[Pair]] = field(default_factory=dict)  # lab → pairs, highest score first
    problems: list[str] = field(default_factory=list)  # "student: why it was left out"

    def flagged(self) -> list[Pair]:
        return [p for lab in self.labs for p in self.pairs.get(lab, []) if p.flagged]

    def text(self, p: Pair, side: str) -> str:
        return (self.docs[p.lab][p.a] if side == "a" else
                (self.refs if p.reference else self.docs)[p.lab][p.b]).text


# -- inputs --------------------------------------------------------------------------------
def graded_sources(out_dir: Path) -> list[tuple[str, Path]] | None:
    """The submissions a finished grading read (each student's result.json ``source``),
    or None when ``out_dir`` is not a grading's output folder."""
    results = sorted(Path(out_dir).glob("students/*/result.json"))
    if not results:
        return None
    found = []
    for f in results:
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
            found.append((str(data["student"]), Path(data["source"])))
        except (OSError, ValueError, KeyError, TypeError):
            found.append((f.parent.name, f))  # read_submission says what is wrong with it
    return found


def gather(paths: list[Path]) -> list[tuple[str, Path]]:
    """(student, submission) as ``grader grade`` finds them; a grading's output folder
    stands for the submissions it graded."""
    entries: list[tuple[str, Path]] = []
    for path in paths:
        graded = graded_sources(path) if Path(path).is_dir() else None
        entries += graded if graded is not None else discover([Path(path)])
    return unique_ids(entries)


def _documents(entries, labs, wanted, problems, reference=False) -> dict[str, dict[str, Document]]:
    docs: dict[str, dict[str, Document]] = {lab: {} for lab in labs}
    for student, path in entries:
        try:
            sub = read_submission(student, path, {lab: wanted[lab] for lab in labs})
        except SubmissionError as exc:
            problems.append(f"{'reference ' if reference else ''}{student}: left out: {exc}")
            continue
        except OSError as exc:
            who = f"{'reference ' if reference else ''}{student}"
            problems.append(f"{who}: left out: cannot read {path} ({exc.strerror})")
            continue
        for lab in labs:
            if sub.files.get(lab):
                docs[lab][student] = Document(student, lab, lab_text(sub.files[lab], wanted[lab], lab), reference)
    return docs


# -- the comparison ------------------------------------------------------------------------
_KEPT_NAMES = frozenset(dir(builtins)) | {"self", "cls"}
_KEYWORDS = frozenset(keyword.kwlist)
# One token per match, any text at all (an unclosed string or bracket is read on as
# single characters): the lexing copydetect does with Pygments, at a speed a class of
# hundreds needs (Pygments reads about 40,000 tokens a second; this, millions).
_STRING = (r"[rRbBuUfF]{0,2}(?:'{3}(?:\\.|[^\\])*?'{3}|\"{3}(?:\\.|[^\\])*?\"{3}"
           r"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")")
_TOKEN = re.compile("|".join([
    r"(?P<space>\s+)",
    r"(?P<comment>#[^\n]*)",
    f"(?P<string>{_STRING})",
    r"(?P<name>[^\W\d]\w*)",
    r"(?P<number>\d[\w.]*(?:[eE][-+]?\d+)?j?|\.\d\w*)",
    r"(?P<op>\*\*=?|//=?|->|:=|<<=?|>>=?|[<>!=]=|[-+*/%@&|^~<>=.,:;()\[\]{}]=?)",
    r"(?P<other>.)",
]), re.DOTALL)


def _pieces(text: str):
    """(piece, raw start, raw end) per token, as copydetect's filter writes them."""
    prev, importing, depth = "\n", False, 0
    for m in _TOKEN.finditer(text):
        kind, value = m.lastgroup, m.group()
        if kind == "space":
            if depth == 0 and "\n" in value:
                prev, importing = "\n", False
            continue
        if kind == "comment":
            continue
        if kind == "name":
            if value in _KEYWORDS:
                piece = value
                importing = importing or (prev in ("\n", ";") and value in ("import", "from"))
            elif prev in ("def", "class"):
                piece = "F" if prev == "def" else "O"
            elif importing or value in _KEPT_NAMES:
                piece = value
            else:
                piece = "V"
        elif kind == "string":
            piece = "S"
        else:
            piece = value
            if value in ("(", "[", "{"):
                depth += 1
            elif value in (")", "]", "}"):
                depth = max(0, depth - 1)
        prev = value
        yield piece, m.start(), m.end()


def tokenized(text: str):
    """The text as copydetect's filter writes it — every name V (F for a function being
    defined, O for a class), every string S, no comments, spacing or blank lines; keywords,
    builtins, imported modules, numbers and operators as they are — and, for each of its
    characters, the range of the raw text it stands for: (filtered, first, last)."""
    import numpy as np

    pieces = list(_pieces(text))
    if not pieces:
        return "", np.zeros(0, np.int64), np.zeros(0, np.int64)
    out = [p for p, _, _ in pieces]
    a = np.fromiter((x for _, x, _ in pieces), np.int64, len(pieces))
    b = np.fromiter((x for _, _, x in pieces), np.int64, len(pieces))
    n = np.fromiter((len(p) for p in out), np.int64, len(pieces))
    kept = np.repeat(n == b - a, n)  # written as is: character for character
    step = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    first = np.repeat(a, n) + np.where(kept, step, 0)
    last = np.where(kept, first + 1, np.repeat(b, n))
    return "".join(out), first, last


class _Codes:
    """What copydetect reads (its ``fp``): the tokenized text as a tuple of character codes.
    copydetect hashes each k-gram with ``hash()``, which Python seeds afresh in every process
    for strings but not for tuples of ints: so the fingerprints, the scores and the flags are
    the same in every run."""

    def __init__(self, text: str):
        self.codes = tuple(map(ord, text))

    def read(self):
        return self.codes


def fingerprint(doc: Document, boilerplate, given_lines: set[str], k: int = NOISE,
                window: int = GUARANTEE - NOISE + 1) -> None:
    """copydetect's fingerprint of the document (winnowed k-gram hashes of the tokenized
    text, boilerplate dropped), kept as arrays, in the order of their positions."""
    import numpy as np

    CodeFingerprint = _copydetect()
    filtered, doc.first, doc.last = tokenized(doc.text)
    fp = CodeFingerprint(f"{doc.student}.py", k, window, boilerplate, filter=False, fp=_Codes(filtered))
    doc.fingerprint = fp
    hashes = np.array([h for h, idx in fp.hash_idx.items() for _ in idx], dtype=np.int64)
    positions = np.array([i for idx in fp.hash_idx.values() for i in idx], dtype=np.int64)
    order = np.argsort(positions, kind="stable")
    doc.hashes, doc.positions = hashes[order], positions[order]
    lines = doc.text.split("\n")
    doc.line_starts = np.cumsum([0] + [len(ln) + 1 for ln in lines[:-1]])
    own = np.array([bool(ln.strip()) and ln.strip() not in given_lines for ln in lines])
    doc.own_before = np.concatenate([[0], np.cumsum(own)])  # own lines before line i


def shared(doc: Document, mask, k: int = NOISE):
    """What copydetect's ``compare_files`` reports for one side, vectorized: given which of
    the document's fingerprints the other document shares (``mask``), the tokenized
    characters they cover (the overlap), and the shared passages as raw-text offsets."""
    import numpy as np

    pos = doc.positions[mask]
    if pos.size == 0:
        return 0, pos, pos
    gaps = np.diff(pos)
    overlap = int(np.minimum(gaps, k).sum()) + k
    cut = np.flatnonzero(gaps >= k)  # copydetect starts a new passage where the gap is k or more
    starts = np.concatenate([pos[:1], pos[cut + 1]])
    ends = np.minimum(np.concatenate([pos[cut], pos[-1:]]) + k, len(doc.first))
    return overlap, doc.first[starts], doc.last[ends - 1]


def own_lines(doc: Document, starts, ends) -> int:
    """Lines of the student's own code (not blank, not a line of the starter code) that
    the passages (in order, not overlapping) touch."""
    import numpy as np

    if starts.size == 0:
        return 0
    first = np.searchsorted(doc.line_starts, starts, "right") - 1
    last = np.searchsorted(doc.line_starts, ends - 1, "right") - 1
    lo = np.maximum(first, np.concatenate([[-1], last[:-1]]) + 1)  # a line counts once
    keep = last >= lo
    return int((doc.own_before[last[keep] + 1] - doc.own_before[lo[keep]]).sum())


def boilerplate_hashes(lab: str, k: int = NOISE):
    """Every k-gram of the lab's starter code and reference solution, tokenized."""
    import numpy as np

    CodeFingerprint = _copydetect()
    hashes: set[int] = set()
    for text in boilerplate_texts(lab):
        hashes |= CodeFingerprint(f"{lab}.py", k, 1, filter=False, fp=_Codes(tokenized(text)[0])).hashes
    return np.array(sorted(hashes), dtype=np.int64)


def compare_lab(lab: str, docs: dict[str, Document], refs: dict[str, Document], threshold: float,
                k: int = NOISE, guarantee: int = GUARANTEE) -> list[Pair]:
    """Every pair of the class's documents, and each against every reference document,
    highest score first. The scores are copydetect's (``compare_files``), computed for
    all pairs at once: each fingerprint gets a number, each document a row of which it has."""
    import numpy as np

    boilerplate = boilerplate_hashes(lab, k)
    given_lines = {ln.strip() for text in boilerplate_texts(lab) for ln in text.splitlines()}
    everyone = [*docs.values(), *refs.values()]
    for d in everyone:
        fingerprint(d, boilerplate, given_lines, k, guarantee - k + 1)
    everyone = [d for d in everyone if d.hashes.size]  # an untouched stub has nothing of its own
    if not everyone:
        return []
    vocabulary = np.unique(np.concatenate([d.hashes for d in everyone]))
    has = np.zeros((len(everyone), vocabulary.size), dtype=bool)
    ids = []
    for i, d in enumerate(everyone):
        ids.append(np.searchsorted(vocabulary, d.hashes))
        has[i, ids[-1]] = True
    index = {id(d): i for i, d in enumerate(everyone)}
    class_docs = sorted((d for d in everyone if not d.reference), key=lambda d: d.student)
    ref_docs = sorted((d for d in everyone if d.reference), key=lambda d: d.student)
    pairs = []
    for n, da in enumerate(class_docs):
        ia = index[id(da)]
        for db in (*class_docs[n + 1:], *ref_docs):
            ib = index[id(db)]
            mask_a = has[ib][ids[ia]]
            if not mask_a.any():
                continue
            over_a, sa, ea = shared(da, mask_a, k)
            over_b, sb, eb = shared(db, has[ia][ids[ib]], k)
            score_a = over_a / da.fingerprint.token_coverage
            score_b = over_b / db.fingerprint.token_coverage
            score = float(max(score_a, score_b))
            lines = min(own_lines(da, sa, ea), own_lines(db, sb, eb))
            flagged = score >= threshold and lines >= MIN_LINES
            pairs.append(Pair(lab, da.student, db.student, score, float(score_a), float(score_b), lines, flagged,
                              db.reference, list(zip(sa.tolist(), ea.tolist())) if flagged else [],
                              list(zip(sb.tolist(), eb.tolist())) if flagged else []))
    pairs.sort(key=lambda p: (-p.score, -p.lines, p.a, p.b))
    return pairs


def run(paths: list[Path], labs: list[str] | None = None, *, threshold=None, reference: Path | None = None) -> Check:
    """The whole check: gather the submissions, compare each lab, rank the pairs."""
    wanted_all = expected_files()
    all_labs = list(wanted_all)
    chosen = [lab for lab in all_labs if not labs or lab in labs or lab[:2] in labs]
    if labs and not chosen:
        raise SimilarityError(f"no lab matches {', '.join(labs)}; labs are {', '.join(all_labs)}")
    over = threshold
    if isinstance(threshold, dict) and "*" in threshold:
        base = threshold["*"]
        over = {lab: base for lab in chosen} | {k: v for k, v in threshold.items() if k != "*"}
    check = Check(chosen, thresholds(chosen, over), [])
    try:
        entries = gather([Path(p) for p in paths])
        ref_entries = gather([Path(reference)]) if reference else []
    except SubmissionError as exc:
        raise SimilarityError(str(exc)) from None
    check.students = [s for s, _ in entries]
    check.docs = _documents(entries, chosen, wanted_all, check.problems)
    check.refs = _documents(ref_entries, chosen, wanted_all, check.problems, reference=True)
    for lab in chosen:
        check.pairs[lab] = compare_lab(lab, check.docs[lab], check.refs[lab], check.thresholds[lab])
    return check
# -- outputs -------------------------------------------------------------------------------
TABLE_ROWS = 10  # pairs printed per lab (all flagged pairs are in stats.json and the page)
PAGE_PAIRS = 50  # flagged pairs shown side by side per lab
STATS_PAIRS = 500  # stats.json lists the flagged pairs among the first 500 by score, per lab
MARK_RGB = (0xFD, 0xE6, 0x8A)  # the highlight of a shared passage on the page


def _score(x: float) -> str:
    return f"{x:.2f}"


def table(check: Check) -> str:
    """The ranked pairs per lab, as printed."""
    out = [WORDING, ""]
    for lab in check.labs:
        pairs = check.pairs.get(lab, [])
        docs = check.docs.get(lab, {})
        if not docs:
            continue
        flagged = sum(p.flagged for p in pairs)
        out.append(f"{lab}: {len(docs)} submission(s) with the lab, {len(pairs)} pair(s) share some of their own "
                   f"code, {flagged} at or above the threshold {check.thresholds[lab]:g} with ≥ {MIN_LINES} lines")
        if not pairs:
            out.append("")
            continue
        w = max(7, *(len(p.a) for p in pairs[:TABLE_ROWS]), *(len(p.b) for p in pairs[:TABLE_ROWS]))
        out.append(f"  {'score':>5}  {'lines':>5}  {'student':<{w}}  {'student':<{w}}  ")
        for p in pairs[:TABLE_ROWS]:
            b = p.b + (" (reference)" if p.reference else "")
            note = "look at this pair" if p.flagged else ""
            out.append(f"  {_score(p.score):>5}  {p.lines:>5}  {p.a:<{w}}  {b:<{w}}  {note}")
        if len(pairs) > TABLE_ROWS:
            out.append(f"  … {len(pairs) - TABLE_ROWS} more pair(s): the flagged ones in stats.json and similarity.html")
        out.append("")
    absent = [lab for lab in check.labs if not check.docs.get(lab)]
    if absent:
        out += [f"no submission has {', '.join(absent)}", ""]
    for line in check.problems:
        out.append(line)
    return "\n".join(out).rstrip() + "\n"


def stats(check: Check) -> dict:
    """The numbers for stats.json's ``similarity`` key."""
    import numpy as np

    labs = {}
    for lab in check.labs:
        pairs = check.pairs.get(lab, [])
        docs = check.docs.get(lab, {})
        scores = np.array([p.score for p in pairs]) if pairs else np.zeros(0)
        everyone = len(docs) * (len(docs) - 1) // 2 + len(docs) * len(check.refs.get(lab, {}))
        all_scores = np.concatenate([scores, np.zeros(max(0, everyone - len(pairs)))])
        labs[lab] = {
            "threshold": check.thresholds[lab],
            "submissions": len(docs),
            "with_own_code": sum(1 for d in docs.values() if d.hashes is not None and d.hashes.size),
            "pairs": everyone,
            "pairs_sharing_code": len(pairs),
            "flagged": sum(p.flagged for p in pairs),
            "max": round(float(all_scores.max()), 3) if all_scores.size else 0.0,
            "median": round(float(np.median(all_scores)), 3) if all_scores.size else 0.0,
            "p95": round(float(np.percentile(all_scores, 95)), 3) if all_scores.size else 0.0,
            "pairs_ranked": [p.summary() for i, p in enumerate(pairs[:STATS_PAIRS]) if p.flagged or i < TABLE_ROWS],
        }
    return {"note": WORDING, "k": NOISE, "window": GUARANTEE - NOISE + 1, "min_lines": MIN_LINES,
            "students": len(check.students), "left_out": check.problems, "labs": labs}


def student_flags(check: Check) -> dict[str, str]:
    """student → the gradebook's ``similarity`` cell: each flagged pair they are in."""
    cells: dict[str, list[str]] = {}
    for p in check.flagged():
        for me, other in ((p.a, p.b), (p.b, p.a)):
            if me == p.b and p.reference:
                continue
            tag = " (reference)" if p.reference and other == p.b else ""
            cells.setdefault(me, []).append(f"{p.lab[:2]}: {_score(p.score)} with {other}{tag}, {p.lines} lines")
    out = {}
    for student, items in cells.items():
        shown = items[:5] + ([f"+{len(items) - 5} more"] if len(items) > 5 else [])
        out[student] = "look at: " + "; ".join(shown)
    return out


def _marked(text: str, ranges: list[tuple[int, int]]) -> str:
    import html

    out, at = [], 0
    for s, e in sorted(ranges):
        s = max(s, at)
        if e <= s:
            continue
        out.append(html.escape(text[at:s]))
        out.append(f"<mark>{html.escape(text[s:e])}</mark>")
        at = e
    out.append(html.escape(text[at:]))
    return "".join(out)


def page(check: Check) -> str:
    """similarity.html: the ranked flagged pairs, each side by side with the shared
    passages highlighted. Self-contained, no scripts; every piece of student text escaped."""
    import html

    e = html.escape
    toc, sections = [], []
    for lab in check.labs:
        flagged = [p for p in check.pairs.get(lab, []) if p.flagged]
        toc.append(f"<li>{e(lab)}: {len(flagged)} pair(s) to look at (threshold {check.thresholds[lab]:g}, "
                   f"≥ {MIN_LINES} lines of their own code in common)</li>")
        for n, p in enumerate(flagged[:PAGE_PAIRS]):
            anchor = f"{lab[:2]}-{n}"
            b = p.b + (" (reference)" if p.reference else "")
            sections.append(
                f'<section id="{e(anchor)}"><h2>{e(lab)} · {e(p.a)} and {e(b)}</h2>'
                f"<p>score {_score(p.score)} ({_score(p.score_a)} of {e(p.a)}'s own code is shared, "
                f"{_score(p.score_b)} of {e(p.b)}'s) · {p.lines} lines of their own code in common</p>"
                f'<div class="pair"><div><h3>{e(p.a)}</h3><pre>{_marked(check.text(p, "a"), p.slices_a)}</pre></div>'
                f'<div><h3>{e(b)}</h3><pre>{_marked(check.text(p, "b"), p.slices_b)}</pre></div></div></section>')
        if len(flagged) > PAGE_PAIRS:
            sections.append(f"<p>{e(lab)}: {len(flagged) - PAGE_PAIRS} more flagged pair(s), listed in stats.json.</p>")
    left = "".join(f"<li>{e(x)}</li>" for x in check.problems)
    mark = "#%02x%02x%02x" % MARK_RGB
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Similarity check</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}}.note{{background:#eef2ff;padding:.6em 1em;max-width:60em}}
.pair{{display:grid;grid-template-columns:1fr 1fr;gap:1em}}.pair>div{{min-width:0}}
pre{{font-size:12px;background:#fafafa;border:1px solid #ddd;padding:.5em;overflow-x:auto;white-space:pre}}
mark{{background:{mark}}}section{{margin-bottom:2.5em}}</style></head>
<body><h1>Similarity check</h1>
<p class="note">{e(WORDING)} Only each student's own code is compared: the lab's starter code and
the reference solution are subtracted first. Highlighted: the passages the two share.</p>
<ul>{''.join(toc)}</ul>{f'<h2>Left out</h2><ul>{left}</ul>' if left else ''}
{''.join(sections)}
</body></html>
"""


def _add_gradebook_column(path: Path, cells: dict[str, str]) -> None:
    import csv

    from grader.grade import write_atomic

    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    if not rows:
        return
    head = rows[0]
    col = head.index("similarity") if "similarity" in head else None
    if col is None:
        head.append("similarity")
        col = len(head) - 1
    for row in rows[1:]:
        row += [""] * (len(head) - len(row))
        row[col] = cells.get(row[0], "") if row else ""
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    write_atomic(path, buf.getvalue())


LINK_MARK = "<!-- similarity -->"


def _link_report(path: Path) -> None:
    from grader.grade import write_atomic

    text = path.read_text(encoding="utf-8")
    if LINK_MARK in text:
        return
    link = (f'{LINK_MARK}<p><a href="similarity.html">Similarity check</a>: pairs of students whose own code '
            "is alike, side by side. Evidence to look at, not a verdict; it changes no score.</p>")
    at = text.find("</h1>")
    at = at + len("</h1>") if at >= 0 else text.find("<body>") + len("<body>")
    write_atomic(path, text[:at] + link + text[at:])


def write_outputs(check: Check, out_dir: Path) -> list[Path]:
    """similarity.html; the ``similarity`` key of stats.json; where the folder holds a
    grading, the gradebook's ``similarity`` column and a link from report.html."""
    from grader.grade import write_atomic

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "similarity.html", out_dir / "stats.json"]
    write_atomic(written[0], page(check))
    data = {}
    if written[1].is_file():
        try:
            data = json.loads(written[1].read_text(encoding="utf-8"))
        except ValueError:
            data = {}
    data["similarity"] = stats(check)
    write_atomic(written[1], json.dumps(data, indent=1))
    if (out_dir / "gradebook.csv").is_file():
        _add_gradebook_column(out_dir / "gradebook.csv", student_flags(check))
        written.append(out_dir / "gradebook.csv")
    if (out_dir / "report.html").is_file():
        _link_report(out_dir / "report.html")
        written.append(out_dir / "report.html")
    return written


def command(paths: list, out_dir, labs: list[str] | None = None, threshold: str | None = None,
            reference=None, prog: str = "grader similarity") -> int:
    """The check as the command line runs it (``grader similarity``, ``grader grade
    --similarity``): the table on stdout, the outputs in ``out_dir``, a bad input as one line."""
    import sys

    try:
        check = run([Path(p) for p in paths], labs, threshold=parse_threshold(threshold),
                    reference=Path(reference) if reference else None)
    except SimilarityError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if not check.students:
        print(f"{prog}: no submissions found", file=sys.stderr)
        return 2
    print(table(check), end="")
    if out_dir is None:  # a grading's own folder, or where `grader grade` writes by default
        graded = [Path(p) for p in paths if Path(p).is_dir() and graded_sources(Path(p)) is not None]
        out_dir = graded[0] if len(paths) == 1 and graded else Path("grading")
    written = write_outputs(check, Path(out_dir))
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    return 0
