"""Whether a matplotlib figure can be read: measured on the figure, not judged by eye.

``legibility_problems(fig)`` lists, in words, what a reader would stumble on:

- text smaller than ``MIN_POINTS`` (titles, labels, tick labels, annotations, legends);
- a heatmap (an image or mesh coloured through a colour map) without a colour bar;
- tick labels of one axis that overlap their neighbours, measured on each label's own
  rotated box, so that labels at 45° or 90° that only look close are not reported.

The notebooks' tests (``tests/kit/test_notebooks.py``) run every notebook with
``GPTKIT_FIGURE_AUDIT`` set: ``gptkit.notebook`` then measures each figure as it is shown.
"""

from __future__ import annotations

import math

MIN_POINTS = 8.0
OVERLAP_PIXELS = 1.0  # rotated boxes may touch by this much: a label's box holds its line's full height


def _name(ax) -> str:
    title = ax.get_title() or ax.get_title(loc="left") or ax.get_ylabel() or ax.get_xlabel()
    return f"the axes {title!r}" if title else "an untitled axes"


def _texts(fig):
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible()):
            yield t


def _small_text(fig) -> list[str]:
    small = {}
    for t in _texts(fig):
        if t.get_fontsize() < MIN_POINTS - 1e-6:
            small.setdefault(round(t.get_fontsize(), 1), []).append(t.get_text().strip()[:20])
    return [f"{len(texts)} text(s) at {size} pt, under {MIN_POINTS:g} pt (e.g. {texts[0]!r})"
            for size, texts in sorted(small.items())]


def _heatmaps_without_colour_bar(fig) -> list[str]:
    from matplotlib.collections import QuadMesh
    from matplotlib.image import AxesImage

    def scale(m):
        return m.get_cmap().name, tuple(round(float(v), 6) for v in m.get_clim())

    out, heatmaps, bars = [], [], set()
    for ax in fig.axes:
        if hasattr(ax, "_colorbar"):
            continue  # a colour bar's own axes
        maps = [im for im in ax.images if isinstance(im, AxesImage) and im.get_array() is not None
                and im.get_array().ndim == 2]
        maps += [m for m in ax.collections if isinstance(m, QuadMesh) and m.get_array() is not None]
        heatmaps += [(ax, m) for m in maps]
        bars |= {scale(m) for m in maps if getattr(m, "colorbar", None) is not None}
    for ax, m in heatmaps:  # one colour bar may serve every heatmap drawn on its scale (a grid of heads)
        if getattr(m, "colorbar", None) is None and scale(m) not in bars:
            out.append(f"{_name(ax)} draws a heatmap without a colour bar")
    return out


def _unrotated_size(t, renderer) -> tuple[float, float]:
    text, ismath = t._preprocess_math(t.get_text())
    w, h, _ = renderer.get_text_width_height_descent(text, t.get_fontproperties(), ismath=ismath)
    return w, h


def _overlapping_ticks(fig, renderer) -> list[str]:
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis, which in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            try:
                ticks = axis._update_ticks()  # the ticks drawn: those inside the view
            except AttributeError:  # pragma: no cover - an older matplotlib
                ticks = axis.get_major_ticks()
            for side in ("label1", "label2"):
                labels = [getattr(tk, side) for tk in ticks]
                labels = [t for t in labels if t.get_visible() and t.get_text().strip()]
                boxes = []
                for t in labels:
                    bbox = t.get_window_extent(renderer)
                    w, h = _unrotated_size(t, renderer)
                    boxes.append(((bbox.x0 + bbox.x1) / 2, (bbox.y0 + bbox.y1) / 2, w, h,
                                  math.radians(t.get_rotation()), t.get_text()))
                clashes = []
                for i, a in enumerate(boxes):
                    for b in boxes[i + 1:]:
                        if a[4] != b[4]:
                            continue
                        ux, uy = math.cos(a[4]), math.sin(a[4])
                        dx, dy = b[0] - a[0], b[1] - a[1]
                        along, across = abs(dx * ux + dy * uy), abs(-dx * uy + dy * ux)
                        if along < (a[2] + b[2]) / 2 - OVERLAP_PIXELS and across < (a[3] + b[3]) / 2 - OVERLAP_PIXELS:
                            clashes.append((a[5], b[5]))
                if clashes:
                    out.append(f"{_name(ax)}: {len(clashes)} pair(s) of {which} tick labels overlap "
                               f"(e.g. {clashes[0][0]!r} and {clashes[0][1]!r})")
    return out


def legibility_problems(fig) -> list[str]:
    """What in ``fig`` is too small to read, lacks its colour bar, or overlaps (empty: none)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return _small_text(fig) + _heatmaps_without_colour_bar(fig) + _overlapping_ticks(fig, renderer)
