"""Lab 10 · byte-level BPE, functional style: the byte map chained from ranges, merges
scanned with pairwise, the special-token pattern and the inverse byte map memoised with
lru_cache, the trainer's next pair chosen by max with a key bound by partial, and the
stream's certain pre-tokens found with accumulate and takewhile.

Vocabulary: id → bytes (0–255 the single bytes, then the merges in order, then the
special tokens). Merges: (left bytes, right bytes) in rank order.
"""

from __future__ import annotations

import json
import operator
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from functools import lru_cache, partial
from itertools import accumulate, chain, count, filterfalse, pairwise, takewhile
from pathlib import Path

import regex

ENDOFTEXT = "<|endoftext|>"
_CACHE_LIMIT = 200_000  # pre-tokens remembered by Tokenizer.encode before the memo starts afresh

_GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
_SHOWN_AS_THEMSELVES = tuple(chain(range(ord("!"), ord("~") + 1), range(ord("¡"), ord("¬") + 1),
                                   range(ord("®"), ord("ÿ") + 1)))


# -- bytes and pre-tokens -----------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable-character map, 256 entries in byte order."""
    hidden = filterfalse(set(_SHOWN_AS_THEMSELVES).__contains__, range(256))
    shifted = zip(hidden, map(chr, count(256)))
    return dict(sorted(chain(zip(_SHOWN_AS_THEMSELVES, map(chr, _SHOWN_AS_THEMSELVES)), shifted)))


@lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """The inverse byte map: a GPT-2 character → its byte."""
    return {ch: b for b, ch in bytes_to_unicode().items()}


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into GPT-2's pre-tokens; joined they give ``text`` back."""
    if not isinstance(text, str):
        raise TypeError(f"pretokenize takes a str, got {type(text).__name__}")
    return _GPT2_SPLIT.findall(text)


@lru_cache(maxsize=64)
def _special_splitter(specials: tuple[str, ...]):
    """A compiled pattern that captures any of ``specials``, the longest tried first."""
    longest_first = sorted(specials, key=len, reverse=True)
    return regex.compile("(" + "|".join(map(regex.escape, longest_first)) + ")")


def split_on_special(text: str, special_tokens: Iterable[str]) -> list[str]:
    """``text`` cut around each special token (each its own piece), no empty pieces."""
    specials = _check_specials(special_tokens)
    if not specials:
        return [text] if text else []
    return list(filter(None, _special_splitter(tuple(specials)).split(text)))


def _merged(word, pair: tuple[int, int], new_id: int) -> Iterator[int]:
    """The ids of ``word`` with ``pair`` replaced, left to right (a generator)."""
    just_merged = False
    for here, after in pairwise(chain(word, (None,))):
        if just_merged:
            just_merged = False
        elif (here, after) == pair:
            just_merged = True
            yield new_id
        else:
            yield here


