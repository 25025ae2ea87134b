"""Lab 02 · token embeddings, learned positions, sinusoidal encodings, their sum."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptkit.testing import assert_close, assert_float32, assert_ndarray, lab, load_fixture, raises_clearly

emb = lab("embeddings")
LAB = "02_embeddings"


def _one_table(layer_class, case):
    """A TokenEmbedding or PositionalEmbedding holding the stored case's ``weight``."""
    f = load_fixture(LAB, case)
    layer = layer_class(*f["weight"].shape, rng=np.random.default_rng(0))
    layer.weight = f["weight"].copy()  # the test's own stays as stored, whatever lab code does to its copy
    return layer, f


def _token_embedding():
    return _one_table(emb.TokenEmbedding, "token_embedding")


def _gpt_embedding():
    f = load_fixture(LAB, "gpt_embedding")
    (V, D), L = f["wte"].shape, f["wpe"].shape[0]
    layer = emb.GPTEmbedding(V, L, D, rng=np.random.default_rng(0))
    layer.wte.weight, layer.wpe.weight = f["wte"].copy(), f["wpe"].copy()
    return layer, f


# --- token embedding ---------------------------------------------------------------------

def test_token_embedding_looks_up_rows():
    layer, f = _token_embedding()
    out = layer(f["ids"])
    assert_close(out, f["out"], what="TokenEmbedding(ids) (B, T, D)", atol=0, rtol=0,
                 hint="the embedding of id i is row i of weight (V, D)")
    assert_float32(out, "TokenEmbedding output")


@given(st.lists(st.integers(0, 12), min_size=1, max_size=20))
def test_token_embedding_row_by_row(ids):
    layer, f = _token_embedding()
    out = assert_ndarray(layer(np.array([ids])), "TokenEmbedding(ids)", dtype=np.float32,
                         shape=(1, len(ids), f["weight"].shape[1]))
    for t, i in enumerate(ids):
        assert np.array_equal(out[0, t], f["weight"][i]), (
            f"TokenEmbedding: position {t} holds id {i} but its vector is not weight[{i}]"
        )


@pytest.mark.parametrize("bad", [13, 100, -1])
def test_token_embedding_rejects_ids_outside_vocabulary(bad):
    layer, f = _token_embedding()
    layer(f["ids"])
    ids = np.array([[0, 3, bad]])
    with raises_clearly((ValueError, IndexError), when=f"token id {bad} outside the vocabulary [0, 13)",
                        mentions=str(bad)):
        layer(ids)


def test_token_embedding_negative_id_is_not_silently_wrapped():
    layer, f = _token_embedding()
    layer(f["ids"])
    try:
        out = layer(np.array([[-1]]))
    except (ValueError, IndexError):
        return
    raise AssertionError(
        "TokenEmbedding accepted id -1 and returned weight[-1] (the last row): negative ids are "
        f"outside the vocabulary and must raise a clear error (got a {np.shape(out)} result)"
    )


def test_token_embedding_rejects_float_ids():
    layer, f = _token_embedding()
    layer(f["ids"])
    with raises_clearly(TypeError, when="float token ids"):
        layer(np.array([[1.0, 2.0]]))


# --- learned positional embedding -----------------------------------------------------------

def _positional():
    return _one_table(emb.PositionalEmbedding, "positional_embedding")


def test_positional_embedding_slices_positions():
    layer, f = _positional()
    assert_close(layer(4), f["pos_0_4"], what="PositionalEmbedding(4): positions 0…3", atol=0, rtol=0,
                 diagnoses={"positions 1…4 (off by one)": f["weight"][1:5]},
                 hint="the first token sits at position 0")
    assert_close(layer(5, offset=3), f["pos_3_5"], what="PositionalEmbedding(5, offset=3): positions 3…7",
                 atol=0, rtol=0, diagnoses={"positions 0…4 (the offset ignored)": f["weight"][:5],
                                            "positions 4…8 (off by one)": f["weight"][4:9]},
                 hint="with an offset, the sequence starts at position `offset`")


def test_positional_embedding_rejects_positions_past_max_seq_len():
    layer, f = _positional()
    assert_ndarray(layer(10), "PositionalEmbedding(10): all max_seq_len=10 positions must be usable",
                   dtype=np.float32, shape=(10, 6))
    with raises_clearly(ValueError, when="11 positions with max_seq_len=10", mentions="max_seq_len"):
        layer(11)
    with raises_clearly(ValueError, when="positions 8…10 with max_seq_len=10", mentions="max_seq_len"):
        layer(3, offset=8)


