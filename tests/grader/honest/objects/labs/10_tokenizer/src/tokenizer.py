"""Lab 10 · byte-level BPE, object style: the trainer as a class holding its words
(dataclasses), pair counts (a Counter), the words each pair lives in (a defaultdict of
sets) and a heap of named-tuple entries; the pieces of a text as named tuples; the
stream's held-back text as a small dataclass; GPT-2's files read with open and json.

Vocabulary: id → bytes (0–255 the single bytes, then the merges in order, then the
special tokens). Merges: (left bytes, right bytes) in rank order.
"""

from __future__ import annotations

import heapq
import json
import operator
from collections import Counter, defaultdict, namedtuple
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import regex

ENDOFTEXT = "<|endoftext|>"
_CACHE_LIMIT = 200_000  # pre-tokens remembered by Tokenizer.encode before the memo starts afresh

# GPT-2's pre-tokenization pattern; \p{L} and \p{N} need the regex package.
GPT2_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

# The bytes GPT-2 writes as the character with the same code point.
PRINTABLE_BYTES = frozenset([*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                             *range(ord("®"), ord("ÿ") + 1)])

# One piece of a text once the special tokens are split out.
Piece = namedtuple("Piece", ["text", "special"])

# An entry of the trainer's heap: the smallest pops first, so the count is negated and the
# bytes keyed greatest first.
Candidate = namedtuple("Candidate", ["neg_count", "left_key", "right_key", "pair"])


# -- bytes and pre-tokens -----------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable-character map, 256 entries in byte order."""
    table: dict[int, str] = {}
    next_spare = 256
    for b in range(256):
        if b in PRINTABLE_BYTES:
            table[b] = chr(b)
        else:
            table[b] = chr(next_spare)
            next_spare += 1
    return table


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into GPT-2's pre-tokens; joined they give ``text`` back."""
    if not isinstance(text, str):
        raise TypeError(f"pretokenize takes a str, got {type(text).__name__}")
    return GPT2_PATTERN.findall(text)


def split_on_special(text: str, special_tokens: Iterable[str]) -> list[str]:
    """``text`` cut around each special token (each its own piece), no empty pieces."""
    specials = _check_specials(special_tokens)
    if not specials:
        return [text] if text else []
    alternatives = [regex.escape(s) for s in sorted(specials, key=len, reverse=True)]
    pieces = regex.split("(" + "|".join(alternatives) + ")", text)
    return [p for p in pieces if p != ""]


