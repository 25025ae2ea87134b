"""The layout contract: every lab has its README, stubs, solution, tests, docs and marker."""

import sys
import tomllib
from pathlib import Path

import pytest

from gptkit.testing.layout import KIT_ROOT, bind_tree, lab_dirs, lab_of, selected

SOLUTION_LABS = lab_dirs(KIT_ROOT / "solutions")


@pytest.mark.parametrize("lab", SOLUTION_LABS, ids=lambda lab: lab.name)
def test_lab_has_every_part(lab):
    missing = [str(p.relative_to(KIT_ROOT)) for p in (
        KIT_ROOT / "labs" / lab.name / "README.md",
        KIT_ROOT / "labs" / lab.name / "src",
        KIT_ROOT / "tests" / lab.name,
        KIT_ROOT / "docs" / f"{lab.name}.md",
        lab.code_dir / "bugs.toml",
    ) if not p.exists()]
    assert not missing, f"{lab.name} lacks: {missing}"


@pytest.mark.parametrize("lab", SOLUTION_LABS, ids=lambda lab: lab.name)
def test_lab_marker_is_registered(lab):
    config = tomllib.loads((KIT_ROOT / "pyproject.toml").read_text())
    markers = [m.split(":")[0].strip() for m in config["tool"]["pytest"]["ini_options"]["markers"]]
    assert lab.marker in markers, f"register the marker {lab.marker} in pyproject.toml"


@pytest.mark.parametrize("lab", SOLUTION_LABS, ids=lambda lab: lab.name)
def test_readme_gives_the_exact_test_command(lab):
    readme = (KIT_ROOT / "labs" / lab.name / "README.md").read_text()
    assert f"uv run pytest -m {lab.marker}" in readme, f"labs/{lab.name}/README.md must give `uv run pytest -m {lab.marker}`"


def test_module_names_are_unique_across_labs():
    seen = {}
    for lab in SOLUTION_LABS:
        for m in lab.modules():
            assert m not in seen, f"module {m} is in both {seen[m]} and {lab.name}"
            seen[m] = lab.name


@pytest.mark.parametrize("where, lab", [
    ("tests/01_causal_mask/test_causal_mask.py::test_x[2-3]", "01_causal_mask"),
    ("tests/hidden/04_gpt_model/test_hidden_gpt.py::test_y", "04_gpt_model"),
    ("/home/x/10_courses/kit/labs/02_embeddings/src/embeddings.py", "02_embeddings"),
    (Path("solutions") / "05_gpt2_weights", "05_gpt2_weights"),
    ("tests/kit/test_layout.py::test_z[01_causal_mask/x]", None),
])
def test_lab_of_a_path_or_node_id(where, lab):
    assert lab_of(where) == lab


def test_bind_tree_puts_every_lab_first_in_lab_order(tmp_path, monkeypatch):
    for name in ("02_b", "01_a"):
        (tmp_path / name / "src").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "02_b" / "src"), "elsewhere"])
    bind_tree(tmp_path)
    assert sys.path == [str(tmp_path / "01_a" / "src"), str(tmp_path / "02_b" / "src"), "elsewhere"]
    with pytest.raises(ValueError, match="no lab folders"):
        bind_tree(tmp_path / "01_a")


def test_lab_selection_by_number_or_name():
    assert selected("03_layernorm_ffn", None) and selected("03_layernorm_ffn", [])
    assert selected("03_layernorm_ffn", ["01", "03"]) and selected("03_layernorm_ffn", ["03_layernorm_ffn"])
    assert not selected("03_layernorm_ffn", ["01", "02_embeddings"])


def test_concept_tests_run_before_the_live_comparisons():
    """Under -x the first failure is a lab's own test whenever one fails: each lab's
    tests stay together (hidden beside public), torch-marked tests last within the lab."""
    from types import SimpleNamespace

    from gptkit.testing.layout import concept_tests_first

    def item(nodeid, torch=False):
        return SimpleNamespace(nodeid=nodeid, fspath=nodeid.split("::")[0],
                               get_closest_marker=lambda name: object() if torch and name == "torch" else None)

    collected = [item("tests/08_llama/test_huggingface_live.py::a", torch=True),
                 item("tests/08_llama/test_llama.py::b"), item("tests/08_llama/test_llama.py::c"),
                 item("tests/09_encoder_decoder/test_huggingface_live.py::d", torch=True),
                 item("tests/09_encoder_decoder/test_seq2seq.py::e"),
                 item("tests/grader/test_batch.py::f"),
                 item("tests/hidden/08_llama/test_hidden_llama.py::g"),
                 item("tests/kit/test_layout.py::h")]
    order = [i.nodeid.rsplit("::", 1)[1] for i in concept_tests_first(collected)]
    assert order == ["b", "c", "g", "a", "e", "d", "f", "h"]
