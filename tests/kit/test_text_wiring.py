"""Text in and out through lab 10's tokenizer, in the default install: the demo's
``--prompt`` (GPT-2's shipped files, no ``transformers``) and lab 07's trainer with
``--tokenizer bpe`` (bits per byte reported, samples printed as text)."""

import re
import subprocess
import sys

from gptkit.testing.layout import KIT_ROOT

# Run with transformers and tiktoken unimportable, as in the default install.
_NO_TORCH_EXTRA = ("import sys; sys.modules.update(transformers=None, tiktoken=None, tokenizers=None, torch=None); "
                   "import runpy; sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__')")


def _run(module, *args):
    return subprocess.run([sys.executable, "-c", _NO_TORCH_EXTRA, module, *args], cwd=KIT_ROOT,
                          capture_output=True, text=True, timeout=300)


def test_demo_prompt_goes_through_the_lab_tokenizer_without_transformers():
    out = _run("gptkit.demo", "--impl", "solutions", "--random", "--prompt", "To be, or not to be", "--tokens", "3")
    assert out.returncode == 0, out.stderr
    assert "prompt ids:    [2514, 307, 11, 393, 407, 284, 307]" in out.stdout, out.stdout
    assert "→ 'To be, or not to be'" in out.stdout and "gibberish" in out.stdout, out.stdout
    assert re.search(r"text: 'To be, or not to be.*'", out.stdout), out.stdout


def test_demo_prompt_on_an_unfinished_lab_10_names_it():
    out = _run("gptkit.demo", "--impl", "labs", "--random", "--prompt", "To be")
    assert out.returncode == 1 and "Lab" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_train_with_bpe_reports_bits_per_byte_and_samples_text(tmp_path):
    tiny = ["--impl", "solutions", "--block-size", "16", "--d-model", "16", "--layers", "1", "--heads", "2",
            "--batch-size", "2", "--eval-every", "2", "--eval-iters", "1", "--samples", "1", "--sample-tokens", "8",
            "--quiet", "--steps", "2", "--workers", "1"]
    bpe = _run("gptkit.train", *tiny, "--tokenizer", "bpe", "--vocab-size", "300", "--out", str(tmp_path / "bpe"))
    assert bpe.returncode == 0, bpe.stderr
    assert "44 merges learned" in bpe.stdout and "vocabulary 300" in bpe.stdout, bpe.stdout
    char = _run("gptkit.train", *tiny, "--out", str(tmp_path / "char"))
    assert char.returncode == 0, char.stderr
    for out in (bpe.stdout, char.stdout):
        assert re.search(r"validation loss \d+\.\d+ \(\d+\.\d+ bits per byte\)", out), out
        sample = out.split("--- sample 1")[1].split("\n", 1)[1].strip()
        # text (two steps of training make it noise), not a list of ids
        assert sample and not re.fullmatch(r"[\[\]\d,\s]+", sample), out
