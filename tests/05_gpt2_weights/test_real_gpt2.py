"""Lab 05 · the real GPT-2 small, when its weights are on this machine ($GPT2_DIR or the
HuggingFace cache). Nothing is downloaded: without the weights these tests skip and say
how to get them."""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab, real_checkpoint
from gptkit.checkpoints import HOW_TO_GET_GPT2, find_real_gpt2

W = lab("gpt2_weights")

# HuggingFace's own test of GPT-2 small: greedy from "The dog" (ids 464, 3290) to 20 tokens,
# "The dog was found in a field near the intersection of West and West Streets.\n\nThe dog".
THE_DOG = [464, 3290, 373, 1043, 287, 257, 2214, 1474, 262, 16246, 286, 2688, 290, 2688, 27262, 13, 198, 198,
           464, 3290]


@pytest.fixture(scope="module")
def gpt2():
    folder = real_checkpoint(find_real_gpt2, HOW_TO_GET_GPT2)
    return folder, W.load_gpt2(folder)


def test_real_gpt2_greedy_continuation_of_the_dog(gpt2):
    _, model = gpt2
    out = W.generate_greedy(model, np.array([THE_DOG[:2]]), len(THE_DOG) - 2)
    got = [int(t) for t in out[0]]
    assert got == THE_DOG, (
        f"greedy continuation of [464, 3290] ('The dog') must be HuggingFace's {THE_DOG}, got {got}")


@pytest.mark.torch
def test_real_gpt2_logits_match_huggingface(gpt2):
    from gptkit.testing.torchref import device, to_numpy, torch_or_skip

    torch = torch_or_skip()
    from transformers import GPT2LMHeadModel

    folder, model = gpt2
    hf = GPT2LMHeadModel.from_pretrained(folder).to(device()).eval()
    ids = np.array([THE_DOG, THE_DOG[::-1]])
    with torch.no_grad():
        expected = to_numpy(hf(torch.from_numpy(ids).to(device())).logits)
    assert_close(model(ids), expected, what="real GPT-2 small logits vs HuggingFace", atol=1e-3, rtol=0)