def merge_word(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``word`` with every occurrence of ``pair`` replaced by ``new_id``, left to right."""
    left, right = pair
    merged: list[int] = []
    skip_next = False
    for i, token in enumerate(word):
        if skip_next:
            skip_next = False
        elif token == left and i + 1 < len(word) and word[i + 1] == right:
            merged.append(new_id)
            skip_next = True
        else:
            merged.append(token)
    return merged


# -- training ---------------------------------------------------------------------------------

def _greatest_first(token: bytes) -> tuple[int, ...]:
    """A sort key that orders byte strings greatest first, for ``heapq`` (which pops the
    smallest): the bytes negated, then 1, so that a string sorts after the longer strings
    it begins (``b"ab"`` is greater than ``b"a"`` and must come first)."""
    return (*(-c for c in token), 1)


@dataclass
class Word:
    """One distinct pre-token of the corpus: its current ids and how often it occurs."""

    ids: list[int]
    count: int

    def pairs(self):
        return zip(self.ids, self.ids[1:])


@dataclass
class BPETrainer:
    """The trainer's state; ``learn(n)`` makes up to ``n`` merges."""

    words: list[Word]
    vocab: dict[int, bytes] = field(default_factory=lambda: {i: bytes([i]) for i in range(256)})
    merges: list[tuple[bytes, bytes]] = field(default_factory=list)

    def __post_init__(self):
        self.pair_counts: Counter = Counter()
        self.holders: defaultdict = defaultdict(set)  # pair → indices of the words holding it
        for index, word in enumerate(self.words):
            for pair in word.pairs():
                self.pair_counts[pair] += word.count
                self.holders[pair].add(index)
        self.heap = [self.candidate(pair) for pair in self.pair_counts]
        heapq.heapify(self.heap)

    @classmethod
    def from_text(cls, text: str, specials: list[str]) -> "BPETrainer":
        occurrences = Counter()
        for piece in split_on_special(text, specials):
            if piece not in specials:
                occurrences.update(pretokenize(piece))
        return cls([Word(list(w.encode("utf-8")), n) for w, n in occurrences.items()])

    def candidate(self, pair) -> Candidate:
        left, right = pair
        return Candidate(-self.pair_counts[pair], _greatest_first(self.vocab[left]),
                         _greatest_first(self.vocab[right]), pair)

    def next_pair(self):
        """The pair to merge next, or None when no pair is left."""
        while self.heap:
            top = heapq.heappop(self.heap)
            if self.pair_counts.get(top.pair, 0) == -top.neg_count:
                return top.pair
            # otherwise the entry is stale: its pair's count has changed since
        return None

    def merge(self, pair) -> None:
        new_id = 256 + len(self.merges)
        left, right = self.vocab[pair[0]], self.vocab[pair[1]]
        self.vocab[new_id] = left + right
        self.merges.append((left, right))
        changed = set()
        for index in self.holders.pop(pair):
            word = self.words[index]
            for p in word.pairs():
                self.pair_counts[p] -= word.count
                changed.add(p)
            word.ids = merge_word(word.ids, pair, new_id)
            for p in word.pairs():
                self.pair_counts[p] += word.count
                self.holders[p].add(index)
                changed.add(p)
        for p in changed:
            if self.pair_counts[p] > 0:
                heapq.heappush(self.heap, self.candidate(p))
            else:
                del self.pair_counts[p]

    def learn(self, n_merges: int) -> None:
        while len(self.merges) < n_merges:
            pair = self.next_pair()
            if pair is None:
                break
            self.merge(pair)


def train_bpe(text: str, vocab_size: int, special_tokens: Iterable[str] = ()) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Learn byte-level BPE merges on ``text``: ``256 + len(special_tokens) + n`` asks
    for ``n`` merges; returns ``(vocab, merges)``."""
    specials = _check_specials(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < 256 + len(specials):
        raise ValueError(f"vocab_size={vocab_size} is too small: the vocabulary holds the 256 bytes and the "
                         f"{len(specials)} special tokens, so it needs at least {256 + len(specials)}")
    if not isinstance(text, str):
        raise TypeError(f"train_bpe's text must be a str, got {type(text).__name__}")
    trainer = BPETrainer.from_text(text, specials)
    trainer.learn(vocab_size - 256 - len(specials))
    vocab, merges = trainer.vocab, trainer.merges
    for s in specials:
        vocab[len(vocab)] = s.encode("utf-8")
    return vocab, merges


# -- streaming ------------------------------------------------------------------------------

@dataclass
class HeldText:
    """The text a stream has read but not yet encoded, and how much of its end may change."""

    margin: int
    text: str = ""

    def take_certain(self, pieces: list[Piece]) -> list[Piece]:
        """The leading tokens of ``pieces`` (this text, tokenized) that end more than
        ``margin`` characters before its end; they are dropped from the text."""
        limit = len(self.text) - self.margin
        taken, end = [], 0
        for piece in pieces:
            if end + len(piece.text) >= limit:
                break
            end += len(piece.text)
            taken.append(piece)
        self.text = self.text[end:]
        return taken


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
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _rank(self, pair) -> float:
        entry = self._ranks.get(pair)
        return float("inf") if entry is None else entry[0]

    def encode_word(self, word: bytes) -> list[int]:
        """The ids of one pre-token's bytes, merged by lowest rank until none applies."""
        ids = [self._byte_ids[b] for b in word]
        while len(ids) > 1:
            best = min(zip(ids, ids[1:]), key=self._rank)
            if best not in self._ranks:
                break
            _, merged_id = self._ranks[best]
            ids = merge_word(ids, best, merged_id)
        return ids

    def _tokens(self, text: str) -> list[Piece]:
        """``text`` as special tokens and pre-tokens, in order."""
        tokens = []
        for piece in split_on_special(text, self.special_tokens):
            if piece in self._special_ids:
                tokens.append(Piece(piece, special=True))
            else:
                tokens.extend(Piece(word, special=False) for word in pretokenize(piece))
        return tokens

    def _ids_of(self, token: Piece) -> list[int]:
        return [self._special_ids[token.text]] if token.special else self._word_ids(token.text)

    def encode(self, text: str) -> list[int]:
        """``text`` → ids: special tokens one id each, the rest pre-token by pre-token."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        ids: list[int] = []
        for token in self._tokens(text):
            ids.extend(self._ids_of(token))
        return ids

    def _word_ids(self, word: str) -> list[int]:
        """``encode_word`` of one pre-token, remembered: a corpus repeats its words."""
        known = self._cache.get(word)
        if known is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            known = self._cache[word] = self.encode_word(word.encode("utf-8"))
        return known

    def decode(self, ids: Iterable[int]) -> str:
        """ids → text: the tokens' bytes joined, then decoded once (errors="replace")."""
        try:
            ids = [operator.index(i) for i in ids]
        except TypeError:
            raise TypeError("decode takes a sequence of integer ids") from None
        unknown = [i for i in ids if i not in self.vocab]
        if unknown:
            raise ValueError(f"decode got {len(unknown)} id(s) outside the vocabulary of {len(self.vocab)} "
                             f"tokens, e.g. {unknown[0]!r}")
        raw = bytearray()
        for i in ids:
            raw += self.vocab[i]
        return raw.decode("utf-8", errors="replace")

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """The ids of ``"".join(iterable)``, yielded once the text before them cannot change:
        tokens ending more than ``max(3, longest special token)`` characters before the end
        of what has been read are certain and are encoded as found."""
        held = HeldText(margin=max([3, *(len(s) for s in self.special_tokens)]))
        for chunk in iterable:
            if not isinstance(chunk, str):
                raise TypeError(f"encode_iterable takes strings, got a {type(chunk).__name__}")
            held.text += chunk
            for token in held.take_certain(self._tokens(held.text)):
                yield from self._ids_of(token)
        yield from self.encode(held.text)

    @classmethod
    def from_gpt2_files(cls, vocab_path, merges_path, special_tokens: Iterable[str] = (ENDOFTEXT,)) -> "Tokenizer":
        """GPT-2's tokenizer from its ``vocab.json`` and ``merges.txt``."""
        vocab_path, merges_path = Path(vocab_path), Path(merges_path)
        for p in (vocab_path, merges_path):
            if not p.is_file():
                raise FileNotFoundError(f"no GPT-2 tokenizer file at {p}")
        byte_of = {ch: b for b, ch in bytes_to_unicode().items()}

        def to_bytes(token: str) -> bytes:
            return bytes(byte_of[ch] for ch in token)

        with open(vocab_path, encoding="utf-8") as f:
            vocab = {int(i): to_bytes(token) for token, i in json.load(f).items()}
        merges = []
        with open(merges_path, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if line and not line.startswith("#version"):
                    left, right = line.split(" ")
                    merges.append((to_bytes(left), to_bytes(right)))
        return cls(vocab, merges, special_tokens)

def _check_specials(special_tokens) -> list[str]:
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a list of strings, not one string")
    specials = list(dict.fromkeys(special_tokens))
    for s in specials:
        if not isinstance(s, str) or not s:
            raise ValueError(f"special tokens must be non-empty strings, got {s!r}")
    return specials
