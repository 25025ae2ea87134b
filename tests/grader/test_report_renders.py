"""The class report is a self-contained page that a browser renders: headless Chromium
loads it with no network, and the screenshot shows the chart's bars."""

import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from grader.grade import LabResult, StudentResult, TestRecord
from grader.outputs import class_stats, report_html

BAR_RGB = (0x3B, 0x82, 0xF6)  # the chart's bar colour in grader/outputs.py
LABS = ["01_causal_mask", "02_embeddings"]


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on this machine (CI installs Debian's chromium package): the report's "
                "rendering is not checked here")


def _student(name, passed):
    r = StudentResult(name, f"{name}.zip", total=0.0, max_total=20.0)
    for lab in LABS:
        lr = LabResult(lab, max_points=10.0)
        for i in range(4):
            ok = i < passed
            lr.tests.append(TestRecord(f"tests/{lab}/test_x.py::test_{i}", lab, False, "passed" if ok else "failed",
                                       2.5 if ok else 0.0, 2.5, "" if ok else "AssertionError: softmax: 3 of 9 elements "
                                       "differ (atol=1e-05, rtol=0.0001); largest difference 1 at index (0, 1)", 0.01))
        lr.points = sum(t.points for t in lr.tests)
        r.labs[lab] = lr
        r.total += lr.points
    return r


def _png_pixels(data: bytes) -> np.ndarray:
    """RGB(A) pixels of a non-interlaced 8-bit PNG (what Chromium's screenshots are)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), f"unexpected PNG format (depth {depth}, colour type {color})"
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), np.int32)
    for y in range(height):  # undo the per-row filters
        f, row = raw[y, 0], raw[y, 1:].astype(np.int32)
        prev = out[y - 1] if y else np.zeros_like(row)
        if f == 0:
            out[y] = row
        elif f == 2:
            out[y] = (row + prev) & 255
        else:
            cur = out[y]
            for x in range(row.size):
                a = cur[x - channels] if x >= channels else 0
                b = prev[x]
                c = prev[x - channels] if x >= channels else 0
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (row[x] + pred) & 255
    return out.reshape(height, width, channels)[..., :3]


def render(page, tmp_path, window="1000,700"):
    """(the DOM Chromium builds from ``page``, the screenshot's RGB pixels)."""
    browser = _chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
             f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={window}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = page.with_suffix(".png")
    run = subprocess.run([browser, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    return dom.stdout, _png_pixels(shot.read_bytes())


def test_report_renders_in_headless_chromium(tmp_path):
    results = [_student("alice", 4), _student("bob", 2), _student("carol", 1)]
    page = tmp_path / "report.html"
    page.write_text(report_html(LABS, results, class_stats(LABS, results)), encoding="utf-8")
    dom, pixels = render(page, tmp_path)
    assert "<svg" in dom and "alice" in dom and "mean score per lab" in dom, dom[:2000]
    bar = np.all(np.abs(pixels - np.array(BAR_RGB)) <= 2, axis=-1)
    assert bar.sum() > 2000, f"the screenshot shows {int(bar.sum())} pixels of the chart's bar colour: the chart did not render"
    columns = np.flatnonzero(bar.any(axis=0))
    runs = 1 + int((np.diff(columns) > 1).sum()) if columns.size else 0
    assert runs >= len(LABS), f"expected one bar per lab ({len(LABS)}), the screenshot shows {runs}"
