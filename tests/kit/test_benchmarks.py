"""The decoding benchmarks' stripped decoders (``benchmarks/stripped.py``) decode what the
reference decoders decode: docs/performance.md's comparison of the two is only worth something
while they give the same tokens. Run in a child process, since it imports the reference
labs (solutions/) by module name, as the benchmarks do."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import common, stripped
common.use_reference_solutions()
import generation, gpt, llama
from gptkit.checkpoints import SMALL_SHAPES, random_gpt2_state
from gptkit.llama_checkpoints import LlamaShape, random_llama_state

results = {}
for name in ("2 heads", "6 heads, n_inner", "8 heads, eps 1e-3"):
    shape = SMALL_SHAPES[name]
    model = gpt.GPTModel(**shape.model_kwargs()).load_state_dict(
        random_gpt2_state(shape, np.random.default_rng(1))).eval()
    prompts = np.random.default_rng(2).integers(0, shape.vocab_size, (3, 1, 5))
    n = shape.max_seq_len - 5
    results["gpt2 " + name] = [[generation.generate(model, p, n, temperature=0).tolist() for p in prompts],
                               [stripped.gpt2_generate(model, p, n, generation).tolist() for p in prompts]]
for name, shape in {
    "GQA 4/2, tied": LlamaShape(vocab_size=61, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=40,
                               max_seq_len=30, tie_word_embeddings=True),
    "MHA, untied, theta 500, eps 1e-5": LlamaShape(vocab_size=50, d_model=24, num_layers=2, num_heads=3,
                                                   num_kv_heads=3, d_ff=36, max_seq_len=30, rms_norm_eps=1e-5,
                                                   rope_theta=500.0),
}.items():
    model = llama.LlamaModel(**shape.model_kwargs())
    model.load_state_dict({llama.model_name(k): llama.to_model_layout(llama.model_name(k), v)
                           for k, v in random_llama_state(shape, np.random.default_rng(3)).items()})
    prompts = np.random.default_rng(4).integers(0, shape.vocab_size, (3, 1, 4))
    n = shape.max_seq_len - 4
    results["llama " + name] = [[llama.generate(model, p, n).tolist() for p in prompts],
                                [stripped.llama_generate(model, p, n, llama).tolist() for p in prompts]]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def decoded():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", ["gpt2 2 heads", "gpt2 6 heads, n_inner", "gpt2 8 heads, eps 1e-3",
                                  "llama GQA 4/2, tied", "llama MHA, untied, theta 500, eps 1e-5"])
def test_stripped_decoder_gives_the_reference_tokens(decoded, name):
    reference, stripped = decoded[name]  # three prompts' tokens each
    assert len(stripped) == len(reference) == 3 and all(len(r[0]) > 20 for r in reference)
    assert stripped == reference, f"{name}: the stripped decoder parts from the reference"
    assert all(len(set(r[0])) > 3 for r in reference), "a decoder stuck on one token would not tell the two apart"
