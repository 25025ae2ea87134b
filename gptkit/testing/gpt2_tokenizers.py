"""GPT-2's tokenizer as HuggingFace and tiktoken implement it, both built offline from the
files the kit ships (``gptkit/data/gpt2``), and the hard strings lab 10 checks them on.

Used by ``tests/10_tokenizer/make_fixtures.py`` (stored ids) and the live tests; both
libraries come with the torch extra.
"""

from __future__ import annotations

import json

from gptkit.data import ENDOFTEXT, gpt2_files

# Strings a byte-level BPE gets wrong first: empty, whitespace runs and newlines,
# contractions (GPT-2's are case-sensitive), digits, punctuation, source code, accented
# Latin, CJK, emoji with skin tones and ZWJ sequences, a special token inside text.
HARD_STRINGS = [
    "",
    " ",
    "   ",
    "\n",
    "\n\n\n",
    " \n \n",
    "\t\tindented\ttabs\t",
    "Hello, world!",
    "hello   world",
    "  leading and trailing  ",
    "line one\nline two\r\nline three\n\n  indented",
    "I'll say it's what you're and we've, I'm sure he'd don't",
    "I'LL SHOUT IT'S",
    "'s 't 're 've 'm 'll 'd' ''quoted''",
    "1234567890 3.14159 -42 1e10 2024-01-01 $1,000,000",
    "!!!???... ;;; --- *** (([{}])) <<>> @#$%^&",
    "def f(x):\n    return {'a': [1, 2]} if x else None  # comment\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "café naïve résumé Ångström façade Straße",
    "Ελληνικά русский язык العربية עברית",
    "你好，世界！日本語のテキスト한국어",
    "👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️",
    "e\u0301 combining accents a\u0308",
    "zero\u200bwidth and\u00a0nbsp",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|endoftext|><|endoftext|> two in a row",
    "almost <|endoftext| and <endoftext|>",
    "  <|endoftext|>  spaces around it  ",
]


def hf_gpt2_tokenizer():
    """HuggingFace's GPT2TokenizerFast (Rust) on the shipped files; ``<|endoftext|>`` is
    its special token, so it is split out of text as GPT-2 does."""
    from transformers import GPT2TokenizerFast

    vocab_path, merges_path = gpt2_files()
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    lines = merges_path.read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    return GPT2TokenizerFast(vocab=vocab, merges=merges)


def tiktoken_gpt2():
    """tiktoken's GPT-2 encoding, built from the shipped files (``get_encoding("gpt2")``
    would download them). Encode with ``allowed_special="all"``."""
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    vocab_path, _ = gpt2_files()
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    to_byte = {ch: b for b, ch in hf_byte_map().items()}
    ranks = {bytes(to_byte[c] for c in token): i for token, i in vocab.items() if token != ENDOFTEXT}
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={ENDOFTEXT: vocab[ENDOFTEXT]})


def hf_byte_map() -> dict[int, str]:
    """GPT-2's byte → character map, as HuggingFace's transformers has it."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()