def merge_word(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``word`` with every occurrence of ``pair`` replaced by ``new_id``, left to right."""
    return list(_merged(word, tuple(pair), new_id))



# -- training ---------------------------------------------------------------------------------

def _greatest_first(token: bytes) -> tuple[int, ...]:
    """A sort key that orders byte strings greatest first, for ``heapq`` (which pops the
    smallest): the bytes negated, then 1, so that a string sorts after the longer strings
    it begins (``b"ab"`` is greater than ``b"a"`` and must come first)."""
    return (*(-c for c in token), 1)


def _merge_priority(pair_counts, vocab, pair):
    """How much a pair wants merging: its count, then its bytes (greatest wins), then the
    smaller ids (a heap of (−count, bytes greatest first, pair) would pop the same pair)."""
    left, right = pair
    return pair_counts[pair], vocab[left], vocab[right], -left, -right


def _corpus_words(text: str, specials: list[str]) -> Counter:
    """Each distinct pre-token of ``text`` (special tokens cut out) with how often it occurs."""
    pieces = filterfalse(set(specials).__contains__, split_on_special(text, specials))
    return Counter(chain.from_iterable(map(pretokenize, pieces)))


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
    n_merges = vocab_size - 256 - len(specials)
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    merges: list[tuple[bytes, bytes]] = []
    counts = _corpus_words(text, specials)
    words = [list(w.encode("utf-8")) for w in counts]
    freqs = list(counts.values())

    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    holders: dict[tuple[int, int], set[int]] = defaultdict(set)  # pair → the words holding it
    for i, word in enumerate(words):
        for pair in pairwise(word):
            pair_counts[pair] += freqs[i]
            holders[pair].add(i)

    priority = partial(_merge_priority, pair_counts, vocab)
    while len(merges) < n_merges and pair_counts:
        pair = max(pair_counts, key=priority)
        new_id = 256 + len(merges)
        left, right = map(vocab.__getitem__, pair)
        vocab[new_id] = left + right
        merges.append((left, right))
        changed = set()
        for i in holders.pop(pair):
            before, after = words[i], merge_word(words[i], pair, new_id)
            for p in pairwise(before):
                pair_counts[p] -= freqs[i]
            for p in pairwise(after):
                pair_counts[p] += freqs[i]
                holders[p].add(i)
            changed.update(pairwise(before), pairwise(after))
            words[i] = after
        for p in [p for p in changed if pair_counts[p] <= 0]:
            del pair_counts[p]
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
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _best_merge(self, ids: list[int]):
        """(rank, merged id, pair) of the lowest-ranked adjacent pair that is a merge, or None."""
        ranked = (self._ranks[p] + (p,) for p in pairwise(ids) if p in self._ranks)
        return min(ranked, default=None)

    def encode_word(self, word: bytes) -> list[int]:
        """The ids of one pre-token's bytes, merged by lowest rank until none applies."""
        ids = list(map(self._byte_ids.__getitem__, word))
        best = self._best_merge(ids)
        while best is not None:
            _, new_id, pair = best
            ids = merge_word(ids, pair, new_id)
            best = self._best_merge(ids)
        return ids

    def _piece_tokens(self, piece: str) -> list[str]:
        """A piece of ``split_on_special`` as tokens: a special token whole, else its pre-tokens."""
        return [piece] if piece in self._special_ids else pretokenize(piece)

    def _token_ids(self, token: str) -> list[int]:
        special = self._special_ids.get(token)
        return [special] if special is not None else self._word_ids(token)

    def _tokens(self, text: str) -> Iterator[str]:
        return chain.from_iterable(map(self._piece_tokens, split_on_special(text, self.special_tokens)))

    def encode(self, text: str) -> list[int]:
        """``text`` → ids: special tokens one id each, the rest pre-token by pre-token."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return list(chain.from_iterable(map(self._token_ids, self._tokens(text))))

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
        return b"".join(map(self.vocab.__getitem__, ids)).decode("utf-8", errors="replace")

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """The ids of ``"".join(iterable)``, yielded once the text before them cannot change:
        tokens ending more than ``max(3, longest special token)`` characters before the end
        of what has been read are certain and are encoded as found."""
        margin = max([3, *(len(s) for s in self.special_tokens)])
        buffer = ""
        for chunk in iterable:
            if not isinstance(chunk, str):
                raise TypeError(f"encode_iterable takes strings, got a {type(chunk).__name__}")
            buffer += chunk
            tokens = list(self._tokens(buffer))
            ends = accumulate(map(len, tokens))
            certain = list(takewhile(partial(operator.gt, len(buffer) - margin), ends))
            yield from chain.from_iterable(map(self._token_ids, tokens[:len(certain)]))
            buffer = buffer[certain[-1]:] if certain else buffer
        yield from self.encode(buffer)

    @classmethod
    def from_gpt2_files(cls, vocab_path, merges_path, special_tokens: Iterable[str] = (ENDOFTEXT,)) -> "Tokenizer":
        """GPT-2's tokenizer from its ``vocab.json`` and ``merges.txt``."""
        vocab_path, merges_path = Path(vocab_path), Path(merges_path)
        for p in (vocab_path, merges_path):
            if not p.is_file():
                raise FileNotFoundError(f"no GPT-2 tokenizer file at {p}")
        encoder = json.loads(vocab_path.read_text(encoding="utf-8"))
        vocab = {int(i): _gpt2_bytes(token) for token, i in encoder.items()}
        lines = merges_path.read_text(encoding="utf-8").split("\n")
        kept = filterfalse(_skipped_merge_line, lines)
        merges = [tuple(map(_gpt2_bytes, line.split(" "))) for line in kept]
        return cls(vocab, merges, special_tokens)


def _gpt2_bytes(token: str) -> bytes:
    """A token written in GPT-2's characters → its bytes."""
    return bytes(map(_byte_of_char().__getitem__, token))


def _skipped_merge_line(line: str) -> bool:
    return not line or line.startswith("#version")

def _check_specials(special_tokens) -> list[str]:
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a list of strings, not one string")
    specials = list(dict.fromkeys(special_tokens))
    for s in specials:
        if not isinstance(s, str) or not s:
            raise ValueError(f"special tokens must be non-empty strings, got {s!r}")
    return specials
