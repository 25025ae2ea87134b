"""Honest code never loses a point: the corpus in tests/grader/honest/ (independent
submissions of every lab, written in different everyday styles: functions or classes,
helpers, the standard library, getattr and hasattr, comprehensions and generators,
dataclasses, enum) is graded in the configuration instructors get, at full marks, with no
note of the static review and no flag."""

import ast
from pathlib import Path

import pytest

from grader.grade import Grader

from .conftest import reachable_dir

HONEST = Path(__file__).with_name("honest")
STYLES = sorted(p.name for p in HONEST.iterdir() if (p / "labs").is_dir()) if HONEST.is_dir() else []

# What the corpus is for: each of these appears in it (a module imported, a builtin called).
IDIOMS = {"modules": {"collections", "itertools", "functools", "copy", "re", "dataclasses", "enum", "warnings",
                      "numbers", "struct", "os"},
          "builtins": {"getattr", "hasattr", "setattr", "vars", "open"}}


def _sources():
    return {p: p.read_text(encoding="utf-8") for p in sorted(HONEST.glob("*/labs/*/src/*.py"))}


def test_the_corpus_holds_every_lab_in_several_styles_and_the_everyday_idioms():
    from grader.submission import expected_files

    assert len(STYLES) >= 2, f"expected at least two styles in {HONEST}"
    for style in STYLES:
        for lab, modules in expected_files().items():
            for m in modules:
                assert (HONEST / style / "labs" / lab / "src" / f"{m}.py").is_file(), f"{style}: {lab}/{m}.py"
    imported, called, generators, comprehensions = set(), set(), 0, 0
    for source in _sources().values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.add(node.func.id)
            generators += isinstance(node, (ast.GeneratorExp, ast.Yield, ast.YieldFrom))
            comprehensions += isinstance(node, (ast.ListComp, ast.DictComp, ast.SetComp))
    assert not IDIOMS["modules"] - imported, f"the corpus lacks {sorted(IDIOMS['modules'] - imported)}"
    assert not IDIOMS["builtins"] - called, f"the corpus lacks {sorted(IDIOMS['builtins'] - called)}"
    assert generators and comprehensions


