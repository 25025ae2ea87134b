"""Tests that cannot be gamed: a lab that only gets the shapes right scores 0.

``gptkit.testing.impostors`` wraps the reference so that every function and method of a
lab returns zeros of the right shapes and dtypes. Shape, dtype, error and property tests
pass for it; through the rubric (``requires`` in grader/rubric.toml) they earn nothing
unless the value tests of their task pass, and every value test fails. Only the tests
that earn points on their own are run (the rest earn nothing whatever they do), so this
costs about one failing run of each lab's value tests.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from grader.catalogue import Bug, Edit, bugged_tree
from gptkit.testing import impostors
from gptkit.testing.layout import KIT_ROOT, lab_dirs
from grader.rubric import load_rubric

RUBRIC = load_rubric()
# The labs whose rubric entry gates its shape and property tests (the others: to do).
LABS = [lab.name for lab in lab_dirs(KIT_ROOT / "solutions") if RUBRIC.get(lab.name) and RUBRIC[lab.name].requires]


@dataclass
class Record:
    nodeid: str
    outcome: str
    points: float
    message: str = ""


PLUGIN = """
import json, os

outcomes = {}

def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        outcomes.setdefault(report.nodeid, report.outcome if report.when == "call" or report.skipped else "error")

def pytest_sessionfinish(session):
    with open(os.environ["KIT_OUTCOMES"], "w") as fh:
        json.dump(outcomes, fh)
"""


def _pytest(tree, args: list[str], folder) -> tuple[str, dict[str, str]]:
    """Runs the kit's tests on ``tree``: (the output, {node id: passed | failed | skipped | error})."""
    (folder / "kit_outcomes.py").write_text(PLUGIN, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]),
           "KIT_OUTCOMES": str(folder / "outcomes.json")}
    cmd = [sys.executable, "-m", "pytest", f"--impl={tree}", "-q", "-p", "no:cacheprovider", "-p", "kit_outcomes",
           *args]
    done = subprocess.run(cmd, cwd=KIT_ROOT, capture_output=True, text=True, timeout=900, env=env)
    path = folder / "outcomes.json"
    return done.stdout + done.stderr, (json.loads(path.read_text()) if path.is_file() else {})


def _lab_folders(lab: str) -> list[str]:
    return [str(p.relative_to(KIT_ROOT)) for p in (KIT_ROOT / "tests" / lab, KIT_ROOT / "tests" / "hidden" / lab)
            if p.is_dir()]


@pytest.fixture(scope="module")
def zeros_run(tmp_path_factory):
    """{lab: (every graded test id, {id run: passed})} for the zeros impostor."""
    if not LABS:
        pytest.skip("no lab has rubric requirements yet")
    folder = tmp_path_factory.mktemp("zeros")
    tree = impostors.build_tree(folder / "tree", "zeros", KIT_ROOT / "solutions", LABS)
    marks = " or ".join(f"lab{lab[:2]}" for lab in LABS)
    folders = [f for lab in LABS for f in _lab_folders(lab)]
    out, _ = _pytest(tree, ["--collect-only", "-m", f"({marks}) and not torch", *folders], folder)
    ids = [line.strip() for line in out.splitlines() if "::" in line and line.startswith("tests/")]
    by_lab = {lab: [n for n in ids if f"/{lab}/" in n] for lab in LABS}
    alone = [n for lab in LABS for n in by_lab[lab] if not RUBRIC[lab].required(n, by_lab[lab])]
    out, outcomes = _pytest(tree, alone, folder)
    graded = {lab: [n for n in by_lab[lab] if outcomes.get(n) != "skipped"] for lab in LABS}  # as the grader
    passed = {n: o == "passed" for n, o in outcomes.items()}
    return {lab: (graded[lab], passed) for lab in LABS}, out


def _score(lab: str, outcomes: dict[str, bool]) -> float:
    rubric = RUBRIC[lab]
    points = rubric.split(list(outcomes))
    records = [Record(n, "passed" if ok else "failed", points[n] if ok else 0.0) for n, ok in outcomes.items()]
    rubric.withhold(records)
    return round(sum(r.points for r in records), 6)


