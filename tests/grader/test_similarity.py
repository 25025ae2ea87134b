"""`grader similarity` on a class made for it: a planted copy disguised every way a student
would, a partial copy of one function, two independent solutions, two untouched stubs, two
students who filled only the one-line tasks alike, and three submissions that cannot be
read. The report page is rendered in headless Chromium."""

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gptkit.testing.layout import KIT_ROOT
from grader.cli import main as grader_main

pytest.importorskip("copydetect", reason="the similarity check needs the `similarity` extra: "
                    "uv sync --extra similarity")

from grader import similarity  # noqa: E402

HERE = Path(__file__).parent / "similarity_class"
ALICE = KIT_ROOT / "examples" / "submissions" / "alice"
BEN = HERE / "ben"  # written apart from alice, labs 01-03, passes their tests
LABS = ["01", "02", "03"]
L01, L02, L03 = "01_causal_mask", "02_embeddings", "03_layernorm_ffn"
SRC = {L01: "causal_mask.py", L02: "embeddings.py", L03: "layers.py"}


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H = _load(HERE / "disguise.py", "disguise")  # the planted copy's disguise; the stubs filled in
REPORT_TEST = _load(Path(__file__).with_name("test_report_renders.py"), "report_renders")  # render()


def _stub(lab):
    return (KIT_ROOT / "labs" / lab / "src" / SRC[lab]).read_text(encoding="utf-8")


def _alice(lab):
    return (ALICE / "labs" / lab / "src" / SRC[lab]).read_text(encoding="utf-8")


def _write(root, files):
    for lab, text in files.items():
        f = root / "labs" / lab / "src" / SRC[lab]
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text, encoding="utf-8")


# A third student's own lab 02 and 03, but for one function of lab 02 copied from alice.
PARTIAL_02 = [
    """bad = np.flatnonzero((token_ids.ravel() < 0) | (token_ids.ravel() >= len(self.weight)))
if bad.size > 0:
    raise ValueError(f"id {token_ids.ravel()[bad[0]]} is not in the vocabulary of {len(self.weight)}")
return self.weight.take(token_ids, axis=0)""",
    """if seq_len + offset > len(self.weight):
    raise ValueError(f"{seq_len + offset} positions asked, only {len(self.weight)} learned")
return self.weight[offset:offset + seq_len].copy()""",
    None,  # sinusoidal_positional_encoding: alice's, below
    """length = token_ids.shape[-1]
embedded = self.wte(token_ids)
return embedded + self.wpe(length, offset=offset)[None, ...]""",
]
PARTIAL_03 = [
    """result = np.einsum("...i,io->...o", x, self.weight)
if self.bias is not None:
    result += self.bias
return result""",
    """centre = x - np.mean(x, -1, keepdims=True)
scale = 1.0 / np.sqrt(np.var(x, -1, keepdims=True) + self.eps)
return centre * scale * self.weight + self.bias""",
    """cube = np.power(x, 3)
return x * 0.5 * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * cube)))""",
    """import scipy.special as sp
return x * (1 + sp.erf(x * (1 / math.sqrt(2)))) / 2""",
    """if self.p == 0 or not self.training:
    return x
survivors = self.rng.uniform(size=x.shape) >= self.p
return (x * survivors / (1 - self.p)).astype(x.dtype)""",
    """up = self.c_fc(x)
act = gelu(up)
down = self.c_proj(act)
return self.dropout(down)""",
]
# The one-line tasks only, filled the same way (not the reference's way) by two students.
ONE_LINERS_02 = [None, None, None, "return self.wpe(token_ids.shape[1], offset)[None] + self.wte(token_ids)"]
ONE_LINERS_03 = [None, None, None, "return x * 0.5 * (1 + scipy.special.erf(x / np.sqrt(2)))", None,
                 "return self.dropout(self.c_proj(gelu(self.c_fc(x))))"]


def _alice_function(name):
    """What alice wrote in her lab 02 function ``name`` (the lines that are not the stub's)."""
    import ast

    text = _alice(L02)
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    given = {ln.strip() for ln in _stub(L02).splitlines()}
    lines = text.splitlines()[node.body[0].end_lineno:node.end_lineno]  # after the docstring
    return "\n".join(ln[4:] for ln in lines if ln.strip() not in given)


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    shutil.copytree(ALICE, root / "alice")
    shutil.copytree(BEN, root / "ben")
    # The planted copy: alice's lab 01 renamed, recommented, reordered, reformatted; in a zip.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"kit-main/labs/{L01}/src/{SRC[L01]}", H.disguise(_alice(L01), seed=7))
    (root / "copycat.zip").write_bytes(buf.getvalue())
    # The partial copy: one function of alice's lab 02; the rest of labs 02 and 03 its own.
    bodies = PARTIAL_02[:2] + [_alice_function("sinusoidal_positional_encoding")] + PARTIAL_02[3:]
    _write(root / "pat", {L02: H.fill(_stub(L02), bodies), L03: H.fill(_stub(L03), PARTIAL_03)})
    for name in ("stub_one", "stub_two"):  # downloaded, handed in untouched
        _write(root / name, {lab: _stub(lab) for lab in SRC})
    for name in ("liner_one", "liner_two"):
        _write(root / name, {L02: H.fill(_stub(L02), ONE_LINERS_02), L03: H.fill(_stub(L03), ONE_LINERS_03)})
    (root / "empty").mkdir()
    (root / "broken.zip").write_bytes(b"PK\x03\x04 this is not a zip archive")
    (root / "notes.txt").write_text("my lab is in the cloud")
    return root


