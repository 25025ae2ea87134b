"""Hidden checks for lab 10: corpora and vocabularies the public tests do not use, against
independent computations written here (a trainer that recounts every pair after each
merge, an encoder that applies each merge in rank order to the whole word)."""

import numpy as np

from gptkit.testing import lab

T = lab("tokenizer")
EOT = "<|endoftext|>"


def _recount_trainer(words: dict[str, int], n_merges: int):
    """BPE by definition: recount every pair of every word after each merge."""
    seqs = {w: [bytes([b]) for b in w.encode()] for w in words}
    merges = []
    for _ in range(n_merges):
        counts = {}
        for w, seq in seqs.items():
            for pair in zip(seq, seq[1:]):
                counts[pair] = counts.get(pair, 0) + words[w]
        if not counts:
            break
        best = max(counts, key=lambda p: (counts[p], p))
        merges.append(best)
        for w, seq in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(seq[i] + seq[i + 1])
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
    return merges


def _words(text: str) -> dict[str, int]:
    out = {}
    for piece in T.split_on_special(text, [EOT]):
        if piece != EOT:
            for w in T.pretokenize(piece):
                out[w] = out.get(w, 0) + 1
    return out


def test_train_bpe_equals_a_recount_on_random_corpora():
    rng = np.random.default_rng(1011)
    for trial in range(4):
        alphabet = list("abcde") + [" ", "\n", "é", "!"]
        text = "".join(rng.choice(alphabet, size=600))
        text = text[:300] + EOT + text[300:]
        n = int(rng.integers(10, 40))
        _, merges = T.train_bpe(text, 256 + 1 + n, [EOT])
        expected = _recount_trainer(_words(text), n)
        got = [(bytes(a), bytes(b)) for a, b in merges]
        assert got == expected, f"corpus {trial}: train_bpe's merges differ from a recount after each merge"


def test_encode_equals_merges_applied_in_rank_order():
    rng = np.random.default_rng(1012)
    text = "".join(rng.choice(list("xyz w"), size=500))
    vocab, merges = T.train_bpe(text, 256 + 30)
    assert len(merges) == 30, f"train_bpe(vocab_size=286) on 500 letters of 'xyz w' learned {len(merges)} merges, not 30"
    tok = T.Tokenizer(vocab, merges)
    inverse = {b: i for i, b in vocab.items()}
    for word in set(T.pretokenize(text[:200])):
        seq = [bytes([b]) for b in word.encode()]
        for a, b in merges:  # each merge in rank order over the whole word gives the same result
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seq = out
        assert list(tok.encode_word(word.encode())) == [inverse[s] for s in seq], f"encode_word({word!r})"


def test_decode_of_random_bytes_equals_pythons_replace():
    rng = np.random.default_rng(1013)
    tok = T.Tokenizer({i: bytes([i]) for i in range(256)}, [])
    for _ in range(20):
        data = bytes(rng.integers(0, 256, size=int(rng.integers(0, 30))).tolist())
        assert tok.decode(list(data)) == data.decode("utf-8", errors="replace")


def test_special_token_absent_from_the_vocabulary_gets_the_next_id():
    vocab, merges = T.train_bpe("one two three one two", 256 + 5)
    tok = T.Tokenizer(vocab, merges, ["<pad>"])
    ids = list(tok.encode("one<pad>two"))
    assert max(vocab) + 1 in ids and tok.decode(ids) == "one<pad>two"
