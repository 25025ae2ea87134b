"""The student copy holds no solution, and its stubs fail with their own messages; the
Gradescope bundle grades a submission laid out as Gradescope lays it out."""

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from gptkit.testing.layout import KIT_ROOT
from grader.gradescope import build_bundle
from grader.release import ReleaseError, find_leaks, release, solution_lines

from .conftest import reachable_dir


@pytest.fixture(scope="module")
def student_copy(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "kit"
    release(out)
    return out


def test_release_has_no_solutions_hidden_tests_or_catalogue(student_copy):
    names = {p.relative_to(student_copy).as_posix() for p in student_copy.rglob("*")}
    for forbidden in ("solutions", "tests/hidden", "tests/kit", "tests/grader", "examples"):
        assert forbidden not in names, f"{forbidden} must not be in the student copy"
    assert not [n for n in names if n.endswith("bugs.toml") or n.endswith("make_fixtures.py")]
    assert not find_leaks(student_copy)
    assert "grader/check.py" in names and "grader = " in (student_copy / "pyproject.toml").read_text()
    assert "grader check" in (student_copy / "README.md").read_text()


def test_students_get_the_student_pages_only(student_copy):
    """The lab READMEs, the concept pages with their index, the page on how labs are graded,
    and a student README naming all the labs; the instructors' pages (grading a class,
    similarity thresholds, the trust model, benchmarks, contributing) stay in the full kit."""
    from gptkit.testing.layout import lab_dirs
    from grader.submission import expected_files

    docs = sorted(p.name for p in (student_copy / "docs").iterdir())
    labs = [lab.name for lab in lab_dirs(KIT_ROOT / "labs")]
    assert docs == sorted([f"{lab}.md" for lab in labs] + ["README.md", "grading.md"]), docs
    index = (student_copy / "docs" / "README.md").read_text()
    for page in ("instructors.md", "similarity.md", "performance.md", "contributing.md"):
        assert page not in index, f"the docs index links {page}, which students do not get"
    readme = (student_copy / "README.md").read_text()
    for lab in labs:
        assert (student_copy / "labs" / lab / "README.md").is_file()
        assert f"| {lab} |" in readme, f"the student README does not describe {lab}"
    assert json.loads((student_copy / "grader" / "lab_modules.json").read_text()) == expected_files()


def _page_text(page: Path) -> str:
    """A Markdown page, or a notebook's Markdown cells, without its code blocks."""
    if page.suffix == ".ipynb":
        text = "\n\n".join("".join(c["source"]) for c in json.loads(page.read_text())["cells"]
                           if c["cell_type"] == "markdown")
    else:
        text = page.read_text()
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_every_relative_link_of_the_release_resolves(student_copy):
    """A student's copy lacks the instructors' pages and benchmarks/: no page or notebook
    of it links to them (or to anything else it lacks), and a page that names one of
    those files says, in the same paragraph, that it is in the instructors' kit."""
    pages = [p for p in student_copy.rglob("*") if p.suffix in (".md", ".ipynb")
             and ".venv" not in p.parts and "templates" not in p.parts]  # the template is the copy's README.md
    assert len(pages) > 20, pages
    broken, unqualified = [], []
    for page in sorted(pages):
        where = page.relative_to(student_copy)
        for paragraph in re.split(r"\n\s*\n", _page_text(page)):
            for target in re.findall(r"\]\(([^)\s]+)\)", paragraph):
                path = target.partition("#")[0]
                if path and not re.match(r"[a-z]+:", target) and not (page.parent / path).exists():
                    broken.append(f"{where} → {target}")
            for named in re.findall(r"`(?:uv run [^`]*?)?((?:docs|benchmarks)/[\w./-]+)", paragraph):
                if not (student_copy / named).exists() and "instructors' kit" not in " ".join(paragraph.split()):
                    unqualified.append(f"{where} names {named}")
    assert not broken, "links in the student copy to what it does not hold:\n" + "\n".join(broken)
    assert not unqualified, ("pages of the student copy name files it lacks without saying they are in the "
                             "instructors' kit:\n" + "\n".join(unqualified))


def test_the_student_copy_cannot_show_the_reference(student_copy):
    """GPTKIT_IMPL=solutions (README.md: the notebooks on the reference) finds nothing to
    bind in a student's copy and says so in one line."""
    import sys

    env = {**os.environ, "GPTKIT_IMPL": "solutions", "PYTHONPATH": str(student_copy)}
    done = subprocess.run([sys.executable, "-c", "from gptkit.notebook import use; use('labs')"], cwd=student_copy,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "GPTKIT_IMPL=solutions: there is no solutions/" in done.stderr \
        and "full kit only" in done.stderr, done.stdout + done.stderr[-2000:]


def test_leak_check_catches_a_solution_line(student_copy, tmp_path):
    line = next(iter(solution_lines()))
    copy = tmp_path / "copy"
    shutil.copytree(student_copy / "docs", copy / "docs") if (student_copy / "docs").is_dir() else copy.mkdir()
    (copy / "notes.md").write_text(f"a hint:\n    {line}\n")
    assert find_leaks(copy), "a solution line in a doc must be reported"


def test_release_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(ReleaseError, match="not empty"):
        release(tmp_path)
    assert (tmp_path / "x").read_text() == "keep me"


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH")
def test_student_copy_runs_its_tests_and_the_stubs_fail(student_copy):
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    proc = subprocess.run(["uv", "run", "--frozen", "pytest", "-m", "lab01", "-q", "-p", "no:cacheprovider"],
                          cwd=student_copy, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "passed" not in out.splitlines()[-1], out[-1000:]
    assert "NotImplementedError: Lab 01" in out and "error" not in out.splitlines()[-1], out[-2000:]


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH")
def test_grader_check_runs_in_the_student_copy(student_copy, tmp_path):
    """A student runs `uv run grader check` in their copy: the labs run in the grader's
    sandbox on the student's own code, failures are named, review notes are shown and cost
    nothing, and the instructor's commands are not there."""
    copy = tmp_path / "kit"
    shutil.copytree(student_copy, copy, ignore=shutil.ignore_patterns(".venv"))
    alice = KIT_ROOT / "examples" / "submissions" / "alice" / "labs" / "01_causal_mask" / "src" / "causal_mask.py"
    (copy / "labs" / "01_causal_mask" / "src" / "causal_mask.py").write_text(
        alice.read_text().replace("import numpy as np\n", "import numpy as np\nimport gc\n", 1))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}

    def check(*args):
        proc = subprocess.run(["uv", "run", "--frozen", "grader", *args], cwd=copy, capture_output=True,
                              text=True, timeout=900, env=env)
        return proc.returncode, proc.stdout + proc.stderr

    rc, out = check("check", "labs/01_causal_mask")
    assert rc == 0, out[-3000:]
    assert "01_causal_mask:" in out and "tests passed" in out and "✗" not in out, out[-3000:]
    assert "imports `gc`" in out and "changes no score" in out, out[-3000:]
    assert "02_embeddings" not in out
    rc, out = check("check", "02")
    assert rc == 1 and "02_embeddings: 0 of" in out and "NotImplementedError" in out, out[-3000:]
    rc, out = check("grade", "x")
    assert rc != 0 and "invalid choice" in out, out[-2000:]


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH")
def test_grader_check_computes_what_grade_computes_on_the_public_tests(student_copy, tmp_path, reachable_tmp):
    """An honest student with a helper module, a data file and a bug: `grader check` in
    their copy and the instructor's `grader grade` of the same folder give every public
    test the same outcome (the same files, the same earlier labs: the student's own)."""
    from grader.grade import Grader

    copy = tmp_path / "kit"
    shutil.copytree(student_copy, copy, ignore=shutil.ignore_patterns(".venv"))
    alice = KIT_ROOT / "examples" / "submissions" / "alice" / "labs"
    for lab in ("01_causal_mask", "02_embeddings", "03_layernorm_ffn"):
        for f in (alice / lab / "src").glob("*.py"):
            shutil.copy2(f, copy / "labs" / lab / "src" / f.name)
    src = copy / "labs" / "02_embeddings" / "src"
    (src / "emb_helpers.py").write_text("import numpy as np\n\n\ndef as_ids(x):\n    return np.asarray(x)\n")
    (src / "table.json").write_text('{"ok": true}\n')
    text = (src / "embeddings.py").read_text()
    (src / "embeddings.py").write_text(text.replace(
        "import numpy as np\n", "import json\nfrom pathlib import Path\n\nimport numpy as np\n\nfrom emb_helpers import "
        "as_ids\n\nassert json.loads((Path(__file__).parent / 'table.json').read_text())['ok']\n", 1))
    layers = copy / "labs" / "03_layernorm_ffn" / "src" / "layers.py"
    layers.write_text(layers.read_text().replace("var = np.mean(centered * centered, axis=-1, keepdims=True)",
                                                 "var = np.var(x, axis=-1, ddof=1, keepdims=True)"))  # a bug
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    proc = subprocess.run(["uv", "run", "--frozen", "grader", "check", "01", "02", "03", "--json",
                           str(tmp_path / "check.json")], cwd=copy, capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    checked = json.loads((tmp_path / "check.json").read_text())
    g = Grader(reachable_dir(reachable_tmp, "check-vs-grade"), ["01", "02", "03"], log=lambda *_: None)
    (g.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
    g.prepare()
    graded = g.grade("student", copy)
    outcomes = {lab: {t["nodeid"]: t["outcome"] for t in lr["tests"]} for lab, lr in checked["labs"].items()}
    for lab, lr in graded.labs.items():
        public = {t.nodeid: t.outcome for t in lr.tests if not t.hidden}
        assert public == outcomes[lab], (lab, {k: (v, outcomes[lab].get(k)) for k, v in public.items()
                                               if outcomes[lab].get(k) != v})
    assert graded.labs["02_embeddings"].points == graded.labs["02_embeddings"].max_points
    assert graded.labs["03_layernorm_ffn"].points < graded.labs["03_layernorm_ffn"].max_points
    assert [f for f in checked["flags"]] == graded.flags


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH")
def test_gradescope_bundle_grades_a_submission(tmp_path, reachable_tmp):
    """Run as Gradescope runs it; as root (with GRADER_NO_BWRAP=1: a container where
    bubblewrap cannot work), the walls of root without bubblewrap."""
    bundle = tmp_path / "autograder.zip"
    build_bundle(bundle)
    root = reachable_tmp / "autograder"  # Gradescope's /autograder: other users may pass through
    with zipfile.ZipFile(bundle) as zf:
        names = zf.namelist()
        assert "setup.sh" in names and "run_autograder" in names and "solutions/01_causal_mask/causal_mask.py" in names
        zf.extractall(root / "source")
    with zipfile.ZipFile(KIT_ROOT / "examples" / "submissions" / "bob.zip") as zf:
        zf.extractall(root / "submission")  # Gradescope unpacks an uploaded zip the same way
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["AUTOGRADER_ROOT"] = str(root)
    proc = subprocess.run(["bash", str(root / "source" / "run_autograder")], capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results.get("tests"), results.get("output")
    assert 0 < results["score"] < sum(t["max_score"] for t in results["tests"])
    for t in results["tests"]:
        assert {"name", "score", "max_score", "visibility"} <= set(t)
    assert "missing" in results.get("output", "")