@pytest.fixture(scope="module")
def check(klass):
    return similarity.run([klass], LABS)


def _pair(check, lab, a, b):
    for p in check.pairs[lab]:
        if {p.a, p.b} == {a, b}:
            return p
    return None


def _score(check, lab, a, b):
    p = _pair(check, lab, a, b)
    return 0.0 if p is None else p.score


def test_a_planted_copy_is_flagged(check):
    p = _pair(check, L01, "alice", "copycat")
    assert p is not None and p.flagged, f"alice and the disguised copy of her lab 01: {p}"
    assert p.score >= 2 * check.thresholds[L01] - 0.2 and p.lines >= 15, p.summary()
    assert p.slices_a and p.slices_b, "a flagged pair keeps its shared passages for the page"


def test_a_partial_copy_is_flagged_on_that_lab_alone(check):
    p = _pair(check, L02, "alice", "pat")
    assert p is not None and p.flagged, f"pat copied alice's sinusoidal encoding: {p}"
    assert not any(q.flagged for lab in (L01, L03) for q in check.pairs[lab] if "pat" in (q.a, q.b)), \
        "pat's other lab is their own: nothing else may be flagged"
    # the shared passage is the copied function, not the rest of pat's lab 02
    text = check.docs[L02]["pat"].text
    marked = "".join(text[s:e] for s, e in (p.slices_a if p.a == "pat" else p.slices_b))
    assert "10000" in marked and "take(token_ids" not in marked, marked


def test_independent_solutions_are_not_flagged(check):
    for lab in (L01, L02, L03):
        p = _pair(check, lab, "alice", "ben")
        assert p is None or not p.flagged, p.summary()
        assert _score(check, lab, "alice", "ben") < check.thresholds[lab], lab


def test_untouched_stubs_score_zero(check):
    for lab in (L01, L02, L03):
        assert _pair(check, lab, "stub_one", "stub_two") is None, "two untouched stubs share no code of their own"
        assert not check.docs[lab]["stub_one"].hashes.size, "an untouched stub has no fingerprint of its own"
        assert not any("stub_one" in (p.a, p.b) for p in check.pairs[lab]), "a stub is like no one"


def test_the_same_one_liners_are_not_flagged(check):
    for lab in (L02, L03):
        p = _pair(check, lab, "liner_one", "liner_two")
        assert p is not None, "their one-liners are their own and the same: the pair is scored"
        assert not p.flagged and p.lines < similarity.MIN_LINES, p.summary()


def test_bad_input_is_one_clear_line_and_the_batch_goes_on(check):
    problems = "\n".join(check.problems)
    assert "empty: left out: no lab files found" in problems, problems
    assert "broken: left out: not a readable .zip file" in problems, problems
    assert "notes.txt: left out: not a folder or a .zip file (notes.txt)" in problems, problems
    assert len(check.problems) == 3
    assert {"alice", "ben", "copycat", "pat"} <= set(check.docs[L01]) | set(check.docs[L02])


def test_scores_are_copydetects(check):
    """The vectorized pair scores are what copydetect's own ``compare_files`` says."""
    from copydetect import compare_files

    for lab in (L01, L02):
        for p in check.pairs[lab][:6]:
            _, (sa, sb), _ = compare_files(check.docs[lab][p.a].fingerprint, check.docs[lab][p.b].fingerprint)
            assert (p.score_a, p.score_b) == pytest.approx((sa, sb), abs=1e-9), p.summary()


def test_earlier_years_are_compared_with_the_class_not_among_themselves(klass, tmp_path):
    last_year = tmp_path / "last_year"
    for name in ("alice", "alice_again"):
        shutil.copytree(ALICE, last_year / name)
    check = similarity.run([klass / "copycat.zip", klass / "ben"], ["01"], reference=last_year)
    pairs = {(p.a, p.b): p for p in check.pairs[L01]}
    assert ("alice", "alice_again") not in pairs and ("alice_again", "alice") not in pairs
    assert pairs[("copycat", "alice")].flagged and pairs[("copycat", "alice")].reference
    assert "(reference)" in similarity.student_flags(check)["copycat"]
    assert "alice" not in similarity.student_flags(check), "last year's students are not in this gradebook"


