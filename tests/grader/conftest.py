"""Shared set-up for the grader's tests: a grader on labs 01–03 with short limits, and a
way to make a submission from the example student 'alice' with a few edits."""

import shutil
import tempfile
from pathlib import Path

import pytest

from gptkit.testing.layout import KIT_ROOT
from grader.grade import Grader
from grader.sandbox.runner import Limits

ALICE = KIT_ROOT / "examples" / "submissions" / "alice"
LABS = ["01", "02", "03"]
FAST = Limits(wall_seconds=180, lab_seconds=60, test_seconds=2, memory_mb=1024, test_wall_backstop=15)


@pytest.fixture(scope="session")
def reachable_tmp():
    """A folder for graders' output that other users can pass through (o+x, no listing):
    as root without bubblewrap the sandboxed processes are other users, and pytest's own
    temporary folders are 0700 (pytest resets them so at each start)."""
    base = Path(tempfile.mkdtemp(prefix="grader-tests-"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def reachable_dir(base, name):
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    d.chmod(0o711)
    return d


def use_lab_server(mp, boot_files, suffix):
    """Grade with the boot files ``boot_files()`` gives (a patched ``labserver.py``), whose
    kit has a cache of its own: the kit's digest, then ``suffix``."""
    from grader import grade as grade_module
    from grader.sandbox import runner

    original_files, original_digest = runner.boot_files, grade_module.kit_digest

    def digest(labs):  # the patched file lies outside the kit: its own cache, named apart
        with pytest.MonkeyPatch.context() as inner:
            inner.setattr(runner, "boot_files", original_files)
            return original_digest(labs) + suffix

    mp.setattr(grade_module, "kit_digest", digest)
    mp.setattr(runner, "boot_files", boot_files)


@pytest.fixture(scope="session")
def grader(tmp_path_factory, reachable_tmp):
    g = Grader(reachable_dir(reachable_tmp, "grading"), LABS, limits=FAST, log=lambda *_: None)
    (g.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
    g.prepare()
    return g


@pytest.fixture(scope="session")
def two_lab_grader(tmp_path_factory, reachable_tmp):
    """Labs 01–02, in the configuration instructors get: the static review only notes, so
    the process split and the sandbox alone stand between lab code and the score."""
    g = Grader(reachable_dir(reachable_tmp, "grading-two"), ["01", "02"], limits=FAST, log=lambda *_: None)
    (g.out_dir / ".scratch").mkdir(parents=True, exist_ok=True)
    g.prepare()
    return g


@pytest.fixture
def make_submission(tmp_path):
    """make_submission(name, edits={"01_causal_mask/causal_mask.py": [(find, replace)]},
    extra={"relative/path": "text"}, drop=["03_layernorm_ffn/layers.py"], base=ALICE) -> folder."""

    def make(name="student", edits=None, extra=None, drop=(), base=ALICE):
        root = tmp_path / name
        shutil.copytree(base, root)
        for rel, pairs in (edits or {}).items():
            lab, fname = rel.split("/")
            f = root / "labs" / lab / "src" / fname
            text = f.read_text()
            for find, repl in pairs:
                assert text.count(find) == 1, f"edit not applicable: {find!r}"
                text = text.replace(find, repl)
            f.write_text(text)
        for rel in drop:
            lab, fname = rel.split("/")
            (root / "labs" / lab / "src" / fname).unlink()
        for rel, text in (extra or {}).items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        return root

    return make


@pytest.fixture(scope="session")
def full_marks(grader):
    return {lab: grader.rubric[lab].points for lab in grader.labs}
