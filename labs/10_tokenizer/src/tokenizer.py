# Lab 10: fill in each `# YOUR CODE HERE` block in this file, then run `uv run pytest -m lab10`.
"""Lab 10 · The tokenizer: byte-level BPE, trained on a corpus and GPT-2's own.

A language model reads integer ids; this lab turns text into ids and back. Byte-level BPE
(byte-pair encoding) starts from the 256 byte values of UTF-8 and learns *merges*: the
pair of adjacent tokens seen most often in a corpus becomes one new token, again and
again, until the vocabulary has the size asked for.

    text ─ split out special tokens ─ pre-tokenize (GPT-2's pattern) ─ UTF-8 bytes
         ─ apply merges by rank within each pre-token ─ ids

Vocabulary: ``vocab`` maps id → the token's bytes. Merges: ``merges`` is the list of
``(left bytes, right bytes)`` in the order they were learned; a merge's position in that
list is its *rank* (lower merges first). Training lays the vocabulary out as GPT-2 does:
ids 0–255 the single bytes, then one id per merge in order, then the special tokens.
"""

from __future__ import annotations

import json
import operator
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

import regex

ENDOFTEXT = "<|endoftext|>"
_CACHE_LIMIT = 200_000  # pre-tokens remembered by Tokenizer.encode before the memo starts afresh


# -- bytes and pre-tokens -----------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte ↔ printable-character map: byte value (0–255) → a one-character string.

    The printable bytes ``!``…``~``, ``¡``…``¬`` and ``®``…``ÿ`` map to the character with
    the same code point. The other 68 bytes (controls, the space, …) map, in increasing
    byte order, to the characters 256, 257, …: the space (byte 32) becomes ``Ġ`` (U+0120),
    the newline ``Ċ``. GPT-2's ``vocab.json`` and ``merges.txt`` write every token in these
    characters.
    """
    # YOUR CODE HERE
    raise NotImplementedError('Lab 10 · bytes_to_unicode: map printable bytes to themselves and the 68 others to chr(256), chr(257), … in byte order')


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into GPT-2's pre-tokens; merges never cross their boundaries.

    GPT-2's pattern, tried in this order at each position:
    the contractions ``'s 't 're 've 'm 'll 'd``; an optional space and a run of letters
    (``\\p{L}``); an optional space and a run of digits (``\\p{N}``); an optional space and a
    run of anything else that is neither whitespace, letter nor digit; a run of whitespace
    not followed by a non-space (so a run before a word leaves its last space to the word);
    any other run of whitespace. The pre-tokens joined give ``text`` back.
    """
    if not isinstance(text, str):
        raise TypeError(f"pretokenize takes a str, got {type(text).__name__}")
    # YOUR CODE HERE
    raise NotImplementedError("Lab 10 · pretokenize: GPT-2's pattern with the `regex` package (\\p{L}, \\p{N}), then findall")


def split_on_special(text: str, special_tokens: Iterable[str]) -> list[str]:
    """``text`` cut around every occurrence of a special token, each special token its own
    piece, in order; empty pieces are left out, so the pieces joined give ``text`` back.

    Where two special tokens overlap at a position, the longer one wins
    (``"<|a|><|a|>"`` is one token when both it and ``"<|a|>"`` are special).
    """
    specials = _check_specials(special_tokens)
    # YOUR CODE HERE
    raise NotImplementedError('Lab 10 · split_on_special: one alternation of the escaped special tokens, longest first; keep the separators')


