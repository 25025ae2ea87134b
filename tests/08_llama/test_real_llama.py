"""Lab 08 · a real Llama-family checkpoint, when one is on this machine ($LLAMA_DIR or any
HuggingFace-cache snapshot whose config.json says model_type "llama"). Nothing is
downloaded: without one these tests skip and say how to get one."""

import numpy as np
import pytest

from gptkit.llama_checkpoints import HOW_TO_GET_LLAMA, find_real_llama
from gptkit.testing import assert_close, lab, real_checkpoint

L = lab("llama")
IDS = np.array([[1, 415, 5565, 302, 4843, 349, 5465, 28723, 415]])  # any ids below 32000 do


@pytest.fixture(scope="module")
def real():
    folder = real_checkpoint(find_real_llama, HOW_TO_GET_LLAMA)
    return folder, L.load_llama(folder)


@pytest.mark.torch
def test_real_llama_matches_huggingface(real):
    from gptkit.testing.torchref import device, to_numpy, torch_or_skip

    torch = torch_or_skip()
    from transformers import LlamaForCausalLM

    folder, model = real
    hf = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
    hf = hf.to(device()).eval()
    ids = IDS % model.vocab_size
    with torch.no_grad():
        expected = to_numpy(hf(torch.from_numpy(ids).to(device())).logits)
        p = torch.from_numpy(ids[:, :4]).to(device())
        greedy = to_numpy(hf.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=8, do_sample=False,
                                      pad_token_id=0))
    assert_close(model(ids), expected, what=f"real Llama ({folder.name}) logits vs HuggingFace", atol=2e-3, rtol=0)
    ours = np.asarray(L.generate(model, ids[:, :4], 8))
    assert np.array_equal(ours, greedy), f"real Llama greedy: HuggingFace {greedy.tolist()}, yours {ours.tolist()}"
