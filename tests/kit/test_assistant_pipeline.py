"""``python -m gptkit.assistant`` and ``python -m gptkit.chat`` on the reference code: a tiny
run of the whole pipeline (SFT, RL, DPO) writes its models, and the chat command answers from
the RL model. Sizes of seconds: what is checked is the plumbing, never an accuracy."""

import json
import subprocess
import sys

from gptkit import arithmetic
from gptkit.testing.layout import KIT_ROOT


def _run(module, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=KIT_ROOT, capture_output=True, text=True,
                          input=stdin, timeout=300)


def test_the_tiny_pipeline_writes_models_the_chat_command_answers_from(tmp_path):
    out = tmp_path / "assistant"
    run = _run("gptkit.assistant", "--impl", "solutions", "--tiny", "--out", str(out))
    assert run.returncode == 0, run.stderr
    for phase in ("SFT:", "RL:", "DPO:", "held-out accuracy", "peak memory", "rl curve"):
        assert phase in run.stdout, run.stdout
    for name in ("sft", "rl", "dpo"):
        assert (out / name / "model.safetensors").is_file() and (out / name / "config.json").is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert len(results["rl_curve"]) == results["settings"]["rl_steps"] + 1, results["rl_curve"]

    chat = _run("gptkit.chat", "--impl", "solutions", "--model", str(out / "rl"),
                stdin="What is 12+34?\nWhat is 5+6?\n")
    assert chat.returncode == 0, chat.stderr
    lines = chat.stdout.splitlines()
    assert len(lines) == 2 and all(line.strip() for line in lines), chat.stdout  # one answer per question


def test_chat_without_a_tuned_model_names_the_command_to_run(tmp_path):
    chat = _run("gptkit.chat", "--impl", "solutions", "--model", str(tmp_path / "nothing"), stdin="What is 1+2?\n")
    assert chat.returncode == 2 and "python -m gptkit.assistant --impl solutions" in chat.stderr, chat.stderr
    assert len(chat.stderr.strip().splitlines()) == 1, chat.stderr  # one line, no traceback


def test_held_out_problems_are_never_drawn_for_training():
    held = arithmetic.held_out(seed=3, n=300)
    assert len(set(held)) == 300 and held == arithmetic.held_out(seed=3, n=300)  # distinct, and repeatable
    drawn = arithmetic.TrainingProblems(seed=3, stream=1, held=held).draw(5000)
    assert not set(drawn) & set(held)
    assert drawn[:50] == arithmetic.TrainingProblems(seed=3, stream=1, held=held).draw(50)
