"""The draft model of lab 12's speculative decoding (``gptkit/data/shakespeare_bpe_draft``,
made by ``python -m gptkit.shakespeare_model --draft``): what is shipped is what the command
makes, lab 05 loads it, and it speaks the target's tokens well enough to propose them."""

import json
import subprocess
import sys

from gptkit.shakespeare_model import DRAFT_OUT, OUT, settings
from gptkit.testing.layout import KIT_ROOT


def test_shipped_draft_is_what_the_command_makes():
    config = json.loads((DRAFT_OUT / "config.json").read_text())
    args = settings(draft=True)

    def setting(flag):
        return int(args[args.index(flag) + 1])

    assert (config["n_layer"], config["n_head"], config["n_embd"], config["n_positions"], config["vocab_size"]) == (
        setting("--layers"), setting("--heads"), setting("--d-model"), setting("--block-size"),
        setting("--vocab-size"))
    target = json.loads((OUT / "config.json").read_text())
    assert (config["vocab_size"], config["n_positions"]) == (target["vocab_size"], target["n_positions"])
    assert config["n_layer"] < target["n_layer"] and config["n_embd"] < target["n_embd"], "the draft must be smaller"
    size = sum(p.stat().st_size for p in DRAFT_OUT.iterdir())
    assert size < 1_000_000, f"the draft model takes {size} bytes; it is shipped, so it stays under 1 MB"
    assert "python -m gptkit.shakespeare_model --draft" in (DRAFT_OUT / "README.md").read_text()


# Lab 05 loads both models; on the stored lines the draft's next-token loss beats a uniform
# guess by a wide margin, and its greedy choice is often the target's (what it proposes).
SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import common
common.use_reference_solutions()
import generation, gpt2_weights
from gptkit.shakespeare_model import DRAFT_OUT, OUT
target, draft = gpt2_weights.load_gpt2(OUT).eval(), gpt2_weights.load_gpt2(DRAFT_OUT).eval()
lines = [row["ids"] for row in json.loads((OUT / "lines.json").read_text())]
losses, agree, total = [], 0, 0
for ids in lines:
    ids = np.array([ids])
    losses.append(float(generation.next_token_loss(draft, ids)))
    same = target(ids)[0].argmax(-1) == draft(ids)[0].argmax(-1)
    agree, total = agree + int(same.sum()), total + same.size
print(json.dumps({"loss": float(np.mean(losses)), "agree": agree / total, "vocab": draft.vocab_size,
                  "layers": len(draft.h)}))
"""


def test_draft_loads_and_proposes_the_targets_tokens():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=KIT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["vocab"] == 1024 and found["layers"] == 1, found
    assert found["loss"] < 5.5, f"the draft's loss on the stored lines is {found['loss']:.2f} (uniform: 6.93)"
    assert found["agree"] > 0.3, f"the draft's greedy token is the target's at only {found['agree']:.0%} of positions"


def test_draft_command_writes_a_draft(tmp_path):
    out = tmp_path / "draft"
    done = subprocess.run([sys.executable, "-m", "gptkit.shakespeare_model", "--draft", "--impl", "solutions",
                           "--steps", "2", "--out", str(out)], cwd=KIT_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "history.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["n_layer"] == 1
    assert "--draft --impl solutions --steps 2" in (out / "README.md").read_text()
