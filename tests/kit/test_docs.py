"""The documentation says what the kit is now, and its numbers are generated.

- README.md is a short front door whose links resolve, with a row for every lab.
- No page (the lab READMEs included) refers to an issue number, a work session or the
  history of its own writing ("this commit", "has since", "was once").
- Every test and test file a page names exists, so the trust model's references stay true.
- docs/performance.md holds one generated section per benchmark (``python -m
  benchmarks``): each names its machine and its tables parse; the README's headline
  figures are those sections' summaries; each was written by its script as the script is
  now (a fingerprint in its stamp). Values are not checked: they are measured.
- Every command the README shows is run by a test or by CI, named below; the
  instructor's release and Gradescope commands run here as shown.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gptkit.testing.layout import KIT_ROOT, lab_dirs

README = KIT_ROOT / "README.md"
DOCS = sorted((KIT_ROOT / "docs").rglob("*.md"))
PAGES = [README, *DOCS]
PERFORMANCE = KIT_ROOT / "docs" / "performance.md"
MAX_README_LINES = 220


def _generator():
    """benchmarks/__main__.py as a module (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location("benchmarks_main", KIT_ROOT / "benchmarks" / "__main__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rel(path: Path) -> str:
    return path.relative_to(KIT_ROOT).as_posix()


# --- the front door -------------------------------------------------------------------------

def test_readme_is_short_and_links_the_pages_by_audience():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, over {MAX_README_LINES}: move depth into docs/")
    text = "\n".join(lines)
    for page in ("docs/instructors.md", "docs/performance.md", "docs/contributing.md", "docs/README.md"):
        assert f"]({page}" in text, f"README.md must link {page}"


def test_readme_has_a_row_for_every_lab():
    text = README.read_text()
    rows = re.findall(r"^\| \[(\d\d_\w+)\]\(labs/(\d\d_\w+)/README\.md\)", text, re.M)
    listed = [name for name, target in rows if name == target]
    assert len(listed) == len(rows), f"a lab row's text and link disagree: {rows}"
    labs = [lab.name for lab in lab_dirs(KIT_ROOT / "labs")]
    missing = [name for name in labs if name not in listed]
    assert not missing, f"README.md's lab table lacks a row for {missing}"
    assert listed == sorted(listed), "README.md's lab table is in lab order"


def test_student_readme_has_a_row_for_every_lab():
    """The README of the student copy (grader release) lists every lab too."""
    text = (KIT_ROOT / "grader" / "templates" / "STUDENT_README.md").read_text()
    listed = re.findall(r"^\| (\d\d_\w+) \|", text, re.M)
    labs = [lab.name for lab in lab_dirs(KIT_ROOT / "labs")]
    assert listed == labs, f"grader/templates/STUDENT_README.md lists {listed}, the labs are {labs}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading for #{anchor})")
    assert not broken, f"{_rel(page)} links to what is not there: {broken}"


def test_the_quoted_first_failure_is_the_stub_s():
    """The README quotes the line a student sees on an untouched stub: it is that stub's."""
    quoted = re.findall(r"^(labs/\S+\.py):(\d+): NotImplementedError: (.+)$", README.read_text(), re.M)
    assert quoted, "README.md quotes no NotImplementedError line"
    for path, line, message in quoted:
        source = (KIT_ROOT / path).read_text().splitlines()
        assert int(line) <= len(source) and message in source[int(line) - 1], (
            f"README.md quotes {path}:{line} as raising {message!r}; the stub says otherwise: regenerate the quote")


# --- one voice ------------------------------------------------------------------------------

HISTORY = re.compile(r"issue [0-9]+|this session|last session|session before|this commit|working state|"
                     r"has since|since this change|was once|once wrote|taken out again", re.I)


@pytest.mark.parametrize("page", [*PAGES, *sorted((KIT_ROOT / "labs").glob("*/README.md"))], ids=_rel)
def test_pages_say_what_the_kit_is_now(page):
    found = [f"{_rel(page)}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
             if HISTORY.search(line)]
    assert not found, "docs speak in the present, without issue numbers or sessions:\n" + "\n".join(found)


def _test_functions() -> set[str]:
    names = set()
    for path in (KIT_ROOT / "tests").rglob("test_*.py"):
        names |= set(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_named_tests_and_files_exist(page):
    text = page.read_text()
    tests = _test_functions()
    unknown = sorted({name for name in re.findall(r"`(test_\w+)`", text) if name not in tests})
    assert not unknown, f"{_rel(page)} names tests that do not exist (renamed?): {unknown}"
    paths = {p for p in re.findall(r"`((?:tests|grader|gptkit|benchmarks|solutions|labs|docs|\.ci)/[\w./-]+)`", text)
             if "NN" not in p and "*" not in p and "<" not in p}
    missing = sorted(p for p in paths if not (KIT_ROOT / p).exists())
    assert not missing, f"{_rel(page)} names files that do not exist: {missing}"


# --- generated numbers ----------------------------------------------------------------------

def _parse_tables(body: str) -> list[list[list[str]]]:
    """Every markdown table of ``body`` as rows of cells; a table that does not parse fails."""
    tables, block = [], []
    for line in body.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            rows = [[c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]] for row in block]
            assert len(rows) >= 3, f"a table needs a header, a separator and a row: {block}"
            assert all(re.fullmatch(r":?-{3,}:?", c) for c in rows[1]), f"not a separator row: {block[1]}"
            widths = {len(r) for r in rows}
            assert len(widths) == 1, f"rows of different widths in the table under {block[0]}"
            tables.append(rows)
            block = []
    return tables


def test_performance_has_a_generated_section_per_benchmark():
    gen = _generator()
    sections = gen.sections(PERFORMANCE.read_text())
    benches = gen.discover()
    assert benches, "no benchmarks/bench_*.py found"
    missing = [b for b in benches if b not in sections]
    assert not missing, f"docs/performance.md has no section for {missing}: run `{gen.COMMAND} --only NAME`"
    orphans = [s for s in sections if s.startswith("bench_") and s not in benches]
    assert not orphans, f"docs/performance.md has sections for benchmarks that are gone: {orphans}"


@pytest.mark.parametrize("name", _generator().discover())
def test_each_report_names_its_machine_and_its_tables_parse(name):
    body = _generator().sections(PERFORMANCE.read_text()).get(name)
    if body is None:
        pytest.fail(f"docs/performance.md has no section for {name}")
    lines = body.strip().splitlines()
    assert lines and lines[0].startswith("*Generated "), f"{name}: the section starts with its generation stamp"
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", lines[0]), f"{name}: the stamp carries the date"
    machine = [line for line in lines if line.startswith("machine: ")]
    assert machine and len(machine[0]) > len("machine: ") + 10, f"{name}: the report names no machine"
    tables = _parse_tables(body)
    assert tables, f"{name}: the report holds no table"


# Reports written before a stamp carried its script's fingerprint, with the fingerprint of
# the script that wrote each: git log shows no change to the script after the report's date
# but wording of bench_assistant's own header, which its report was edited to match. A
# rerun writes the fingerprint into the stamp, and the entry goes.
WRITTEN_BEFORE_FINGERPRINTS = {
    "bench_assistant": "5deef0a298b6",
    "bench_grader": "4d08ada9b9ab",
    "bench_llama": "e4567dd3bee1",
    "bench_seq2seq": "d5b779c3632c",
    "bench_tokenizer": "39ac850cbd7d",
    "bench_training": "7b57a6c86b3a",
}


@pytest.mark.parametrize("name", _generator().discover())
def test_each_report_is_what_its_script_prints_now(name):
    """A report is the output of its script as the script is now: a script changed since
    (another table, another summary) asks for its report to be measured again."""
    gen = _generator()
    body = gen.sections(PERFORMANCE.read_text()).get(name, "")
    stamp = body.strip().splitlines()[0] if body.strip() else ""
    found = re.search(r"\(source ([0-9a-f]{12});", stamp)
    assert not (found and name in WRITTEN_BEFORE_FINGERPRINTS), (
        f"{name}'s stamp carries its fingerprint: take it out of WRITTEN_BEFORE_FINGERPRINTS")
    written_by = found.group(1) if found else WRITTEN_BEFORE_FINGERPRINTS.get(name)
    assert written_by, f"{name}'s report names no source it was written by: rerun `{gen.COMMAND} --only {name[6:]}`"
    assert written_by == gen.source(name), (
        f"benchmarks/{name}.py has changed since docs/performance.md's report of it was written, so the report "
        f"may not be what the script prints now: rerun `{gen.COMMAND} --only {name[6:]}`")


def test_the_run_block_says_where_and_with_what():
    body = _generator().sections(PERFORMANCE.read_text()).get("run", "")
    for what in ("Last run:", "- Machine: ", "- Versions: ", "- Threads: "):
        assert what in body, f"docs/performance.md's run block lacks {what!r}"
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", body), "the run block carries the date"


def test_readme_figures_are_the_generated_summaries():
    gen = _generator()
    readme = gen.sections(README.read_text()).get("benchmark-summaries")
    assert readme is not None, "README.md lacks the benchmark-summaries markers"
    expected = gen.summaries_block(PERFORMANCE.read_text())
    assert expected, "no benchmark report carries a summary line"
    assert readme.strip() == expected.strip(), f"README.md's figures differ from docs/performance.md's: rerun `{gen.COMMAND}`"


def test_the_generator_lists_every_benchmark_with_its_arguments():
    gen = _generator()
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--list", "--quick"], cwd=KIT_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = done.stdout.splitlines()
    assert [line.split()[0] for line in listed] == [f"benchmarks/{n}.py" for n in gen.discover()]
    assert all(line.split()[1:] == gen.arguments(n, True) for line, n in zip(listed, gen.discover()))


def test_replacing_a_section_keeps_the_rest():
    gen = _generator()
    text = "intro\n<!-- BEGIN a -->\nold\n<!-- END a -->\nmiddle\n<!-- BEGIN b -->\nkeep\n<!-- END b -->\n"
    out = gen.replace_section(text, "a", "new $1 \\1\n")
    assert out == text.replace("old", "new $1 \\1")
    added = gen.replace_section(out, "c", "fresh", heading="## c")
    assert added.startswith(out.rstrip("\n")) and added.endswith("## c\n\n<!-- BEGIN c -->\nfresh\n<!-- END c -->\n")
    assert gen.sections(added) == {"a": "new $1 \\1\n", "b": "keep\n", "c": "fresh\n"}


# --- the README's commands run --------------------------------------------------------------

# Each command README.md shows, and what runs it (a test, ``path::name``, or CI's script).
RUN_BY = {
    "python3 -m pip install uv": ".ci/run",
    "uv sync": "tests/grader/test_release_and_gradescope.py::test_student_copy_runs_its_tests_and_the_stubs_fail",
    "uv run pytest -m lab01": "tests/grader/test_release_and_gradescope.py::test_student_copy_runs_its_tests_and_the_stubs_fail",
    "uv sync --extra torch --extra similarity": ".ci/run",
    "uv sync --extra torch": ".ci/run",
    "uv run grader similarity grading": "tests/grader/test_similarity.py::test_the_command_writes_beside_a_grading",
    "uv run python -m gptkit.demo --random --ids 1,2,3": "tests/kit/test_demo.py::test_demo_runs_without_any_weights",
    'uv run python -m gptkit.demo --random --prompt "To be, or not to be"':
        "tests/kit/test_text_wiring.py::test_demo_prompt_goes_through_the_lab_tokenizer_without_transformers",
    "uv run python -m gptkit.assistant":
        "tests/kit/test_assistant_pipeline.py::test_the_quick_pipeline_learns_and_the_chat_command_answers_from_its_model",
    "uv run python -m gptkit.assistant --quick":
        "tests/kit/test_assistant_pipeline.py::test_the_quick_pipeline_learns_and_the_chat_command_answers_from_its_model",
    "uv run python -m gptkit.chat":
        "tests/kit/test_assistant_pipeline.py::test_the_quick_pipeline_learns_and_the_chat_command_answers_from_its_model",
    "uv run pytest --impl=solutions": ".ci/run",
    "uv run grader grade examples/submissions -o grading": "tests/grader/test_batch.py::test_batch_outputs_cover_every_student",
    "uv run grader check labs/01_causal_mask": "tests/grader/test_release_and_gradescope.py::test_grader_check_runs_in_the_student_copy",
    "uv run grader release ../student-kit": "tests/kit/test_docs.py::test_instructor_quick_start_runs_as_shown",
    "uv run grader gradescope autograder.zip": "tests/kit/test_docs.py::test_instructor_quick_start_runs_as_shown",
    "uv sync --extra notebooks": ".ci/run",
    "uv run --extra notebooks jupyter lab": "tests/kit/test_notebooks.py::test_jupyter_lab_serves_the_lab_notebooks",
}


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.split("#")[0].strip()]


