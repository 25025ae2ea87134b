"""Hidden checks for lab 05: a checkpoint written here (no stored answers), read back
exactly, and greedy generation that agrees with the model's own argmax."""

import json

import numpy as np

from gptkit.testing import assert_close, lab
from gptkit.checkpoints import GPT2Shape, random_gpt2_state, safetensors_bytes

W = lab("gpt2_weights")
SHAPE = GPT2Shape(vocab_size=37, d_model=12, num_layers=2, num_heads=3, max_seq_len=15, d_ff=20,
                  layer_norm_eps=1e-4)


def _write(tmp_path, state, prefix="transformer."):
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes({prefix + k: v for k, v in state.items()}))
    (tmp_path / "config.json").write_text(json.dumps(SHAPE.hf_config()))
    return tmp_path


def test_round_trip_of_a_fresh_checkpoint(tmp_path):
    state = random_gpt2_state(SHAPE, np.random.default_rng(5050))
    state["lm_head.weight"] = state["wte.weight"]  # a tied head stored twice is dropped
    folder = _write(tmp_path, state)
    read = W.read_checkpoint(folder)
    del state["lm_head.weight"]
    assert sorted(read) == sorted(state), "read_checkpoint must return exactly GPT-2's parameter names"
    for k in state:
        assert_close(read[k], state[k], what=f"read_checkpoint: {k}", atol=0, rtol=0)
    model = W.load_gpt2(folder)
    assert abs(model.h[0].ln_1.eps - 1e-4) < 1e-12, "layer_norm_epsilon=1e-4 must reach the model's LayerNorms"


def test_greedy_follows_the_models_own_argmax(tmp_path):
    model = W.load_gpt2(_write(tmp_path, random_gpt2_state(SHAPE, np.random.default_rng(5051)), prefix=""))
    prompt = np.array([[3, 1, 4], [1, 5, 9]])
    out = W.generate_greedy(model, prompt.copy(), 6)
    for t in range(3, 9):
        expected = model(out[:, :t].copy())[:, -1].argmax(-1)
        assert np.array_equal(out[:, t], expected), f"token {t} is not the argmax of the logits at position {t - 1}"
