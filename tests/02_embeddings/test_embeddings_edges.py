"""Lab 02 · edge case: the sinusoids' angles computed in float64, as the README advises
(float32 angles drift visibly at long positions)."""

import numpy as np

from gptkit.testing import assert_close, lab

E = lab("embeddings")


def test_sinusoid_angles_are_accurate_at_long_positions():
    L, D = 20_000, 32
    pos = np.arange(L, dtype=np.float64)[:, None]
    angles = pos / np.power(10000.0, np.arange(0, D, 2, dtype=np.float64)[None, :] / D)
    want = np.empty((L, D))
    want[:, 0::2], want[:, 1::2] = np.sin(angles), np.cos(angles)
    got = np.asarray(E.sinusoidal_positional_encoding(L, D))
    rows = [0, 1, 4095, 12_345, L - 1]
    if got.shape == want.shape:
        off = np.abs(got[rows].astype(np.float64) - want[rows]).max(axis=1)  # per position
        if off[:2].max() <= 2e-6 < off[2:].max() < 0.05:
            raise AssertionError(
                f"sinusoidal_positional_encoding({L}, {D}): right at positions 0 and 1 but off by up to "
                f"{off[2:].max():.2g} at positions {rows[2:]}: the error grows with the position, the mark of angles "
                "computed in float32. Compute the angles pos / 10000^(2i/D) in float64 and convert only the finished "
                "table to float32: a float32 angle near 20,000 is off by up to 0.001 radians (its spacing there)")
    assert_close(got[rows], want[rows].astype(np.float32), what=f"sinusoidal_positional_encoding({L}, {D}) at "
                 f"positions {rows}", atol=2e-6, rtol=0,
                 hint="compute the angles pos / 10000^(2i/D) in float64 and convert only the finished table to "
                      "float32: a float32 angle near 20,000 is off by up to 0.001 radians (its spacing there)")