def test_one_id_twice_is_kept_twice_as_grade_keeps_it(tmp_path):
    shutil.copytree(BEN, tmp_path / "ben")
    shutil.make_archive(str(tmp_path / "ben"), "zip", BEN)
    assert [s for s, _ in similarity.gather([tmp_path])] == ["ben", "ben~2"]


def test_thresholds_per_lab_and_from_the_command_line():
    labs = ["01_causal_mask", "05_gpt2_weights"]
    defaults = similarity.thresholds(labs)
    assert defaults["05_gpt2_weights"] > defaults["01_causal_mask"], "lab 05's code is forced by the spec"
    assert similarity.thresholds(labs, 0.3) == {lab: 0.3 for lab in labs}
    assert similarity.thresholds(labs, {"05": 0.95})["05_gpt2_weights"] == 0.95
    with pytest.raises(similarity.SimilarityError, match="not a number"):
        similarity.parse_threshold("high")


def test_the_command_writes_beside_a_grading(klass, tmp_path, capsys):
    out = tmp_path / "grading"
    out.mkdir()
    (out / "gradebook.csv").write_text("student,01_causal_mask,total,max,flags\nalice,10,10,10,\ncopycat,10,10,10,\n"
                                       "ben,10,10,10,\n")
    (out / "stats.json").write_text(json.dumps({"students": 3}))
    (out / "report.html").write_text("<html><body><h1>Class report</h1></body></html>")
    assert grader_main(["similarity", str(klass), "-o", str(out), "--labs", "01,02,03"]) == 0
    printed = capsys.readouterr().out
    assert "never a verdict" in printed and "look at this pair" in printed and "left out" in printed
    rows = (out / "gradebook.csv").read_text().splitlines()
    assert rows[0].endswith(",similarity")
    assert "copycat" in next(r for r in rows if r.startswith("alice,")), rows
    assert next(r for r in rows if r.startswith("ben,")).endswith(","), "ben is flagged with no one"
    assert rows[1].split(",")[:5] == ["alice", "10", "10", "10", ""], "no score changes"
    stats = json.loads((out / "stats.json").read_text())
    assert stats["students"] == 3 and stats["similarity"]["labs"][L01]["flagged"] >= 1
    assert 'href="similarity.html"' in (out / "report.html").read_text()
    # run again on the grading's own folder: it finds the submissions from result.json
    students = out / "students"
    for name in ("alice", "copycat"):
        (students / name).mkdir(parents=True)
        src = klass / name if name == "alice" else klass / "copycat.zip"
        (students / name / "result.json").write_text(json.dumps({"student": name, "source": str(src)}))
    again = similarity.run([out], ["01"])
    assert again.students == ["alice", "copycat"] and _pair(again, L01, "alice", "copycat").flagged


def test_no_copydetect_or_no_submissions_is_one_line(tmp_path, capsys, monkeypatch):
    assert grader_main(["similarity", str(tmp_path / "absent"), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grader similarity: ") and "no such file" in err and "Traceback" not in err
    monkeypatch.setattr(similarity, "missing", lambda: similarity.NO_COPYDETECT)
    assert grader_main(["grade", str(ALICE), "-o", str(tmp_path / "g"), "--similarity"]) == 2
    err = capsys.readouterr().err
    assert "uv sync --extra similarity" in err and not (tmp_path / "g").exists(), "said before grading anything"


def test_student_text_is_escaped_on_the_page(klass, tmp_path):
    evil = tmp_path / "evil"
    text = _alice(L01).replace("offset = S - T", "offset = S - T  # </pre><script>alert(1)</script>")
    _write(evil, {L01: text})
    shutil.copytree(ALICE, tmp_path / "alice")
    check = similarity.run([tmp_path / "alice", evil], ["01"])
    page = similarity.page(check)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_page_renders_side_by_side_in_headless_chromium(check, tmp_path):
    page = tmp_path / "similarity.html"
    page.write_text(similarity.page(check), encoding="utf-8")
    dom, pixels = REPORT_TEST.render(page, tmp_path, window="1200,1600")
    assert "never a verdict" in dom and "copycat" in dom and "<mark>" in dom, dom[:2000]
    marked = np.all(np.abs(pixels - np.array(similarity.MARK_RGB)) <= 2, axis=-1)
    half = pixels.shape[1] // 2
    left, right = int(marked[:, :half].sum()), int(marked[:, half:].sum())
    assert left > 500 and right > 500, (f"highlighted pixels: {left} on the left, {right} on the right: the pair "
                                        "is not shown side by side with its shared passages marked")


def test_the_same_class_gives_the_same_scores_in_every_process(klass):
    """copydetect hashes with hash(): the check feeds it what hash() does not seed per process."""
    code = ("import json, sys; from grader import similarity; c = similarity.run([sys.argv[1]], ['01', '02']); "
            "print(json.dumps([p.summary() for lab in c.labs for p in c.pairs[lab]]))")
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code, str(klass)], capture_output=True, text=True, env=env,
                             timeout=300, cwd=KIT_ROOT)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout))
    assert runs[0] == runs[1] and runs[0], "the scores differ between two processes"
