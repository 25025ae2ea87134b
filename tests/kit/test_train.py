"""``python -m gptkit.train`` on the reference code: a tiny model for a few steps writes a
checkpoint lab 05 reads, resumes from it at the step it stopped, and prints samples."""

import json
import resource
import shutil
import subprocess
import sys

import pytest

from gptkit.testing.layout import KIT_ROOT

TINY = ["--impl", "solutions", "--block-size", "16", "--d-model", "16", "--layers", "1", "--heads", "2",
        "--batch-size", "2", "--eval-every", "2", "--eval-iters", "1", "--samples", "1", "--sample-chars", "20",
        "--quiet"]


def _train(*args):
    return subprocess.run([sys.executable, "-m", "gptkit.train", *TINY, *args], cwd=KIT_ROOT, capture_output=True,
                          text=True, timeout=120)


def test_train_checkpoint_and_resume(tmp_path):
    out = tmp_path / "run"
    first = _train("--steps", "3", "--out", str(out), "--workers", "2")
    assert first.returncode == 0, first.stderr
    # the reference's gradients, batch rows on 2 threads, agreed with one plain call
    assert "each batch in 2 shards" in first.stdout, first.stdout
    assert "validation loss" in first.stdout and "--- sample 1" in first.stdout, first.stdout
    for name in ("model.safetensors", "config.json", "optimizer.safetensors", "history.json"):
        assert (out / name).is_file(), f"no {name} in the run folder"
    assert json.loads((out / "config.json").read_text())["n_embd"] == 16
    again = _train("--steps", "4", "--out", str(out), "--resume")
    assert again.returncode == 0, again.stderr
    assert "steps 3 … 4" in again.stdout and "trained 1 steps" in again.stdout, again.stdout


_KEEPS_STATE = """
import threading
_both_in = threading.Barrier(2, timeout=30)


def loss_and_grads(model, token_ids, targets, *, rng=None):
    model.last_batch = token_ids  # one call's values on the shared model: the other shard overwrites them
    if threading.current_thread() is not threading.main_thread():
        _both_in.wait()
    return _loss_and_grads(model, model.last_batch, targets, rng=rng)
"""


def test_train_on_code_that_keeps_state_on_the_model_trains_one_batch_at_a_time(tmp_path):
    impl = tmp_path / "impl"
    shutil.copytree(KIT_ROOT / "solutions", impl, ignore=shutil.ignore_patterns("__pycache__"))
    code = impl / "07_training" / "training.py"
    text = code.read_text(encoding="utf-8").replace("def loss_and_grads(", "def _loss_and_grads(", 1)
    code.write_text(text + _KEEPS_STATE, encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "gptkit.train", *TINY, "--impl", str(impl), "--steps", "2",
                          "--workers", "2", "--out", str(tmp_path / "run")], cwd=KIT_ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "does it keep state on the model" in out.stdout and "Training one batch at a time" in out.stdout, \
        out.stdout
    assert "trained 2 steps" in out.stdout, out.stdout


def test_train_refuses_a_negative_worker_count(tmp_path):
    out = _train("--steps", "1", "--out", str(tmp_path / "run"), "--workers", "-2")
    assert out.returncode != 0 and "--workers must be 1 or more" in out.stderr and "Traceback" not in out.stderr, \
        out.stderr


def test_train_on_a_stub_says_which_lab(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gptkit.train", "--impl", "labs", "--steps", "1", "--quiet",
                          "--out", str(tmp_path / "run")], cwd=KIT_ROOT, capture_output=True, text=True, timeout=120)
    if out.returncode == 0:
        pytest.skip("labs/ holds finished code here, not stubs: no unfinished lab to report")
    assert out.returncode == 1 and "Lab 0" in out.stderr and "uv run pytest -m lab0" in out.stderr, out.stderr


_REUSE = """
import resource, sys
import numpy as np
from gptkit.command import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
n = (3 << 20) // 4  # 3 MB float32 arrays: under the 4 MB from which NumPy asks for huge pages

def step():  # three temporaries, allocated, written and freed, as in a training step
    a = np.ones(n, np.float32)
    b = a * 2
    return float((b + a)[0])

step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_keep_freed_memory_lets_a_loop_reuse_its_temporaries():
    def faults(mode):
        out = subprocess.run([sys.executable, "-c", _REUSE, mode], cwd=KIT_ROOT, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        kept, count = out.stdout.split()
        return kept, int(count)

    kept, with_setting = faults("keep")
    if kept != "True":
        pytest.skip("this C library has no glibc mallopt: keep_freed_memory sets nothing here")
    pages = (3 << 20) // resource.getpagesize()
    if with_setting >= pages:  # only then is the plain run worth its subprocess: for the message
        _, without = faults("plain")
        pytest.fail(f"20 steps that each allocate and free three 3 MB arrays page-faulted {with_setting} times "
                    f"with keep_freed_memory ({without} without it): freed blocks should be reused, under one "
                    f"array's {pages} pages in all")
