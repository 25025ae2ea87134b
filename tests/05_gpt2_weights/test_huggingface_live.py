"""Lab 05 · live checks against HuggingFace: checkpoints written by ``save_pretrained`` from
models whose every parameter was randomised in PyTorch, in several shapes, and one
GPT-2-small-shaped (124M parameters) checkpoint. HuggingFace runs on CUDA when there is
one (TF32 off), on the CPU otherwise."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gptkit.testing import assert_close, lab
from gptkit.checkpoints import GPT2_SMALL, SMALL_SHAPES
from gptkit.testing.layout import KIT_ROOT
from gptkit.testing.torchref import device, to_numpy, torch_or_skip

pytestmark = pytest.mark.torch
W = lab("gpt2_weights")

SHAPES = {name: SMALL_SHAPES[name] for name in ('2 heads', '6 heads, n_inner', '1 head, eps 1e-3')}
EXACT_GELU = "GPT-2 computed with the exact (erf) GELU: GPT-2 uses the tanh form (gelu_new)"


def _randomised_model(shape, seed):
    """A GPT2LMHeadModel built by transformers, every parameter then randomised in torch."""
    torch = torch_or_skip()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = shape.hf_config()
    cfg.pop("model_type")
    model = GPT2LMHeadModel(GPT2Config(**cfg)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 2 and "wte" in name:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 2 and "wpe" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:  # Conv1D weights (in, out)
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / p.shape[0] ** 0.5))
    return model


def _hf_logits(model, ids):
    torch = torch_or_skip()
    with torch.no_grad():
        return to_numpy(model.to(device())(torch.from_numpy(ids).to(device())).logits)


def _hf_greedy(model, prompt, n):
    torch = torch_or_skip()
    p = torch.from_numpy(prompt).to(device())
    with torch.no_grad():
        out = model.to(device()).generate(p, attention_mask=torch.ones_like(p), max_new_tokens=n,
                                          do_sample=False, pad_token_id=0)
    return to_numpy(out)


def _exact_gelu_logits(model, ids):
    from transformers.activations import ACT2FN

    for block in model.transformer.h:
        block.mlp.act = ACT2FN["gelu"]
    return _hf_logits(model, ids)


def _first_difference(ours, theirs):
    b, t = (int(i) for i in np.argwhere(ours != theirs)[0])
    return f"row {b}, position {t}: HuggingFace chose {int(theirs[b, t])}, yours {int(ours[b, t])}"


@pytest.mark.parametrize("name", SHAPES)
def test_save_pretrained_checkpoint_matches(tmp_path, name):
    shape = SHAPES[name]
    hf = _randomised_model(shape, seed=len(name))
    hf.save_pretrained(tmp_path)
    model = W.load_gpt2(tmp_path)
    ids = np.random.default_rng(1).integers(0, shape.vocab_size, (2, shape.max_seq_len))
    expected = _hf_logits(hf, ids)  # before lab code sees ids, which it gets copies of
    assert_close(model(ids.copy()), expected, what=f"logits vs HuggingFace ({name})", atol=1e-4, rtol=1e-4)
    prompt = ids[:, :5]
    theirs = _hf_greedy(hf, prompt, 10)
    ours = W.generate_greedy(model, prompt.copy(), 10)
    assert np.array_equal(ours, theirs), f"greedy tokens differ from generate() ({name}): {_first_difference(ours, theirs)}"


@pytest.fixture(scope="module")
def gpt2_small_random(tmp_path_factory):
    """A GPT-2-small-shaped checkpoint (124M parameters), every parameter random."""
    folder = tmp_path_factory.mktemp("gpt2-small-random")
    hf = _randomised_model(GPT2_SMALL, seed=124)
    hf.save_pretrained(folder)
    return folder, hf


def test_gpt2_small_shaped_logits_match_to_1e3(gpt2_small_random):
    folder, hf = gpt2_small_random
    model = W.load_gpt2(folder)
    assert model.num_parameters() == sum(p.numel() for p in hf.transformer.parameters()), (
        "the loaded model must have exactly GPT-2 small's 124M parameters")
    ids = np.random.default_rng(2).integers(0, GPT2_SMALL.vocab_size, (2, 64))
    theirs = _hf_logits(hf, ids)
    ours = model(ids.copy())
    if not np.allclose(ours, theirs, atol=1e-3, rtol=0):
        diagnoses = {EXACT_GELU: _exact_gelu_logits(hf, ids)}
    else:
        diagnoses = None
    assert_close(ours, theirs, what="GPT-2-small-shaped logits vs HuggingFace (max |difference| ≤ 1e-3)",
                 atol=1e-3, rtol=0, diagnoses=diagnoses)


def test_gpt2_small_shaped_greedy_20_tokens(gpt2_small_random):
    folder, hf = gpt2_small_random
    model = W.load_gpt2(folder)
    prompt = np.array([[464, 3290], [50256, 11]])
    theirs = _hf_greedy(hf, prompt, 20)
    ours = W.generate_greedy(model, prompt.copy(), 20)
    assert np.array_equal(ours, theirs), f"20 greedy tokens differ from generate(): {_first_difference(ours, theirs)}"


def test_loading_needs_about_twice_the_checkpoint(gpt2_small_random):
    folder, _ = gpt2_small_random
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("peak memory is read from Linux's /proc/self (VmHWM), which this system lacks")
    size = (folder / "model.safetensors").stat().st_size
    # A fresh process, whose peak-RSS mark is reset once its imports are done: a child
    # started from this test would otherwise inherit this process's (larger) peak.
    code = (
        "import json, sys\n"
        f"sys.path[:0] = {sys.path!r}\n"
        "import numpy, gpt2_weights\n"
        "def kib(key):\n"
        "    with open('/proc/self/status') as fh:\n"
        "        return int(next(line for line in fh if line.startswith(key)).split()[1])\n"
        "with open('/proc/self/clear_refs', 'w') as fh:\n"
        "    fh.write('5')\n"
        "base = kib('VmRSS:')\n"
        f"model = gpt2_weights.load_gpt2({str(folder)!r})\n"
        "print(json.dumps([base, kib('VmHWM:')]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=KIT_ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    base, peak = json.loads(out.stdout.strip().splitlines()[-1])
    used = (peak - base) * 1024
    assert used > 0.9 * size, f"the measurement is broken: loading a {size / 1e6:.0f} MB checkpoint seemed to take {used / 1e6:.0f} MB"
    assert used < 2.3 * size, (
        f"loading a {size / 1e6:.0f} MB checkpoint took {used / 1e6:.0f} MB at peak ({used / size:.1f}× its size): "
        "read each tensor once and do not keep extra copies of the weights")
