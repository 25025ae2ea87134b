"""Lab 09 · a real MarianMT checkpoint (an opus-mt translation model), when one is on this
machine ($MARIAN_DIR or the HuggingFace cache). Nothing is downloaded: without one the test
skips and says how to get one. Its config names the activation (it may be "swish", SiLU)
and whether embeddings are scaled; the model follows it."""

import numpy as np
import pytest

from gptkit.testing import assert_close, lab, real_checkpoint
from gptkit.testing.parameters import set_parameters
from gptkit.testing.seq2seq import HOW_TO_GET_MARIAN, find_real_marian, marian_as_lab09

M = lab("seq2seq")


@pytest.mark.torch
def test_real_marian_matches_huggingface():
    from gptkit.testing.torchref import torch_or_skip

    folder = real_checkpoint(find_real_marian, HOW_TO_GET_MARIAN)
    torch = torch_or_skip()
    from transformers import MarianMTModel

    hf = MarianMTModel.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    kwargs, state = marian_as_lab09(hf)
    model = set_parameters(M.EncoderDecoderModel(**kwargs, rng=np.random.default_rng(0)), state,
                           f"EncoderDecoderModel for {folder.name}")
    pad, eos = int(hf.config.pad_token_id), int(hf.config.eos_token_id)
    src = np.array([[120, 33, 2045, 9, 570, 4, eos], [88, 1700, 12, eos, pad, pad, pad]]) % kwargs["vocab_size"]
    tgt = np.array([[pad, 25, 91, 7], [pad, 301, 5, 66]]) % kwargs["vocab_size"]
    keep = src != pad
    with torch.no_grad():
        expected = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(keep).long(),
                      decoder_input_ids=torch.from_numpy(tgt)).logits.numpy()
        greedy = hf.generate(torch.from_numpy(src), attention_mask=torch.from_numpy(keep).long(), max_new_tokens=8,
                             do_sample=False, num_beams=1, forced_eos_token_id=None, bad_words_ids=None).numpy()
    assert_close(model(src, tgt), expected, what=f"real MarianMT ({folder.name}) logits vs HuggingFace", atol=2e-3,
                 rtol=1e-3)
    ours = np.asarray(M.greedy_decode(model, src, 8, eos_id=eos))
    assert ours.shape == greedy.shape and np.array_equal(ours, greedy), (
        f"real MarianMT greedy decoding: HuggingFace {greedy.tolist()}, yours {ours.tolist()}")
