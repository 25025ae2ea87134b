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


def test_demo_translates_with_a_marian_checkpoint(tmp_path):
    """--marian: a MarianMT checkpoint (here a tiny random one with swish (SiLU) and
    scaled embeddings) in the lab-09 model, token ids in and out; needs the torch extra."""
    from gptkit.testing.seq2seq import Seq2SeqShape, hf_marian, random_seq2seq_state
    from gptkit.testing.torchref import torch_or_skip

    torch_or_skip()
    shape = Seq2SeqShape(vocab_size=30, d_model=16, num_layers=1, num_heads=2, d_ff=24, max_seq_len=16,
                         activation="swish")
    hf_marian(random_seq2seq_state(shape, np.random.default_rng(0)), shape).save_pretrained(tmp_path / "marian")
    out = _demo("--marian", str(tmp_path / "marian"), "--ids", "5,6,7", "--tokens", "4", "--impl", "solutions")
    assert out.returncode == 0, out.stderr
    assert "activation 'swish'" in out.stdout and "translated ids:" in out.stdout, out.stdout
    out = _demo("--marian", str(tmp_path / "marian"), "--impl", "solutions")  # no tokenizer files there
    assert out.returncode != 0 and "--ids" in out.stdout + out.stderr, out.stdout + out.stderr
