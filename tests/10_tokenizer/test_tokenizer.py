"""Lab 10 · byte-level BPE: the byte map, pre-tokens, special tokens, training, encoding,
decoding, streaming and GPT-2's own tokenizer.

Concept tests on hand-made inputs come first, each named after what it checks; then the
stored fixtures (GPT-2's ids for hard strings, made by HuggingFace and tiktoken from the
kit's GPT-2 files, and the reference trainer's merges); then properties (Hypothesis).
No test here needs PyTorch.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptkit.data import ENDOFTEXT, gpt2_files
from gptkit.testing import explains_errors, lab, load_fixture, next_item, raises_clearly, remote

T = lab("tokenizer")
LAB = "10_tokenizer"
EOT = ENDOFTEXT


# --- helpers ---------------------------------------------------------------------------------

def _ragged(flat, offsets):
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _stored_merges(f):
    left = [bytes(x.astype(np.uint8)) for x in _ragged(f["left"], f["left_offsets"])]
    right = [bytes(x.astype(np.uint8)) for x in _ragged(f["right"], f["right_offsets"])]
    return list(zip(left, right))


def _as_merges(merges):
    return [(bytes(a), bytes(b)) for a, b in merges]


def _first_difference(got, expected):
    for k, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            return k
    return min(len(got), len(expected)) if len(got) != len(expected) else None


def _assert_ids(got, expected, what, hint=""):
    __tracebackhide__ = True
    got, expected = [int(i) for i in got], [int(i) for i in expected]
    k = _first_difference(got, expected)
    if k is None:
        return
    msg = (f"{what}: expected {len(expected)} ids, got {len(got)}; the first difference is at position {k}: "
           f"expected {expected[k:k + 4]}…, got {got[k:k + 4]}…")
    raise AssertionError(msg + (f". {hint}" if hint else ""))


def _assert_merges(got, expected, what, hint):
    __tracebackhide__ = True
    got = _as_merges(got)
    k = _first_difference(got, expected)
    if k is None:
        return
    if k >= len(got) or k >= len(expected):
        raise AssertionError(f"{what}: expected {len(expected)} merges, got {len(got)}. {hint}")
    raise AssertionError(f"{what}: merge {k} of {len(expected)} differs: expected {expected[k]!r}, got {got[k]!r}. {hint}")


def _tiny():
    """A hand-made vocabulary: the bytes, then merges of rank 0 (b, c), 1 (a, b), 2 (a, bc),
    3 (a, ' '), which no pre-token can use, and 4 (' ', a)."""
    vocab = {i: bytes([i]) for i in range(256)}
    merges = [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc"), (b"a", b" "), (b" ", b"a")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return vocab, merges


def _ids_of(vocab):
    return {b: i for i, b in vocab.items()}


_GPT2 = {}  # the student's GPT-2 tokenizer, read once per run of the lab code


def _gpt2():
    """The student's GPT-2 tokenizer, read from the kit's files (once: reading takes a second)."""
    graded = remote.active()
    key = graded.life if graded is not None else 0  # a restarted lab process holds none yet
    if key not in _GPT2:
        with explains_errors("Tokenizer.from_gpt2_files on the kit's GPT-2 files",
                             "vocab.json and merges.txt write each token's bytes through GPT-2's byte map: turn "
                             "each character back into its byte with the inverse map (a first line #version is "
                             "skipped)"):
            _GPT2[key] = T.Tokenizer.from_gpt2_files(*gpt2_files())
    return _GPT2[key]


# --- the byte map ------------------------------------------------------------------------------

def test_byte_map_is_gpt2s():
    expected = [str(c) for c in load_fixture(LAB, "byte_map")["chars"]]
    got = T.bytes_to_unicode()
    if not isinstance(got, dict) or sorted(got) != list(range(256)):
        raise AssertionError("bytes_to_unicode() must return a dict with the 256 byte values 0 … 255 as keys")
    wrong = [b for b in range(256) if got[b] != expected[b]]
    if wrong:
        b = wrong[0]
        raise AssertionError(
            f"GPT-2's byte map: {len(wrong)} of 256 bytes map to the wrong character; byte {b} must map to "
            f"{expected[b]!r} (U+{ord(expected[b]):04X}), got {got[b]!r}. Printable bytes map to themselves; "
            "the 68 others map to chr(256), chr(257), … in byte order (the space, byte 32, is 'Ġ')")


def test_byte_map_is_one_to_one():
    got = T.bytes_to_unicode()
    assert len(set(got.values())) == 256 and all(len(c) == 1 for c in got.values()), \
        "GPT-2's byte map must give 256 different one-character strings (it has to be inverted to read vocab.json)"


# --- pre-tokens ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected, concept", [
    pytest.param("hello world", ["hello", " world"],
                 "a space joins the word after it (the optional space before \\p{L}+)", id="space-joins-word"),
    pytest.param("a   b", ["a", "  ", " b"],
                 "a whitespace run before a word leaves its last space to the word (\\s+(?!\\S) before \\s+)",
                 id="whitespace-run-before-word"),
    pytest.param("end  \n", ["end", "  \n"], "a whitespace run at the end stays whole (\\s+(?!\\S))",
                 id="whitespace-run-at-end"),
    pytest.param("I'll don't", ["I", "'ll", " don", "'t"],
                 "contractions are pre-tokens of their own ('s 't 're 've 'm 'll 'd)", id="contractions"),
    pytest.param("I'LL", ["I", "'", "LL"],
                 "GPT-2's contractions are lowercase only: 'LL is punctuation then letters", id="contractions-lowercase"),
    pytest.param("abc123 4.5", ["abc", "123", " 4", ".", "5"],
                 "digits are a run of their own, apart from letters (\\p{N}+)", id="digits"),
    pytest.param("café naïve 日本", ["café", " naïve", " 日本"],
                 "letters are Unicode letters (\\p{L}), not only a–z", id="unicode-letters"),
    pytest.param("x!!?? (y)", ["x", "!!??", " (", "y", ")"],
                 "a run of punctuation is one pre-token, with an optional space before it", id="punctuation"),
])
def test_pretokenize_follows_gpt2s_pattern(text, expected, concept):
    got = list(T.pretokenize(text))
    assert got == expected, f"pretokenize({text!r}): expected {expected}, got {got}: {concept}"


def test_pretokenize_hard_strings():
    f = load_fixture(LAB, "gpt2_hard")
    pretokens = [str(p) for p in f["pretokens"]]
    start = 0
    for text, n in zip(f["text"], f["pretoken_counts"]):
        expected, start = pretokens[start:start + n], start + n
        text = str(text)
        if EOT in text:
            continue  # pretokenize knows no special tokens: split_on_special's tests cover these
        got = list(T.pretokenize(text))
        assert got == expected, f"pretokenize({text!r}): expected {expected}, got {got} (GPT-2's pattern)"
        assert "".join(got) == text, f"pretokenize({text!r}): the pre-tokens joined must give the text back"


# --- special tokens -----------------------------------------------------------------------------

def test_split_on_special_takes_special_tokens_literally():
    with explains_errors("split_on_special('a|b.c[d]', ['|', '.c['])",
                         "a special token is literal text: escape it before it goes into a pattern"):
        got = list(T.split_on_special("a|b.c[d]", ["|", ".c["]))
    assert got == ["a", "|", "b", ".c[", "d]"], \
        f"split_on_special('a|b.c[d]', ['|', '.c[']): expected ['a', '|', 'b', '.c[', 'd]'], got {got}: a special " \
        "token is literal text (escape it before it goes into a pattern)"


def test_split_on_special_keeps_each_special_token_whole():
    got = list(T.split_on_special(f"a{EOT}b {EOT}", [EOT]))
    assert got == ["a", EOT, "b ", EOT], \
        f"split_on_special: expected ['a', {EOT!r}, 'b ', {EOT!r}], got {got}: each special token is its own piece"


def test_split_on_special_longer_special_token_wins():
    double = EOT + EOT
    got = list(T.split_on_special(f"x{double}y{EOT}", [EOT, double]))
    assert got == ["x", double, "y", EOT], \
        f"split_on_special with overlapping special tokens: expected ['x', {double!r}, 'y', {EOT!r}], got {got}: " \
        "where two special tokens overlap, the longer one wins (try them longest first)"


def test_split_on_special_without_special_tokens():
    assert list(T.split_on_special("a b", [])) == ["a b"], "split_on_special with no special tokens: the text as one piece"
    assert list(T.split_on_special("", [EOT])) == [], "split_on_special of '' must give no pieces"


# --- merging a pair --------------------------------------------------------------------------------

def _merge_hint(got, pair):
    """What a wrong merge_word shows: the pair still in its output, or positions used twice."""
    if any(tuple(got[i:i + 2]) == pair for i in range(len(got) - 1)):
        return "the pair is still there: every occurrence of the pair is merged, the scan goes on after a merge"
    return "overlapping occurrences merge left to right, each position once"


def test_merge_word_overlapping_pairs_merge_from_the_left():
    for word, expected in (([5, 5, 5], [9, 5]), ([5, 5, 5, 5], [9, 9]), ([5], [5]), ([], [])):
        got = list(T.merge_word(word, (5, 5), 9))
        assert got == expected, f"merge_word({word}, (5, 5), 9): expected {expected}, got {got}: " \
                                + _merge_hint(got, (5, 5))


def test_merge_word_replaces_every_occurrence():
    got = list(T.merge_word([1, 2, 3, 1, 2, 1, 2], (1, 2), 9))
    assert got == [9, 3, 9, 9], f"merge_word([1, 2, 3, 1, 2, 1, 2], (1, 2), 9): expected [9, 3, 9, 9], got {got}: " \
                                + _merge_hint(got, (1, 2))


def test_merge_word_leaves_its_argument_unchanged():
    word = [1, 2, 3, 1, 2]
    got = list(T.merge_word(word, (1, 2), 9))
    assert word == [1, 2, 3, 1, 2], (
        f"merge_word(word, (1, 2), 9) changed the list it was given: word was [1, 2, 3, 1, 2], is now {word}. "
        "merge_word returns a new list and leaves its argument as it was (the trainer still reads the old word "
        "to take its pairs' counts off)")
    assert got == [9, 3, 9], f"merge_word([1, 2, 3, 1, 2], (1, 2), 9): expected [9, 3, 9], got {got}"


# --- training --------------------------------------------------------------------------------------

def test_train_bpe_vocab_size_gives_the_number_of_merges():
    text = "the cat sat on the mat with the hat and the bat " * 5
    for specials, n in (([], 10), ([EOT], 7), ([EOT, "<pad>"], 1), ([], 0)):
        size = 256 + len(specials) + n
        with explains_errors(f"train_bpe(vocab_size={size}, {len(specials)} special token(s))", RECOUNT):
            vocab, merges = T.train_bpe(text, size, specials)
        assert len(merges) == n and len(vocab) == size, (
            f"train_bpe(vocab_size={size}, {len(specials)} special token(s)): expected {n} merges and {size} "
            f"tokens, got {len(merges)} merges and {len(vocab)} tokens: vocab_size counts the 256 bytes, the "
            "special tokens and the merges, no more and no fewer")


def test_train_bpe_never_merges_across_pre_tokens():
    vocab, merges = T.train_bpe("ab ab ab ab!! ab.", 256 + 8)
    pieces = {"ab", " ab", "!!", "."}
    allowed = {p.encode()[i:j] for p in pieces for i in range(len(p)) for j in range(i + 1, len(p) + 1)}
    bad = [a + b for a, b in _as_merges(merges) if a + b not in allowed]
    assert not bad, f"train_bpe('ab ab ab ab!! ab.', vocab_size=264) merged {bad[0]!r}, which crosses a pre-token " \
                    "boundary: pairs are counted within each pre-token of GPT-2's pattern, never across"
    learned = {a + b for a, b in _as_merges(merges)}
    assert {b"ab", b"!!"} <= learned, (
        f"train_bpe('ab ab ab ab!! ab.', vocab_size=264) learned {sorted(learned)}: the pairs inside the pre-tokens, "
        "(a, b) five times and (!, !) once, must be merged (a vocabulary of 264 asks for up to 8 merges; fewer only "
        "when no pair is left)")


def test_train_bpe_stops_when_no_pair_is_left():
    # "ab ab" holds (a, b) twice and then (' ', ab) once: two merges, however many are asked for.
    with explains_errors("train_bpe('ab ab', vocab_size=267, <|endoftext|>)",
                         "once no pair is left (every count 0), stop: a pair whose count fell to 0 is no candidate"):
        vocab, merges = T.train_bpe("ab ab", 256 + 1 + 10, [EOT])
    _assert_merges(merges, [(b"a", b"b"), (b" ", b"ab")], "train_bpe('ab ab', vocab_size=267, <|endoftext|>)",
                   "Fewer merges than asked for only when no pair is left: once every pre-token is one token, "
                   "stop (a pair whose count has fallen to 0 is no pair: never merge it)")
    assert len(vocab) == 256 + 2 + 1 and vocab[258] == EOT.encode(), (
        f"train_bpe('ab ab', vocab_size=267, <|endoftext|>) learned 2 merges: the vocabulary is the 256 bytes, the "
        f"2 merges and <|endoftext|> at id 258, {259} tokens; got {len(vocab)} tokens")


def test_train_bpe_weights_pairs_by_how_often_each_pre_token_occurs():
    # " ab" occurs three times: (a, b) is counted 3 + 1 = 4 times, more than (q, r)'s 2 in " qrqr".
    _, merges = T.train_bpe("ab ab ab ab qrqr", 257)
    _assert_merges(merges, [(b"a", b"b")], "train_bpe('ab ab ab ab qrqr', 257)",
                   "A pair's count is summed over every occurrence of every pre-token (each distinct pre-token "
                   "weighted by how often it occurs)")


def test_train_bpe_never_merges_into_special_tokens():
    vocab, merges = T.train_bpe(f"hi{EOT}ho{EOT}hi{EOT}", 256 + 1 + 6, [EOT])
    _assert_merges(merges, [(b"h", b"i"), (b"h", b"o")], f"train_bpe('hi{EOT}ho{EOT}hi{EOT}', vocab_size=263, {EOT})",
                   "Between the special tokens the words are 'hi', 'ho', 'hi': (h, i) twice, then (h, o) once, and no "
                   "other pair (special tokens are cut out before counting, never merged into)")
    bad = [a + b for a, b in _as_merges(merges) if any(ch in (a + b) for ch in (b"<", b"|", b">"))]
    assert not bad, f"train_bpe merged {bad[0]!r} from the special token {EOT!r}: special tokens are cut out " \
                    "of the corpus before counting, never merged into"
    assert vocab[max(vocab)] == EOT.encode(), \
        f"train_bpe: the special token {EOT!r} must have the last id, {max(vocab)}; got {vocab[max(vocab)]!r} there"


def test_train_bpe_cuts_special_tokens_out_of_the_corpus():
    # Between the special tokens there are only single letters: no pair at all. Left in, the special token's
    # bytes would be merged; removed with the text around it joined ("qqq"), (q, q) would be.
    vocab, merges = T.train_bpe(f"q{EOT}q{EOT}q", 256 + 1 + 5, [EOT])
    assert not list(merges) and len(vocab) == 257, (
        f"train_bpe(q<|endoftext|>q<|endoftext|>q) learned {[a + b for a, b in _as_merges(merges)]}: the special "
        "token is cut out of the corpus and splits it, so no pair is left (no merge at all): never merge the "
        "special token's bytes, nor the text on its two sides")


def test_train_bpe_counts_overlapping_pairs():
    # "aaa" holds (a, a) twice: it beats (b, c), which a tie-break on a single count would pick.
    _, merges = T.train_bpe("aaa bc", 257)
    _assert_merges(merges, [(b"a", b"a")], "train_bpe('aaa bc', 257)",
                   "Overlapping pairs: 'aaa' holds the pair (a, a) twice (count every adjacent position)")


def test_train_bpe_tie_break_takes_the_greatest_pair():
    # "ab cd" holds (a, b), (' ', c) and (c, d) once each: (c, d) is the greatest by bytes,
    # then (a, b) beats (' ', cd) since b"a" > b" ".
    _, merges = T.train_bpe("ab cd", 258)
    _assert_merges(merges, [(b"c", b"d"), (b"a", b"b")], "train_bpe('ab cd', 258)",
                   "The tie-break: among pairs with equal counts the lexicographically greatest pair wins, "
                   "comparing (left bytes, right bytes)")


def test_train_bpe_tie_break_compares_bytes_not_ids():
    # After (z, z) → 256 and (a, a) → 257, the pairs (zz, zz) and (aa, aa) tie; bytes say b"zz" > b"aa",
    # ids say 257 > 256. (Newlines part the words without a leading space.)
    _, merges = T.train_bpe("zzzz\nzzzz\nzzb\naaaa\naaaa\naab", 256 + 4)
    expected = [(b"z", b"z"), (b"a", b"a"), (b"zz", b"zz"), (b"aa", b"aa")]
    _assert_merges(merges, expected, "train_bpe on words of z and a",
                   "The tie-break compares the pairs' bytes (vocab[left], vocab[right]), not their ids")


def test_train_bpe_tie_break_compares_bytes_of_cut_characters():
    # Every pair occurs once, and the tokens of the first merges are parts of a character, which all decode to
    # U+FFFD: only their bytes order them (0xF0 > 0xE6 > 0xE2 > …).
    _, merges = T.train_bpe("€😀 日", 256 + 4)
    expected = [(b"\xf0", b"\x9f"), (b"\xf0\x9f", b"\x98"), (b"\xf0\x9f\x98", b"\x80"), (b"\xe6", b"\x97")]
    _assert_merges(merges, expected, "train_bpe('€😀 日', 260): ties between parts of characters",
                   "The tie-break compares the pairs' bytes: a token that is part of a UTF-8 character decodes to "
                   "U+FFFD, so comparing decoded strings ties them all")


def test_train_bpe_lays_the_vocabulary_out_as_gpt2():
    vocab, merges = T.train_bpe("low lower lowest", 256 + 1 + 3, [EOT])
    assert [vocab[i] for i in range(256)] == [bytes([i]) for i in range(256)], \
        "train_bpe's vocabulary: ids 0 … 255 are the single bytes 0 … 255"
    for k, (a, b) in enumerate(_as_merges(merges)):
        assert vocab[256 + k] == a + b, f"train_bpe's vocabulary: id {256 + k} must be merge {k}, {a + b!r}, " \
                                         f"got {vocab[256 + k]!r}"

    with raises_clearly(ValueError, when="train_bpe with vocab_size=256 and one special token", mentions="vocab_size"):
        T.train_bpe("abc", 256, [EOT])


RECOUNT = ("After each merge the pair counts must be those of a recount from scratch: the words that held the "
           "pair lose their old pairs' counts and gain their new ones")


def test_train_bpe_matches_the_reference_on_a_sample():
    f = load_fixture(LAB, "train_sample")
    what = "train_bpe on a Shakespeare sample (vocab_size 557, <|endoftext|>)"
    with explains_errors(what, RECOUNT):
        _, merges = T.train_bpe(str(f["text"]), int(f["vocab_size"]), [str(s) for s in f["specials"]])
    _assert_merges(merges, _stored_merges(f), what, RECOUNT)


def test_train_bpe_matches_the_reference_where_ties_decide():
    f = load_fixture(LAB, "train_ties")
    with explains_errors("train_bpe on random words over four letters", RECOUNT):
        _, merges = T.train_bpe(str(f["text"]), int(f["vocab_size"]), [])
    _assert_merges(merges, _stored_merges(f), "train_bpe on random words over four letters (many equal counts)",
                   "Most of these merges are decided by the tie-break (the greatest pair by bytes), and the pair "
                   "counts after each merge must equal a recount")


# --- encoding and decoding ---------------------------------------------------------------------

def test_encode_word_applies_merges_by_rank():
    vocab, merges = _tiny()
    ids = _ids_of(vocab)
    tok = T.Tokenizer(vocab, merges)
    got = [vocab[i] for i in tok.encode_word(b"abc")]
    if got == [b"abc"]:
        return
    why = {(b"ab", b"c"): "merged (a, b) first: the pair to merge is the one of lowest rank (rank 0 is (b, c)), "
                          "not the leftmost nor the highest-ranked",
           (b"a", b"bc"): "stopped after one merge: keep merging by rank until no adjacent pair is a merge",
           (b"a", b"b", b"c"): "no merge applied: one id per byte is where encode_word starts, then the merges apply "
                               "by rank, lowest first, until none applies"}
    raise AssertionError(f"encode_word(b'abc') with merges (b, c), (a, b), (a, bc) in rank order: expected "
                         f"[b'abc'] (id {ids[b'abc']}), got {got}: "
                         + why.get(tuple(got), "merges apply by rank, lowest first, until none applies"))


def test_encode_word_merges_every_occurrence_of_the_best_pair():
    vocab, merges = _tiny()
    got = [vocab[i] for i in T.Tokenizer(vocab, merges).encode_word(b"bcbcb")]
    assert got == [b"bc", b"bc", b"b"], \
        f"encode_word(b'bcbcb'): expected [b'bc', b'bc', b'b'], got {got}: every occurrence of the merged pair merges"


def test_encode_word_rank_is_the_position_in_merges_not_an_id():
    # The merged tokens numbered against their ranks: abc is 256, ab 257, bc 258.
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"abc", 257: b"ab", 258: b"bc"}
    merges = [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc")]
    tok = T.Tokenizer(vocab, merges)
    got = [vocab[int(i)] for i in tok.encode_word(b"abc")]
    assert got == [b"abc"], (
        f"encode_word(b'abc') with merges (b, c), (a, b), (a, bc) in rank order, their tokens numbered bc = 258, "
        f"ab = 257, abc = 256: expected [b'abc'], got {got}: a merge's rank is its position in merges (lowest "
        "first), not the id of the token it makes (self._ranks[pair] is (rank, merged id))")


def test_encode_keeps_merges_inside_pre_tokens():
    vocab, merges = _tiny()
    ids = _ids_of(vocab)
    got = list(T.Tokenizer(vocab, merges).encode("a a"))
    expected = [ids[b"a"], ids[b" a"]]
    assert got == expected, (f"encode('a a') with a merge (a, ' '): expected {expected} (a, ' a'), got {got}: "
                             "merges apply within each pre-token, never across two")


def test_encode_special_tokens_are_single_ids():
    vocab, merges = _tiny()
    tok = T.Tokenizer(vocab, merges, [EOT, EOT + EOT])
    ids = _ids_of(tok.vocab)
    got = list(tok.encode(f"ab{EOT}{EOT}{EOT}bc"))
    expected = [ids[b"ab"], ids[(EOT + EOT).encode()], ids[EOT.encode()], ids[b"bc"]]
    assert got == expected, (f"encode with special tokens {EOT!r} and its double: expected {expected}, got {got}: "
                             "special tokens are split out first, one id each, the longer one winning an overlap, "
                             "and never merged with the text around them")


def test_decode_joins_bytes_before_decoding():
    vocab = {i: bytes([i]) for i in range(256)}
    tok = T.Tokenizer(vocab, [])
    ids = list("€ and 日".encode())
    got = tok.decode(ids)
    assert got == "€ and 日", (f"decode of one id per byte of '€ and 日': expected '€ and 日', got {got!r}: join every "
                               "token's bytes into one byte sequence and decode it once (a character's bytes can "
                               "sit in several tokens)")


def test_decode_cut_characters_become_replacement_characters():
    vocab = {i: bytes([i]) for i in range(256)}
    tok = T.Tokenizer(vocab, [])
    with raises_clearly(ValueError, when="decode of an id outside the vocabulary", mentions="vocabulary"):
        tok.decode([256])
    cut = "€".encode()[:2] + b"x"
    with explains_errors(f"decode of the bytes {cut!r}", "bytes that form no character (a character cut in the "
                         "middle) become the replacement character U+FFFD: decode with errors='replace'"):
        got = tok.decode(list(cut))
    assert got == "\ufffdx", (f"decode of the bytes {cut!r} (a character cut after 2 of its 3 bytes, then 'x'): "
                              f"expected '\\ufffdx', got {got!r}: bytes that form no character become one "
                              "replacement character U+FFFD each run, as HuggingFace decodes (errors='replace')")


def test_encode_iterable_streams_chunks_cut_anywhere():
    vocab, merges = _tiny()
    tok = T.Tokenizer(vocab, merges, [EOT])
    text = f"abc a  bc\n\n abca{EOT}bcab a\n  a{EOT}"
    streamed = {size: list(tok.encode_iterable([text[i:i + size] for i in range(0, len(text), size)]))
                for size in (1, 2, 3, 5, 7)}
    expected = list(tok.encode(text))
    for size, got in streamed.items():
        _assert_ids(got, expected, f"encode_iterable of the text in chunks of {size} characters",
                    "A chunk can end inside a pre-token or a special token: hold the text back until what "
                    "follows cannot change it, and encode what is left at the end")


def test_encode_iterable_of_lines_equals_encode():
    gpt2 = _gpt2()
    text = "First line\n\n  indented second line\nthird, with I'll<|endoftext|>\nlast"
    got = list(gpt2.encode_iterable(text.splitlines(keepends=True)))
    _assert_ids(got, list(gpt2.encode(text)), "encode_iterable of a text's lines (GPT-2)",
                "The ids of the lines streamed must be those of the whole text: a whitespace run or a special "
                "token can span the end of a chunk")
    assert list(gpt2.encode_iterable([])) == [], "encode_iterable of no lines must yield nothing"


def test_encode_iterable_encodes_held_back_pre_tokens_as_found():
    gpt2 = _gpt2()
    # The second chunk makes "word", "\n", "\n" certain but not the long word after them.
    chunks = ["word\n\nsupercal", "ifragilistic and more"]
    got = list(gpt2.encode_iterable(chunks))
    _assert_ids(got, list(gpt2.encode("".join(chunks))), f"encode_iterable of the chunks {chunks} (GPT-2)",
                "Encode each certain pre-token as found: re-encoding the certain text as a string joins its last "
                "whitespace run up differently ('\\n\\n' at the end of a text is one pre-token, before a word two)")


def test_encode_iterable_yields_ids_before_the_input_ends():
    gpt2 = _gpt2()
    line = "One line of a long file, read as it streams.\n"
    expected = list(gpt2.encode(line * 2))[:len(list(gpt2.encode(line)))]

    def lines():
        for k in range(1000):
            yield line
        raise AssertionError(
            "encode_iterable read 1,000 lines without yielding the ids of the first one: it must stream, yielding "
            "each id once the text before it cannot change (holding back only the last few characters), so that "
            "a file of any size streams in bounded memory; encode(''.join(chunks)) reads the whole input first")

    stream = gpt2.encode_iterable(lines())
    got = [next_item(stream) for _ in expected]
    _assert_ids(got, expected, "the first ids that encode_iterable streams from a file of identical lines")


STREAM_RULE = ("A pre-token is certain only once it ends MORE than max(3, longest special token) characters "
               "before the end of what has been read: where it ends depends on the characters after it (a "
               "whitespace run gives its last character back when a non-space follows) and on whether a special "
               "token starts right after it, which is known only once that special token has been read whole")


def _stream_cases():
    f = load_fixture(LAB, "gpt2_stream")
    return [(str(t), [int(i) for i in ids]) for t, ids in zip(f["text"], _ragged(f["ids"], f["id_offsets"]))]


def test_encode_iterable_cut_at_every_point():
    gpt2 = _gpt2()
    for text, expected in _stream_cases():
        for k in range(len(text) + 1):
            _assert_ids(gpt2.encode_iterable([text[:k], text[k:]]), expected,
                        f"encode_iterable of {text!r} cut after {k} characters, {text[:k]!r} + {text[k:]!r} "
                        "(GPT-2's ids from HuggingFace and tiktoken)", STREAM_RULE)
        _assert_ids(gpt2.encode_iterable(list(text)), expected,
                    f"encode_iterable of {text!r} one character per chunk (GPT-2)", STREAM_RULE)


_STREAM_ATOMS = ["a", "b", "l", "d", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u3000", "'", "'ll", "'s", "'l", "1",
                 "!", "é", EOT, "<|", "|>", "<|a|>"]


@given(st.lists(st.sampled_from(_STREAM_ATOMS), min_size=1, max_size=10), st.data())
def test_encode_iterable_random_chunkings(atoms, data):
    text = "".join(atoms)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=4), label="cut points"))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    vocab, merges = _tiny()
    for name, tok in (("GPT-2", _gpt2()), ("the hand-made vocabulary with <|endoftext|> and <|a|>",
                                            T.Tokenizer(vocab, merges, [EOT, "<|a|>"]))):
        _assert_ids(tok.encode_iterable(chunks), tok.encode(text),
                    f"encode_iterable of the chunks {chunks} ({name}) against encode of the whole text", STREAM_RULE)


# --- GPT-2's own tokenizer -------------------------------------------------------------------------

def test_gpt2_files_load():
    gpt2 = _gpt2()
    assert len(gpt2.vocab) == 50257, f"GPT-2's vocabulary has 50,257 tokens, got {len(gpt2.vocab)}"
    assert len(gpt2.merges) == 50000, (f"GPT-2's merges.txt holds 50,000 merges after its #version line, got "
                                       f"{len(gpt2.merges)}")
    assert gpt2.vocab[50256] == EOT.encode() and gpt2.vocab[220] == b" " and gpt2.vocab[0] == b"!", \
        "GPT-2's vocabulary: id 0 is b'!', 220 is b' ' (written 'Ġ' in vocab.json), 50256 is <|endoftext|>"
    assert gpt2.merges[0] == (b" ", b"t"), \
        f"GPT-2's first merge is (b' ', b't') ('Ġ t' in merges.txt), got {gpt2.merges[0]!r} (byte map inverted?)"


def test_gpt2_encode_matches_huggingface_and_tiktoken():
    gpt2 = _gpt2()
    f = load_fixture(LAB, "gpt2_hard")
    for text, expected in zip(f["text"], _ragged(f["ids"], f["id_offsets"])):
        _assert_ids(gpt2.encode(str(text)), expected, f"GPT-2's encode({str(text)!r})",
                    "These ids are HuggingFace's and tiktoken's")


def test_gpt2_decode_gives_the_text_back():
    gpt2 = _gpt2()
    f = load_fixture(LAB, "gpt2_hard")
    for text, ids in zip(f["text"], _ragged(f["ids"], f["id_offsets"])):
        got = gpt2.decode([int(i) for i in ids])
        assert got == str(text), f"GPT-2's decode of the ids of {str(text)!r}: got {got!r}"


def test_gpt2_decode_of_cut_sequences_matches_huggingface():
    gpt2 = _gpt2()
    f = load_fixture(LAB, "gpt2_hard")
    ids = [int(i) for i in f["cut_ids"]]
    for k, expected in enumerate(f["cut_text"]):
        with explains_errors(f"GPT-2's decode of the first {k} ids of {str(f['cut_text'][-1])!r}",
                             "a character cut in the middle becomes the replacement character U+FFFD"):
            got = gpt2.decode(ids[:k])
        assert got == str(expected), (f"GPT-2's decode of the first {k} ids of {str(f['cut_text'][-1])!r}: "
                                      f"expected {str(expected)!r}, got {got!r}: a character cut in the middle "
                                      "becomes the replacement character U+FFFD, as in HuggingFace's decode")


# --- properties ----------------------------------------------------------------------------------

@given(st.text(max_size=60))
def test_gpt2_round_trip_any_string(s):
    gpt2 = _gpt2()
    ids = list(gpt2.encode(s))
    bad = [i for i in ids if not 0 <= int(i) < 50257]
    assert not bad, f"encode({s!r}) gave id {bad[0]}, outside GPT-2's vocabulary 0 … 50256"
    assert gpt2.decode(ids) == s, f"decode(encode({s!r})) gave {gpt2.decode(ids)!r}: the round trip must be exact"


@given(st.text(alphabet=st.sampled_from("ab c\n€é"), min_size=0, max_size=40),
       st.integers(min_value=0, max_value=12), st.booleans())
def test_trained_tokenizer_round_trip_and_merge_count(s, n, with_special):
    corpus = "abba cab bac ab ac ca €é é€ \n\n abc cba " * 3
    specials = [EOT] if with_special else []
    vocab, merges = T.train_bpe(corpus, 256 + len(specials) + n, specials)
    assert len(merges) == n, f"train_bpe asked for {n} merges (vocab_size = 256 + {len(specials)} + {n}) gave {len(merges)}"
    tok = T.Tokenizer(vocab, merges, specials)
    text = s + (EOT + s if with_special else "")
    ids = list(tok.encode(text))
    assert all(int(i) in vocab for i in ids), f"encode({text!r}) gave an id outside the trained vocabulary"
    assert tok.decode(ids) == text, f"decode(encode({text!r})) gave {tok.decode(ids)!r}: the round trip must be exact"
