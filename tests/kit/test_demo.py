"""The end-to-end demo a student runs: their checkpoint reader and model, greedy tokens out."""

import subprocess
import sys

import numpy as np

from gptkit.checkpoints import GPT2Shape, random_gpt2_state, write_checkpoint
from gptkit.testing.layout import KIT_ROOT


def _demo(*args):
    return subprocess.run([sys.executable, "-m", "gptkit.demo", *args], cwd=KIT_ROOT, capture_output=True,
                          text=True, timeout=120)


def test_demo_generates_from_a_checkpoint_folder(tmp_path):
    shape = GPT2Shape(vocab_size=50, d_model=16, num_layers=1, num_heads=2, max_seq_len=12)
    folder = write_checkpoint(tmp_path / "ckpt", random_gpt2_state(shape, np.random.default_rng(0)), shape)
    out = _demo(str(folder), "--ids", "3,4,5", "--tokens", "4", "--impl", "solutions")
    assert out.returncode == 0, out.stderr
    assert "prompt ids:    [3, 4, 5]" in out.stdout and "generated ids:" in out.stdout, out.stdout
    generated = out.stdout.split("generated ids:")[1].splitlines()[0]
    assert len(generated.strip(" []").split(",")) == 4, out.stdout


def test_demo_runs_without_any_weights():
    out = _demo("--random", "--ids", "1,2", "--tokens", "3", "--impl", "solutions")
    assert out.returncode == 0 and "generated ids:" in out.stdout, out.stdout + out.stderr


def test_demo_on_unfinished_labs_names_the_lab():
    out = _demo("--random", "--ids", "1,2")
    assert out.returncode == 1 and "Lab 0" in out.stderr and "uv run pytest -m lab0" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_demo_explains_missing_weights_and_bad_ids(tmp_path):
    out = _demo(str(tmp_path), "--ids", "1", "--impl", "solutions")
    assert out.returncode == 1 and "config.json" in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = _demo("--random", "--ids", "one,two", "--impl", "solutions")
    assert out.returncode == 2 and "--ids must be comma-separated integers" in out.stderr, out.stderr