@pytest.mark.parametrize("lab", LABS)
def test_a_lab_of_zeros_of_the_right_shapes_scores_nothing(zeros_run, lab):
    runs, out = zeros_run
    ids, passed = runs[lab]
    assert ids, f"no test of {lab} was collected:\n{out[-2000:]}"
    alone = [n for n in ids if not RUBRIC[lab].required(n, ids)]
    missing = [n for n in alone if n not in passed]
    assert not missing, f"{len(missing)} test(s) of {lab} gave no result, e.g. {missing[0]}:\n{out[-2000:]}"
    earned = [n for n in alone if passed[n]]
    assert not earned, (f"{lab}: these tests pass for functions that return zeros of the right shape and earn "
                        f"points on their own; give each a `requires` entry in grader/rubric.toml naming its "
                        f"task's value tests (or make it check a value): {', '.join(earned)}")
    # The tests that need others: at worst they pass too; the rubric gives them nothing.
    worst = {n: passed.get(n, True) for n in ids}
    assert _score(lab, worst) == 0.0
    assert _score(lab, dict.fromkeys(ids, True)) == pytest.approx(RUBRIC[lab].points), (
        "the reference, passing every test, must score full marks")


def test_requirements_name_tests_that_exist():
    """A pattern in `requires` that matches no test (a renamed test) would silently ungate."""
    for lab, rubric in RUBRIC.items():
        files = {p.name: p.read_text(encoding="utf-8") for folder in _lab_folders(lab)
                 for p in (KIT_ROOT / folder).glob("test_*.py")}
        names = {f"{name}::{m}" for name, text in files.items() for m in re.findall(r"^def (test_\w+)", text, re.M)}
        for pattern, reqs in rubric.requires.items():
            for p in (pattern, *reqs):
                assert any(fnmatch.fnmatchcase(n, p) for n in names), f"{lab}: requires names {p!r}, which no test is"



# Labs whose tests are checked against the scramble impostor here (each costs one run of the
# lab's tests without torch; the other labs: `python -m gptkit.testing.impostors scramble`).
SCRAMBLED = ["01_causal_mask", "02_embeddings", "03_layernorm_ffn"]


def test_no_test_reads_back_the_arguments_it_passed(tmp_path):
    """Every result right, every array argument spoiled after the call: a test still passes
    unless it reads what it passed (an expectation computed after the call, an input used
    twice), or checks that inputs are left alone (it says so: arguments_written_back)."""
    tree = impostors.build_tree(tmp_path / "tree", "scramble", KIT_ROOT / "solutions", SCRAMBLED)
    marks = " or ".join(f"lab{lab[:2]}" for lab in SCRAMBLED)
    folders = [f for lab in SCRAMBLED for f in _lab_folders(lab)]
    out, outcomes = _pytest(tree, ["-m", f"({marks}) and not torch", *folders], tmp_path)
    assert outcomes, out[-2000:]
    opted_in = {f"{path.relative_to(KIT_ROOT)}::{name}" for folder in folders
                for path in (KIT_ROOT / folder).glob("test_*.py")
                for name, body in re.findall(r"^def (test_\w+)(.*?)(?=^def |\Z)", path.read_text(encoding="utf-8"),
                                             re.M | re.S) if "arguments_written_back" in body}
    bad = sorted(n for n, o in outcomes.items() if o in ("failed", "error") and n.split("[")[0] not in opted_in)
    assert not bad, ("these tests fail when lab code gives the right results but spoils its array arguments "
                     "afterwards: each reads an array it passed to lab code (pass a copy; compute what it expects "
                     f"before the call): {', '.join(bad)}")


