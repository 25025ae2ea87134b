"""Lab 10 · live checks: your GPT-2 encoder against HuggingFace's GPT2TokenizerFast and
tiktoken (both built offline from the kit's GPT-2 files) on lab 07's whole Shakespeare
corpus and on the hard strings, and your trainer against the reference's stored merges
on the whole corpus. They need the torch extra (transformers and tiktoken come with it).
"""

import numpy as np
import pytest

from gptkit.data import gpt2_files
from gptkit.testing import lab, load_fixture
from gptkit.testing.gpt2_tokenizers import HARD_STRINGS
from gptkit.testing.layout import KIT_ROOT

pytestmark = pytest.mark.torch
T = lab("tokenizer")
LAB = "10_tokenizer"
CORPUS = KIT_ROOT / "labs" / "07_training" / "data" / "shakespeare.txt"
SKIP_REASON = "transformers or tiktoken is not installed: live tokenizer checks need `uv sync --extra torch`"


def _references():
    try:
        from gptkit.testing.gpt2_tokenizers import hf_gpt2_tokenizer, tiktoken_gpt2

        return hf_gpt2_tokenizer(), tiktoken_gpt2()
    except ImportError:
        pytest.skip(SKIP_REASON)


def _corpus() -> str:
    if not CORPUS.is_file():
        pytest.skip(f"lab 07's corpus {CORPUS.relative_to(KIT_ROOT)} is not in this copy of the kit")
    return CORPUS.read_text(encoding="utf-8")


def _first_difference(got, expected, what, tok):
    __tracebackhide__ = True
    got = [int(i) for i in got]
    if got == list(expected):
        return
    k = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    near = tok.decode(list(expected[max(0, k - 3):k + 3]))
    raise AssertionError(f"{what}: {len(got)} ids against {len(expected)}; the first difference is at id {k}, "
                         f"expected {list(expected[k:k + 3])}, got {got[k:k + 3]}, in the text {near!r}")


def test_gpt2_encode_equals_huggingface_and_tiktoken_on_shakespeare():
    hf, tk = _references()
    text = _corpus()
    tok = T.Tokenizer.from_gpt2_files(*gpt2_files())
    got = list(tok.encode(text))
    _first_difference(got, hf.encode(text), "GPT-2's encode of lab 07's Shakespeare against GPT2TokenizerFast", tok)
    _first_difference(got, tk.encode(text, allowed_special="all"), "… against tiktoken", tok)
    assert tok.decode(got) == text, "GPT-2's decode(encode(Shakespeare)) must give the corpus back"


def test_gpt2_encode_and_stream_equal_huggingface_and_tiktoken_on_hard_strings():
    hf, tk = _references()
    tok = T.Tokenizer.from_gpt2_files(*gpt2_files())
    for s in HARD_STRINGS:
        expected = hf.encode(s)
        assert expected == tk.encode(s, allowed_special="all")
        _first_difference(tok.encode(s), expected, f"GPT-2's encode({s!r}) against HuggingFace and tiktoken", tok)
        chunks = [s[i:i + 2] for i in range(0, len(s), 2)]
        _first_difference(tok.encode_iterable(chunks), expected, f"encode_iterable of {s!r} in 2-character chunks", tok)
        assert tok.decode(expected) == hf.decode(expected), f"decode of the ids of {s!r} against HuggingFace's"


def test_train_bpe_equals_the_reference_on_shakespeare():
    _references()
    f = load_fixture(LAB, "train_corpus")
    vocab, merges = T.train_bpe(_corpus(), int(f["vocab_size"]), [str(s) for s in f["specials"]])
    left = [bytes(f["left"][a:b].astype(np.uint8)) for a, b in zip(f["left_offsets"][:-1], f["left_offsets"][1:])]
    right = [bytes(f["right"][a:b].astype(np.uint8)) for a, b in zip(f["right_offsets"][:-1], f["right_offsets"][1:])]
    expected = list(zip(left, right))
    got = [(bytes(a), bytes(b)) for a, b in merges]
    k = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    assert k is None and len(got) == len(expected), (
        f"train_bpe on lab 07's Shakespeare (vocab_size {int(f['vocab_size'])}): "
        + (f"merge {k} differs: expected {expected[k]!r}, got {got[k]!r}" if k is not None else
           f"expected {len(expected)} merges, got {len(got)}")
        + ". The pair counts after each merge must equal a recount, ties going to the greatest pair by bytes")