def merge_word(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``word`` with every occurrence of ``pair`` replaced by ``new_id``, scanning left to
    right: in ``[a, a, a]`` the pair ``(a, a)`` is merged once, at the left, giving
    ``[new_id, a]``. Returns a new list."""
    # YOUR CODE HERE
    raise NotImplementedError('Lab 10 · merge_word: scan left to right; where word[i], word[i+1] is the pair, emit new_id and skip both')


# -- training ---------------------------------------------------------------------------------

def train_bpe(text: str, vocab_size: int, special_tokens: Iterable[str] = ()) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Learn byte-level BPE merges on ``text``.

    Args:
        text: the training corpus.
        vocab_size: ``256 + len(special_tokens) + n`` asks for ``n`` merges.
        special_tokens: strings that are cut out of the corpus first (never merged into, and
            never across) and get the last ids.

    Returns:
        ``(vocab, merges)``: ``vocab`` id → bytes (0–255 the bytes, 256… the merges in
        order, then the special tokens); ``merges`` the ``(left, right)`` byte strings in
        the order learned. Fewer than ``n`` merges only when no pair is left to merge.

    Each step merges the pair of adjacent tokens that occurs most often, counting each
    pre-token as often as it occurs in the corpus, and each adjacent position of a word
    (``aaa`` holds ``(a, a)`` twice). Among pairs with the same count the
    lexicographically greatest wins, comparing ``(vocab[left], vocab[right])`` as bytes.
    Pairs never cross pre-token boundaries. After a merge, only the words that held the
    merged pair have their pair counts updated; nothing is recounted from scratch.
    """
    specials = _check_specials(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < 256 + len(specials):
        raise ValueError(f"vocab_size={vocab_size} is too small: the vocabulary holds the 256 bytes and the "
                         f"{len(specials)} special tokens, so it needs at least {256 + len(specials)}")
    if not isinstance(text, str):
        raise TypeError(f"train_bpe's text must be a str, got {type(text).__name__}")
    n_merges = vocab_size - 256 - len(specials)
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    merges: list[tuple[bytes, bytes]] = []
    # YOUR CODE HERE
    raise NotImplementedError('Lab 10 · train_bpe: count pre-tokens, count pairs once, then merge the top pair and update only the words that held it')
    for s in specials:
        vocab[len(vocab)] = s.encode("utf-8")
    return vocab, merges


# -- encoding and decoding --------------------------------------------------------------------

class Tokenizer:
    """Byte-level BPE with a given vocabulary, merges and special tokens.

    ``Tokenizer(vocab, merges, special_tokens=None)``: ``vocab`` id → bytes (all 256 single
    bytes among them), ``merges`` the ``(left, right)`` byte strings in rank order (each
    part and their concatenation in ``vocab``), ``special_tokens`` strings encoded as one
    id each (added to the vocabulary at the next free ids when absent).
    """

    def __init__(self, vocab: dict[int, bytes], merges: Iterable[tuple[bytes, bytes]],
                 special_tokens: Iterable[str] | None = None):
        self.vocab = {int(i): bytes(b) for i, b in dict(vocab).items()}
        self.merges = [(bytes(a), bytes(b)) for a, b in merges]
        self.special_tokens = _check_specials(special_tokens or ())
        ids = {b: i for i, b in sorted(self.vocab.items(), reverse=True)}  # bytes → id (the lowest id if repeated)
        missing = [b for b in range(256) if bytes([b]) not in ids]
        if missing:
            raise ValueError(f"the vocabulary lacks {len(missing)} of the 256 single bytes (e.g. {bytes([missing[0]])!r}): "
                             "byte-level BPE needs every byte as a token")
        for s in self.special_tokens:  # a special token the vocabulary lacks gets the next free id
            if s.encode("utf-8") not in ids:
                ids[s.encode("utf-8")] = new_id = max(self.vocab, default=-1) + 1
                self.vocab[new_id] = s.encode("utf-8")
        self._byte_ids = [ids[bytes([b])] for b in range(256)]  # byte value → its token id
        self._special_ids = {s: ids[s.encode("utf-8")] for s in self.special_tokens}
        # The merge table: (left id, right id) → (rank, id of the merged token).
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, (a, b) in enumerate(self.merges):
            if a not in ids or b not in ids or a + b not in ids:
                raise ValueError(f"merge {rank} ({a!r}, {b!r}) is not in the vocabulary: both parts and "
                                 f"{a + b!r} must be tokens")
            self._ranks.setdefault((ids[a], ids[b]), (rank, ids[a + b]))
        self._cache: dict[str, list[int]] = {}  # pre-token → its ids (encode's memo)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode_word(self, word: bytes) -> list[int]:
        """The ids of one pre-token's bytes: start from one id per byte, then merge the pair
        of lowest rank, again and again, until no adjacent pair is a merge."""
        # YOUR CODE HERE
        raise NotImplementedError('Lab 10 · Tokenizer.encode_word: bytes → ids; repeatedly merge the adjacent pair with the lowest rank')

    def encode(self, text: str) -> list[int]:
        """``text`` → ids: special tokens first (one id each), then each other piece's
        pre-tokens through :meth:`encode_word`."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        # YOUR CODE HERE
        raise NotImplementedError('Lab 10 · Tokenizer.encode: split out the special tokens; pre-tokenize the rest and encode each pre-token')

    def _word_ids(self, word: str) -> list[int]:
        """``encode_word`` of one pre-token, remembered: a corpus repeats its words."""
        known = self._cache.get(word)
        if known is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            known = self._cache[word] = self.encode_word(word.encode("utf-8"))
        return known

    def decode(self, ids: Iterable[int]) -> str:
        """ids → text: the tokens' bytes joined, then decoded as UTF-8 once; bytes that do
        not form a character (a sequence cut mid-character) become U+FFFD ``�``."""
        try:
            ids = [operator.index(i) for i in ids]
        except TypeError:
            raise TypeError("decode takes a sequence of integer ids") from None
        unknown = [i for i in ids if i not in self.vocab]
        if unknown:
            raise ValueError(f"decode got {len(unknown)} id(s) outside the vocabulary of {len(self.vocab)} "
                             f"tokens, e.g. {unknown[0]!r}")
        # YOUR CODE HERE
        raise NotImplementedError('Lab 10 · Tokenizer.decode: join every token\'s bytes, then decode the whole byte string once (errors="replace")')

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """The ids of the text that the strings of ``iterable`` (lines of a file, chunks)
        make when joined, the same as ``encode("".join(iterable))``, yielded as they become
        certain, so a file of any size streams in bounded memory.

        A chunk can end in the middle of a pre-token or a special token, so text is held
        back until it cannot change: the pre-tokens (and special tokens) of what has been
        read that end *more than* ``max(3, longest special token)`` characters before its
        end are certain. Where a pre-token ends can depend on the two characters after it
        (a whitespace run gives its last character back when a non-space follows, and a
        contraction needs up to 3 characters) and on whether a special token starts
        right after it, which is known only once that special token has been read whole:
        read up to its last ``"|"``, ``"a\\n\\n<|endoftext|>"`` splits its whitespace run
        in two, ``"\\n"`` and ``"\\n"`` (the ``"<"`` is a non-space), where the whole text,
        the special token cut out, ends with one pre-token ``"\\n\\n"``. They are encoded as
        found: re-splitting the text before them alone could end differently
        (``"\\n\\n"`` at the end of a text is one pre-token, before a word two).
        """
        margin = max([3, *(len(s) for s in self.special_tokens)])
        # YOUR CODE HERE
        raise NotImplementedError('Lab 10 · Tokenizer.encode_iterable: keep a buffer; after each chunk encode its certain pre-tokens and drop them; encode the rest at the end')

    @classmethod
    def from_gpt2_files(cls, vocab_path, merges_path, special_tokens: Iterable[str] = (ENDOFTEXT,)) -> "Tokenizer":
        """GPT-2's tokenizer from its ``vocab.json`` (token in GPT-2's characters → id) and
        ``merges.txt`` (one merge per line, ``left right`` in those characters, rank order;
        a first line ``#version: …`` and empty lines are skipped)."""
        vocab_path, merges_path = Path(vocab_path), Path(merges_path)
        for p in (vocab_path, merges_path):
            if not p.is_file():
                raise FileNotFoundError(f"no GPT-2 tokenizer file at {p}")
        # YOUR CODE HERE
        raise NotImplementedError("Lab 10 · Tokenizer.from_gpt2_files: read both files; turn GPT-2's characters back into bytes with the inverse byte map")


def _check_specials(special_tokens) -> list[str]:
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a list of strings, not one string")
    specials = list(dict.fromkeys(special_tokens))
    for s in specials:
        if not isinstance(s, str) or not s:
            raise ValueError(f"special tokens must be non-empty strings, got {s!r}")
    return specials
