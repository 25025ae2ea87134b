"""Fixtures for lab 10, made by HuggingFace's GPT2TokenizerFast and tiktoken (both built
offline from the kit's GPT-2 files) and by the reference trainer.

- ``byte_map``: GPT-2's byte → character map, as transformers has it.
- ``gpt2_hard``: the hard strings of ``gptkit.testing.gpt2_tokenizers`` with GPT-2's ids
  (HuggingFace and tiktoken agree on every one; the recipe checks it) and their
  pre-tokens; and HuggingFace's decoding of every prefix of one string's ids, many of
  them cut in the middle of a character.
- ``gpt2_stream``: strings that put special tokens, whitespace runs and contractions
  where a chunk may end, with GPT-2's ids (HuggingFace and tiktoken agree on each), for
  the streaming encoder cut at every point.
- ``train_sample`` / ``train_ties``: the reference trainer's merges on a Shakespeare
  sample with ``<|endoftext|>`` between its parts, and on a corpus of short random words
  over four letters, where most steps are decided by the tie-break.
- ``train_corpus``: its 1,000 merges on lab 07's whole corpus (the corpus itself is not
  stored: the live test reads it).
"""

import numpy as np

from gptkit.data import ENDOFTEXT, gpt2_files
from gptkit.testing.gpt2_tokenizers import HARD_STRINGS, hf_byte_map, hf_gpt2_tokenizer, tiktoken_gpt2
from gptkit.testing.layout import KIT_ROOT

NEEDS_TORCH = True
CORPUS = KIT_ROOT / "labs" / "07_training" / "data" / "shakespeare.txt"
CUT_STRING = "naïve € 👨‍👩‍👧 日本"
E = ENDOFTEXT
STREAM_STRINGS = [
    f"a\n\n{E}",                       # a whitespace run, then a special token cut anywhere
    f"x  \n\t {E}  y{E}{E}\n\n",
    f"I'll  've{E}'s\n\n\n'd they're",   # contractions after a special token and a run
    f"don't\r\n\r\n{E}we'LL   go",
    f"\u3000\u3000{E}\u3000 a\n\n\n\n",  # Unicode whitespace
    f"<|endoftext|\n\n<|{E}|>\n \n",      # near-misses of the special token
    f"   {E}   ",
]


def ragged(items, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A list of sequences as one flat array and the offsets (len + 1) that cut it."""
    offsets = np.cumsum([0, *(len(x) for x in items)]).astype(np.int64)
    flat = np.concatenate([np.asarray(list(x), dtype) for x in items]) if items else np.zeros(0, dtype)
    return flat.astype(dtype), offsets


def _strings(items) -> np.ndarray:
    return np.array(items, dtype=str) if items else np.zeros(0, "U1")


def _byte_map(tok) -> dict:
    chars = hf_byte_map()
    assert tok.bytes_to_unicode() == chars, "the reference byte map is not transformers'"
    return {"chars": _strings([chars[b] for b in range(256)])}


def _gpt2_hard(tok) -> dict:
    hf, tk = hf_gpt2_tokenizer(), tiktoken_gpt2()
    ref = tok.Tokenizer.from_gpt2_files(*gpt2_files())
    ids, pretokens = [], []
    for s in HARD_STRINGS:
        a, b = hf.encode(s), tk.encode(s, allowed_special="all")
        assert a == b == ref.encode(s), f"HuggingFace, tiktoken and the reference disagree on {s!r}"
        ids.append(a)
        pieces = [p for piece in tok.split_on_special(s, [ENDOFTEXT]) for p in
                  ([piece] if piece == ENDOFTEXT else tok.pretokenize(piece))]
        assert "".join(pieces) == s
        pretokens.append(pieces)
    flat_ids, id_offsets = ragged(ids, np.int64)
    cut_ids = hf.encode(CUT_STRING)
    cut_text = [hf.decode(cut_ids[:k]) for k in range(len(cut_ids) + 1)]
    assert cut_text == [ref.decode(cut_ids[:k]) for k in range(len(cut_ids) + 1)]
    return {
        "text": _strings(HARD_STRINGS),
        "ids": flat_ids, "id_offsets": id_offsets,
        "pretokens": _strings([p for ps in pretokens for p in ps]),
        "pretoken_counts": np.array([len(ps) for ps in pretokens], np.int64),
        "cut_ids": np.array(cut_ids, np.int64),
        "cut_text": _strings(cut_text),
    }


def _gpt2_stream(tok) -> dict:
    hf, tk = hf_gpt2_tokenizer(), tiktoken_gpt2()
    ref = tok.Tokenizer.from_gpt2_files(*gpt2_files())
    ids = []
    for s in STREAM_STRINGS:
        a, b = hf.encode(s), tk.encode(s, allowed_special="all")
        assert a == b == ref.encode(s), f"HuggingFace, tiktoken and the reference disagree on {s!r}"
        for k in range(len(s) + 1):
            assert list(ref.encode_iterable([s[:k], s[k:]])) == a, f"the reference's stream of {s!r} cut at {k}"
        ids.append(a)
    flat_ids, id_offsets = ragged(ids, np.int64)
    return {"text": _strings(STREAM_STRINGS), "ids": flat_ids, "id_offsets": id_offsets}


def _train_case(tok, text: str, vocab_size: int, specials: list[str]) -> dict:
    vocab, merges = tok.train_bpe(text, vocab_size, specials)
    left, left_offsets = ragged([a for a, _ in merges], np.uint8)
    right, right_offsets = ragged([b for _, b in merges], np.uint8)
    return {"text": np.array(text), "vocab_size": np.array(vocab_size, np.int64), "specials": _strings(specials),
            "left": left, "left_offsets": left_offsets, "right": right, "right_offsets": right_offsets}


def build() -> dict[str, dict[str, np.ndarray]]:
    import tokenizer as tok

    corpus = CORPUS.read_text(encoding="utf-8")
    sample = ENDOFTEXT.join(corpus[i:i + 6000] for i in range(0, 600_000, 100_000))
    rng = np.random.default_rng(1010)
    words = ["".join(rng.choice(list("abcd"), size=rng.integers(1, 6))) for _ in range(400)]
    ties = " ".join(words)
    return {
        "byte_map": _byte_map(tok),
        "gpt2_hard": _gpt2_hard(tok),
        "gpt2_stream": _gpt2_stream(tok),
        "train_sample": _train_case(tok, sample, 256 + 1 + 300, [ENDOFTEXT]),
        "train_ties": _train_case(tok, ties, 256 + 60, []),
        "train_corpus": {k: v for k, v in _train_case(tok, corpus, 256 + 1 + 1000, [ENDOFTEXT]).items() if k != "text"},
    }