@pytest.fixture(scope="module")
def default_grader(reachable_tmp):
    """Every lab, the limits and options an instructor gets from `grader grade`."""
    g = Grader(reachable_dir(reachable_tmp, "honest"), None, log=lambda *_: None)
    (g.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
    g.prepare()
    return g


@pytest.mark.parametrize("style", STYLES)
def test_honest_style_gets_full_marks_and_no_note(default_grader, style):
    r = default_grader.grade(style, HONEST / style)
    lost = {lab: [(t.nodeid.split("::")[-1], t.message[:300]) for t in lr.tests if t.outcome != "passed"][:3]
            for lab, lr in r.labs.items() if lr.points < lr.max_points}
    assert not lost, f"{style} lost points: {lost}"
    assert r.total == r.max_total and not r.error
    flags = r.flags + [f"{lab}: {f}" for lab, lr in r.labs.items() for f in lr.flags]
    assert not flags, f"{style}: an honest submission must get no note or flag: {flags}"


def test_a_lab_that_imports_its_own_helper_from_an_earlier_lab_keeps_its_points(grader, make_submission,
                                                                                full_marks):
    """Students share helpers between labs: lab 02 importing a function that only the
    student's lab 01 defines runs, as under `uv run pytest`, since every lab runs on the
    student's own earlier labs; no note."""
    sub = make_submission(edits={
        "01_causal_mask/causal_mask.py": [("def causal_mask(", "def as_int_array(x):\n    return np.asarray(x)\n\n\n"
                                                            "def causal_mask(")],
        "02_embeddings/embeddings.py": [("from gptkit import", "from causal_mask import as_int_array\nfrom gptkit import"),
                                        ("""        token_ids = np.asarray(token_ids)
        if token_ids.dtype.kind not in "iu":""", """        token_ids = as_int_array(token_ids)
        if token_ids.dtype.kind not in "iu":""")]})
    r = grader.grade("helper", sub)
    assert {k: v.points for k, v in r.labs.items()} == full_marks
    assert not r.flags and not any(lr.flags for lr in r.labs.values()), r.flags


# --- everyday habits: the reference solutions, written the way students organise code ----------
def _plain(source: str) -> str:
    return "".join(line for line in source.splitlines(keepends=True) if "### BEGIN SOLUTION" not in line
                   and "### END SOLUTION" not in line)


def _edit(text: str, find: str, replace: str) -> str:
    assert text.count(find) == 1, f"habit edit not applicable: {find!r}"
    return text.replace(find, replace)


def make_habits(root: Path) -> Path:
    """A submission with the habits honest students have: a helper module of their own
    (lab 06's code lives in `utils.py`, which `generation.py` imports), a helper package
    (lab 08), a small data file read through `Path(__file__)` in a subfolder (lab 05), a
    debugging `np.save` to `/tmp` read back (lab 03), `pickle` (lab 07), a raised recursion
    limit (lab 10), and debugging prints (lab 02)."""
    from gptkit.testing.layout import KIT_ROOT, lab_dirs

    for lab in lab_dirs(KIT_ROOT / "solutions"):
        src = root / "labs" / lab.name / "src"
        src.mkdir(parents=True)
        for module in lab.modules():
            (src / f"{module}.py").write_text(_plain((lab.code_dir / f"{module}.py").read_text(encoding="utf-8")))
    labs = root / "labs"
    g = labs / "06_generation" / "src"
    (g / "utils.py").write_text((g / "generation.py").read_text())
    (g / "generation.py").write_text('"""Lab 06: my code is in utils.py."""\nfrom utils import *  # noqa: F401,F403\n')
    ll = labs / "08_llama" / "src"
    (ll / "llama_parts").mkdir()
    (ll / "llama_parts" / "__init__.py").write_text((ll / "llama.py").read_text())
    (ll / "llama.py").write_text("from llama_parts import *  # noqa: F401,F403\n")
    w = labs / "05_gpt2_weights" / "src"
    (w / "data").mkdir()
    (w / "data" / "notes.json").write_text('{"prefix": "transformer."}\n')
    text = (w / "gpt2_weights.py").read_text()
    (w / "gpt2_weights.py").write_text(_edit(text, "import numpy as np\n", "import json\nfrom pathlib import Path\n\n"
                                             "import numpy as np\n\n_NOTES = json.loads((Path(__file__).parent / 'data' / "
                                             "'notes.json').read_text())\nassert _NOTES['prefix'] == 'transformer.'\n"))
    f = labs / "03_layernorm_ffn" / "src" / "layers.py"
    f.write_text(_edit(f.read_text(), "def gelu(x: np.ndarray) -> np.ndarray:\n",
                       "def _debug_save(x):\n    np.save('/tmp/gelu_input.npy', np.asarray(x))\n"
                       "    assert np.load('/tmp/gelu_input.npy').shape == np.shape(x)\n\n\n"
                       "def gelu(x: np.ndarray) -> np.ndarray:\n    _debug_save(x)\n"))
    f = labs / "07_training" / "src" / "training.py"
    f.write_text(_edit(f.read_text(), "import numpy as np\n", "import pickle\n\nimport numpy as np\n\n"
                       "_BETAS = pickle.loads(pickle.dumps((0.9, 0.999)))\n"))
    f = labs / "10_tokenizer" / "src" / "tokenizer.py"
    f.write_text(_edit(f.read_text(), "from __future__ import annotations\n", "from __future__ import annotations\n\n"
                       "import sys\n\nsys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))\n"))
    f = labs / "02_embeddings" / "src" / "embeddings.py"
    f.write_text(f.read_text() + "\nprint('embeddings loaded')\n")
    return root


def test_everyday_habits_keep_full_marks_and_get_no_note(default_grader, tmp_path):
    r = default_grader.grade("habits", make_habits(tmp_path / "habits"))
    lost = {lab: [(t.nodeid.split("::")[-1], t.message[:300]) for t in lr.tests if t.outcome != "passed"][:3]
            for lab, lr in r.labs.items() if lr.points < lr.max_points}
    assert not lost, f"habits lost points: {lost}"
    flags = r.flags + [f"{lab}: {f}" for lab, lr in r.labs.items() for f in lr.flags]
    assert not flags, f"an honest submission must get no note or flag: {flags}"


def test_without_the_kernel_walls_an_honest_gc_collect_still_runs():
    """Where the kernel lacks seccomp or Landlock, the audit hook stands alone: it still
    refuses gc's walks over the lab process's objects, but `import gc; gc.collect()` is
    honest code and runs."""
    import subprocess
    import sys

    code = ("import sys, tempfile\n"
            "from grader.sandbox.labserver import _guard\n"
            "root = tempfile.mkdtemp()\n"
            "_guard([sys.prefix, sys.base_prefix, root] + sys.path, [root], lambda what: None, walled=False)\n"
            "sys.modules.pop('gc', None)  # imported for real, as in a fresh interpreter\n"
            "import gc\n"
            "gc.collect()\n"
            "try:\n"
            "    gc.get_objects()\n"
            "except PermissionError:\n"
            "    print('walk refused')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "walk refused", out.stdout + out.stderr