# Impostors written against labs 10, 11 and 12: the reference with one task faked so that a
# property, count or starting-value test still holds. Each may earn the points of the
# tests it really does (`earns`: name prefixes), never those of the task it fakes.
TOKENIZER = "tokenizer.py"
ASSISTANT = "assistant.py"
INFERENCE = "inference.py"
IMPOSTORS = {
    "a byte-for-byte tokenizer: no merges learned or applied, GPT-2's files never read": (
        "10_tokenizer", (
            Edit(TOKENIZER, "        raise TypeError(f\"train_bpe's text must be a str, got {type(text).__name__}\")\n",
                 "        raise TypeError(f\"train_bpe's text must be a str, got {type(text).__name__}\")\n"
                 "    return ({i: bytes([i]) for i in range(256)} | {256 + k: s.encode() for k, s in enumerate(specials)},"
                 " [])\n"),
            Edit(TOKENIZER, "        ids = [self._byte_ids[b] for b in word]\n        while len(ids) > 1:\n",
                 "        ids = [self._byte_ids[b] for b in word]\n        return ids\n        while len(ids) > 1:\n"),
            Edit(TOKENIZER, "        to_byte = {ch: b for b, ch in bytes_to_unicode().items()}\n",
                 "        return cls({i: bytes([i]) for i in range(256)}, [], special_tokens)\n"),
        ), "", ("test_byte_map", "test_pretokenize", "test_split_on_special", "test_merge_word", "test_decode")),
    "DPO's loss a constant log 2": (
        "11_assistant", (
            Edit(ASSISTANT, "    loss = np.logaddexp(0.0, -z).mean()\n", "    loss = np.log(2.0)\n"),
        ), "dpo", ("test_dpo_gradient_check",)),
    "plain REINFORCE: no clip, and a KL that is always 0": (
        "11_assistant", (
            Edit(ASSISTANT, "    d = logp_ref - logp\n    return np.exp(d) - d - 1.0\n", "    return np.zeros_like(logp)\n"),
            Edit(ASSISTANT, "    objective = np.minimum(unclipped, clipped) - kl_coef * k3  # (B, L)\n",
                 "    objective = unclipped\n"),
            Edit(ASSISTANT, "    dobjective = np.where(clip_active, 0.0, ratio * A) - kl_coef * (1.0 - np.exp(d))\n",
                 "    dobjective = ratio * A\n"),
        ), "grpo or kl_k3 or identical_policy or zero_advantage_gives", ()),
    "lab 06's greedy generate as speculative greedy decoding, its statistics made up from k": (
        "12_inference", (
            Edit(INFERENCE, "    eos = _check_eos(eos, target.vocab_size)\n    ### BEGIN SOLUTION prefill all but the last token;",
                 "    eos = _check_eos(eos, target.vocab_size)\n"
                 "    from generation import generate\n"
                 "    tokens = generate(target, prompt[None], max_new_tokens, temperature=0.0, eos_token_id=eos)[0]\n"
                 "    m = len(tokens) - len(prompt)\n"
                 "    return tokens, {\"proposed\": m - -(-m // (k + 1)), \"accepted\": m - -(-m // (k + 1)),"
                 " \"rounds\": -(-m // (k + 1))}\n"
                 "    ### BEGIN SOLUTION prefill all but the last token;"),
        ), "speculative_greedy or speculative_counts", ()),
    "untiled attention (the whole T × S score matrix) reporting its tiles by a formula": (
        "12_inference", (
            Edit(INFERENCE, "    lead = q.shape[:-2]\n    dtype = np.result_type(q, k, v)\n",
                 "    scores = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])\n"
                 "    scores[..., np.arange(S)[None, :] > (S - T + np.arange(T))[:, None]] = -np.inf\n"
                 "    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))\n"
                 "    whole = ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(np.result_type(q, k, v))\n"
                 "    rows, cols = -(-T // block_q), -(-S // block_k)\n"
                 "    seen = sum(min(cols, (S - T + min((i + 1) * block_q, T) - 1) // block_k + 1) for i in range(rows))\n"
                 "    return (whole, {\"tiles_total\": rows * cols, \"tiles_visited\": seen}) if return_stats else whole\n"
                 "    lead = q.shape[:-2]\n    dtype = np.result_type(q, k, v)\n"),
        ), "tiled or tiles", ("test_tiled_attention_matches", "test_tiled_attention_any_tiles",
                              "test_tiled_attention_when_every", "test_tiled_attention_is_float32",
                              "test_tiled_attention_keeps_float64")),
}


@pytest.mark.parametrize("name", list(IMPOSTORS))
def test_an_impostor_earns_only_what_it_really_does(tmp_path, name):
    lab, edits, select, earns = IMPOSTORS[name]
    bug = Bug(lab, "impostor", name, edits, ())
    folders = _lab_folders(lab)
    with bugged_tree(bug) as tree:
        out, outcomes = _pytest(tree, ["-m", f"lab{lab[:2]} and not torch", *(["-k", select] if select else []),
                                       *folders], tmp_path)
    assert outcomes, out[-2000:]
    passed = {n: o == "passed" for n, o in outcomes.items() if o != "skipped"}
    unmet = RUBRIC[lab].unmet(passed)
    earned = sorted(n for n, ok in passed.items() if ok and n not in unmet
                    and not n.split("::")[-1].startswith(earns or ("\0",)))
    assert not earned, (f"{lab}, {name}: these tests pass for it and earn points; make them check a value, or give "
                        f"each a `requires` entry in grader/rubric.toml naming its task's value tests: "
                        f"{', '.join(earned)}")