def test_every_readme_command_is_run_by_a_test_or_ci():
    commands = _readme_commands()
    assert commands, "README.md shows no commands"
    unknown = [c for c in commands if c not in RUN_BY]
    assert not unknown, f"README.md shows commands that no test runs: {unknown} (add each to RUN_BY with its test)"
    ci = (KIT_ROOT / ".ci" / "run").read_text()
    for command in commands:
        where = RUN_BY[command]
        if where == ".ci/run":
            # CI runs it, perhaps with more options (--locked, --quiet): a line holding its every word.
            assert any(set(command.split()) <= set(line.split()) for line in ci.splitlines()
                       if not line.lstrip().startswith("#")), f".ci/run does not run {command!r}"
            continue
        path, _, name = where.partition("::")
        assert re.search(rf"^def {name}\(", (KIT_ROOT / path).read_text(), re.M), f"{where} (for {command!r}) is gone"


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH: the README's commands start with it")
def test_instructor_quick_start_runs_as_shown(tmp_path):
    """The README's release and Gradescope commands, as shown, writing under a scratch
    folder rather than beside the kit. (``grader grade`` on the example class is run by
    tests/grader/test_batch.py; the student copy's ``uv run pytest -m lab01`` by
    tests/grader/test_release_and_gradescope.py.)"""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    shown = {c.split()[3]: c.split() for c in _readme_commands() if c.startswith("uv run grader ")}
    release = [*shown["release"][:-1], str(tmp_path / "student-kit")]
    gradescope = [*shown["gradescope"][:-1], str(tmp_path / "autograder.zip")]
    for cmd in (release, gradescope):
        done = subprocess.run(cmd, cwd=KIT_ROOT, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    student = tmp_path / "student-kit"
    assert (student / "labs" / "01_causal_mask" / "src" / "causal_mask.py").is_file()
    assert not (student / "solutions").exists(), "the student copy holds no solutions"
    with zipfile.ZipFile(tmp_path / "autograder.zip") as zf:
        assert {"setup.sh", "run_autograder"} <= set(zf.namelist())


# --- how labs are graded: one page, in step with the grader ---------------------------------

GRADING = KIT_ROOT / "docs" / "grading.md"
LAB_READMES = sorted((KIT_ROOT / "labs").glob("*/README.md"))


def _marked(name: str) -> list[str]:
    body = re.search(rf"<!-- {name}: -->(.*?)<!-- :{name} -->", GRADING.read_text(), re.S)
    assert body, f"docs/grading.md lacks its <!-- {name}: --> list"
    return re.findall(r"`([\w.]+)`", body[1])


def test_the_instructors_page_lists_the_kernel_objects_the_filter_refuses():
    """docs/instructors.md's list of what the seccomp filter refuses besides the lab
    process's own namespaces is the filter's list (``labserver._OBJECTS``), on every
    machine it knows."""
    from grader.sandbox import labserver

    text = (KIT_ROOT / "docs" / "instructors.md").read_text()
    body = re.search(r"<!-- refused-objects: -->(.*?)<!-- :refused-objects -->", text, re.S)
    assert body, "docs/instructors.md lacks its <!-- refused-objects: --> list"
    said = set(re.findall(r"`(\w+)`", body[1]))
    refused = {name for calls in labserver._OBJECTS.values() for name in calls.values()}
    assert said == refused, {"listed, not refused": sorted(said - refused), "refused, not listed": sorted(refused - said)}


def test_every_lab_readme_links_the_grading_page_and_claims_no_rules_of_its_own():
    """What the grader does is said once, in docs/grading.md; a lab README links it and
    does not say the grader refuses, forbids or rejects code (the review is advisory)."""
    for readme in LAB_READMES:
        text = readme.read_text()
        assert "](../../docs/grading.md)" in text, f"{_rel(readme)} does not link docs/grading.md"
        claim = re.search(r"grader\s+(refuses|forbids|rejects|blocks|disallows)", text)
        assert not claim, f"{_rel(readme)} says {claim[0]!r}: the grader's review notes, it refuses nothing"


def test_the_grading_page_lists_what_the_review_notes_and_what_it_does_not():
    """Each name the page lists as noted gets a review note from grader/policy.py, and each
    it lists as silent gets none."""
    import builtins

    from grader.policy import review_source

    def snippet(name: str) -> str:
        return f'{name}(x, "y")\n' if hasattr(builtins, name) else f"import {name}\n"

    noted, silent = _marked("noted"), _marked("silent")
    assert noted and silent
    quiet = [n for n in noted if not review_source(snippet(n))]
    assert not quiet, f"docs/grading.md says these are noted; grader/policy.py is silent on them: {quiet}"
    loud = {n: [str(f) for f in review_source(snippet(n))] for n in silent}
    assert not any(loud.values()), f"docs/grading.md says these get no note; grader/policy.py notes them: {loud}"


def test_the_grading_page_states_the_grader_s_limits_and_points():
    import tomllib

    from grader.sandbox.runner import Limits
    from grader.submission import MAX_DEPTH, MAX_LAB_BYTES, MAX_LAB_FILES, MAX_MEMBER_BYTES

    text = " ".join(GRADING.read_text().split())
    limits = Limits()
    for said in (f"{limits.test_seconds:g} CPU seconds per test", f"{limits.lab_seconds:g} CPU seconds in all",
                 f"{limits.memory_mb} MB of address space", f"{MAX_LAB_FILES} files and {MAX_LAB_BYTES >> 20} MB a lab",
                 f"{MAX_MEMBER_BYTES >> 20} MB a file", f"{MAX_DEPTH} folders deep"):
        assert said in text, f"docs/grading.md should say {said!r} (the grader's default)"
    rubric = tomllib.loads((KIT_ROOT / "grader" / "rubric.toml").read_text())["labs"]
    points = {lab: entry.get("points") for lab, entry in rubric.items()}
    assert set(points.values()) == {10, 20} and [p for p in points.values()].count(10) == 3 \
        and all(points[name] == 10 for name in list(points)[:3]), points
    assert "10 for labs 01–03, 20 for the later ones" in text
    for lab, entry in rubric.items():
        for module in entry.get("allowed_imports", []):
            readme = (KIT_ROOT / "labs" / lab / "README.md").read_text()
            assert f"`{module}`" in readme, f"labs/{lab}/README.md does not name `{module}`, which its rubric allows"
            assert f"`{module}`" in text, f"docs/grading.md does not name `{module}`, which lab {lab} may use"


# --- the notebooks: every lab's is named ------------------------------------------------------

def test_the_readme_and_every_lab_readme_name_the_lab_s_notebook():
    paragraph = next(p for p in README.read_text().split("\n\n") if "explore.ipynb" in p)
    for lab in lab_dirs(KIT_ROOT / "labs"):
        assert re.search(rf"\((?:lab )?{lab.number}\)", paragraph), \
            f"README.md's notebook paragraph says nothing of lab {lab.number}'s notebook"
        text = (KIT_ROOT / "labs" / lab.name / "README.md").read_text()
        assert "](explore.ipynb)" in text, f"labs/{lab.name}/README.md does not link its explore.ipynb"