# --- sinusoidal encoding ------------------------------------------------------------------

def test_sinusoidal_encoding_matches_reference():
    f = load_fixture(LAB, "sinusoidal")
    pe = emb.sinusoidal_positional_encoding(50, 16)
    pos = np.arange(50)[:, None]
    i = np.arange(8)[None, :]
    ang = pos / 10000 ** (2 * i / 16)
    swapped = np.empty((50, 16)); swapped[:, 0::2] = np.cos(ang); swapped[:, 1::2] = np.sin(ang)
    wrong_rate = np.empty((50, 16)); a2 = pos / 10000 ** (i / 16)
    wrong_rate[:, 0::2] = np.sin(a2); wrong_rate[:, 1::2] = np.cos(a2)
    def table(a):  # sin of angles a on the even columns, cos on the odd
        t = np.empty((50, 16))
        t[:, 0::2], t[:, 1::2] = np.sin(a), np.cos(a)
        return t

    j = np.arange(16)[None, :]
    own_rate = np.where(j % 2 == 0, np.sin(pos / 10000 ** (j / 16)), np.cos(pos / 10000 ** (j / 16)))
    assert_close(pe, f["pe_50_16"], what="sinusoidal_positional_encoding(50, 16)", atol=1e-5,
                 diagnoses={"cos on even columns and sin on odd (swapped)": swapped,
                            "angles pos/10000^(i/D) instead of pos/10000^(2i/D)": wrong_rate,
                            "angles pos/10000^(4i/D) (2i doubled again) instead of pos/10000^(2i/D)":
                                table(pos / 10000 ** (4 * i / 16)),
                            "angles pos·10000^(2i/D), multiplied instead of divided by 10000^(2i/D)":
                                table(pos * 10000 ** (2 * i / 16)),
                            "angles pos/1000^(2i/D): the base is 10000, pos/10000^(2i/D)": table(pos / 1000 ** (2 * i / 16)),
                            "each column its own rate, pos/10000^(j/D) for column j: columns 2i and 2i+1 share "
                            "the angle pos/10000^(2i/D)": own_rate},
                 hint="column 2i is sin(pos/10000^(2i/D)), column 2i+1 is cos of the same angle")
    assert_float32(pe, "sinusoidal_positional_encoding")


def test_sinusoidal_encoding_odd_width():
    f = load_fixture(LAB, "sinusoidal")
    assert_close(emb.sinusoidal_positional_encoding(7, 5), f["pe_7_5"],
                 what="sinusoidal_positional_encoding(7, 5) (odd width)", atol=1e-5,
                 hint="with odd D the last column is a sin column")


def test_sinusoidal_encoding_position_zero():
    pe = emb.sinusoidal_positional_encoding(4, 8)
    assert_close(pe[0], np.tile([0.0, 1.0], 4).astype(np.float32), what="encoding of position 0",
                 hint="at position 0 every angle is 0: sin columns are 0, cos columns are 1")


# --- the sum ---------------------------------------------------------------------------------

def test_gpt_embedding_adds_tokens_and_positions():
    layer, f = _gpt_embedding()
    ids = f["ids"]
    T = ids.shape[1]
    out = layer(ids.copy())
    assert_close(out, f["out"], what="GPTEmbedding(ids) (B, T, D)",
                 diagnoses={"token embeddings only (positions missing)": f["wte"][ids],
                            "positions 1…T instead of 0…T-1 (off by one)": f["wte"][ids] + f["wpe"][1:T + 1]},
                 hint="out = wte(ids) + wpe(T): each token's vector plus its position's vector")
    assert_float32(out, "GPTEmbedding output")


def test_gpt_embedding_offset():
    layer, f = _gpt_embedding()
    ids = f["ids"]
    T = ids.shape[1]
    assert_close(layer(ids.copy(), offset=2), f["out_offset2"], what="GPTEmbedding(ids, offset=2)",
                 diagnoses={"positions 0…T-1 (the offset ignored)": f["wte"][ids] + f["wpe"][:T]},
                 hint="with offset=2 the first token sits at position 2")


def test_gpt_embedding_checks_inputs():
    layer, f = _gpt_embedding()
    layer(f["ids"])
    with raises_clearly(ValueError, when="GPTEmbedding on 1-D ids (expects (B, T))", mentions="dimensions"):
        layer(np.array([1, 2, 3]))
    with raises_clearly(ValueError, when="GPTEmbedding on 11 tokens with max_seq_len=10", mentions="max_seq_len"):
        layer(np.zeros((1, 11), dtype=np.int64))
