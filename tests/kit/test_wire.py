"""The grader's channel to lab code carries plain data only, and decoding a message never
runs code the sender chose (no pickle; fixed dtypes; shapes checked against the bytes)."""

import json
import pathlib
import socket
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gptkit.testing import wire


def _round_trip(value, other=None):
    a, b = socket.socketpair()
    try:
        enc = wire.Encoder(other or (lambda v, e: (_ for _ in ()).throw(wire.WireError(wire.type_name(v)))))
        wire.send(a, enc(value), enc.buffers)
        reader = wire.Reader(b)
        dec = wire.Decoder(reader.read_into, lambda h: ("handle", h), lambda g: ("generator", g.ref))
        return dec(reader.header())
    finally:
        a.close()
        b.close()


def _raw(tree, payload=b""):
    """Decode a hand-made message (what a hostile lab process could send)."""
    a, b = socket.socketpair()
    try:
        head = json.dumps(tree).encode()
        a.sendall(struct.pack("<Q", len(head)) + head + payload)
        a.close()
        reader = wire.Reader(b)
        return wire.Decoder(reader.read_into, lambda h: ("handle", h), lambda g: ("generator", g.ref))(reader.header())
    finally:
        b.close()


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
    | hnp.arrays(st.sampled_from([np.float32, np.int64, np.bool_, np.float16]), hnp.array_shapes(min_dims=0, max_side=3)),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3),
    max_leaves=10)


def _same(a, b):
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@given(plain)
def test_plain_data_round_trips(value):
    assert _same(value, _round_trip(value))


def test_special_values_round_trip():
    out = _round_trip([float("nan"), float("inf"), np.float32(2.5), np.int64(7), b"\x00\x01", pathlib.Path("/a/b"),
                       slice(1, None, 2), Ellipsis, np.dtype("float32"), np.float32])
    assert np.isnan(out[0]) and out[1] == float("inf") and type(out[2]) is np.float32 and out[3] == 7
    assert out[4:] == [b"\x00\x01", pathlib.Path("/a/b"), slice(1, None, 2), Ellipsis, np.dtype("float32"), np.float32]
    arr = _round_trip(np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2])
    assert arr.flags.writeable and arr.flags.c_contiguous and arr.tolist() == [[0, 2], [3, 5]]


@pytest.mark.parametrize("value", [np.array([object()]), np.zeros(2).view(np.recarray), {1, 2}, object(),
                                   np.array(["text"]), np.datetime64("2020")])
def test_what_is_not_plain_data_is_refused(value):
    with pytest.raises(wire.WireError):
        _round_trip(value)


@pytest.mark.parametrize("tree,payload", [
    ({"$a": ["|O", [1]]}, b"\0" * 8),            # object arrays: pickle in disguise
    ({"$a": ["<f4", [-1]]}, b""),                 # negative dimension
    ({"$a": ["<f4", [2 ** 40, 2 ** 40]]}, b""),   # more bytes than any message may hold
    ({"$a": ["<f4", [4]]}, b"\0" * 8),            # fewer bytes than the shape claims
    ({"$unknown": 1}, b""),
    ({"$h": "1"}, b""),
    ({"$m": [[1]]}, b""),
    ({"$m": [[[1], 2]]}, b""),                    # unhashable key
    ({"$r": 0}, b""),                             # a reference to an argument never sent
    ({"$st": "object_"}, b""),
    ({"$g": [1, {"bit_generator": "os.system", "state": {}}]}, b""),
    ({"$sl": ["a", None, None]}, b""),
    ({"$f": "1e999999"}, b""),
    ({"a": 1, "b": 2}, b""),
])
def test_malformed_messages_are_refused(tree, payload):
    with pytest.raises((wire.WireError, EOFError)):
        _raw(tree, payload)


def test_deep_nesting_is_refused():
    tree = 1
    for _ in range(wire.MAX_DEPTH + 5):
        tree = [tree]
    with pytest.raises(wire.WireError):
        _raw(tree)
    with pytest.raises(wire.WireError):
        _round_trip(tree)
