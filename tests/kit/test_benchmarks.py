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


PROBE = """
import io, contextlib, json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import common, stripped, threads_probe
common.use_reference_solutions()
import generation, gpt, inference
from gptkit.checkpoints import SMALL_SHAPES, random_gpt2_state

shape = SMALL_SHAPES["6 heads, n_inner"]
model = gpt.GPTModel(**shape.model_kwargs()).load_state_dict(random_gpt2_state(shape, np.random.default_rng(1))).eval()
cache = generation.KVCache(model, 1)
generation.forward_with_cache(model, np.array([[3, 1, 4, 1, 5]]), cache)
made = []
def record(x, W):
    made.append((W, x @ W))
    return made[-1][1]
hooked = stripped.gpt2_step(model, cache, record)(9, 5)
plain = stripped.gpt2_step(model, cache)(9, 5)
given = iter([y for _, y in made])
replayed = stripped.gpt2_step(model, cache, lambda x, W: next(given))(9, 5)
expected = [w for b in model.h for w in (b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight,
                                         b.mlp.c_proj.weight)]
originals = (inference._linear, inference._head, inference.attend_rows)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    threads_probe.decoder_parts(model, inference, np.random.default_rng(5), 3, steps=4, repeats=1, prompt=8)
print(json.dumps({
    "products": len(made), "layers": len(model.h),
    "weights_in_order": all(W is w for (W, _), w in zip(made, expected)),
    "head_is_the_table": made[-1][0].base is model.wte.weight,
    "hooked_equals_plain": bool((hooked == plain).all()), "replayed_equals_plain": bool((replayed == plain).all()),
    "restored": (inference._linear, inference._head, inference.attend_rows) == originals,
    "line": out.getvalue()}))
"""


def test_the_probe_takes_the_step_apart_through_every_weight_product():
    """``threads_probe.py`` times a stripped step's products alone and its other work alone by
    hooking every weight product: the hook must see each of them (4 per block, then the tied
    head) in the order the step meets them, and handing their results back must give the
    step's own logits; its decoder probe must leave lab 12's functions as it found them."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["products"] == 4 * got["layers"] + 1, f"the hook saw {got['products']} products in one step"
    assert got["weights_in_order"] and got["head_is_the_table"], "the hook saw other weights, or another order"
    assert got["hooked_equals_plain"] and got["replayed_equals_plain"], "the hooked step computes other logits"
    assert got["restored"], "decoder_parts left lab 12's _linear, _head or attend_rows patched"
    assert "lab 12 decoder, 3 streams" in got["line"] and "weight products" in got["line"], got["line"]
