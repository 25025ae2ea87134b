"""What the notebooks beside the labs (``labs/NN_name/explore.ipynb``) share.

Each notebook's first cell says whose code it looks at, ``IMPL = "labs"`` (your
``labs/*/src``) or ``"solutions"`` (the reference, in the full kit), and calls
``use(IMPL)``; the environment variable ``GPTKIT_IMPL`` (``IMPL_VARIABLE``), when set,
chooses instead, so ``GPTKIT_IMPL=solutions uv run --extra notebooks jupyter lab`` shows
every notebook on the reference without editing one. A copy without ``solutions/`` (the
student's) refuses that with one line. Then the tests' own binding (``gptkit.testing.layout.bind_tree`` and
``loader.lab``) then imports your modules by name. Every cell that runs lab code does so
inside ``with task():``, so a function that is still a stub prints one line, the stub's
own message and where it is::

    ▶ finish this first: Lab 01 · softmax: subtract the max along the axis, exponentiate, normalise
      (labs/01_causal_mask/src/causal_mask.py:56; its tests: uv run pytest -m lab01)

and the notebook goes on with the next cell; a later cell that needs what the skipped one
would have made says so in one line too. An error raised inside your code prints its type,
message and your line, also in one line; any other error is the notebook's and keeps its
traceback.

``use`` also reloads edited lab files before each cell (IPython's autoreload) and runs
NumPy's matrix products on one thread (the notebooks' models are small). Besides:
``TrainedModel``, the small GPT the kit trained on its Shakespeare
(``gptkit/data/shakespeare_bpe``, made by ``python -m gptkit.shakespeare_model``), read with
NumPy alone; and a few plotting helpers. Nothing here contains lab answers: the notebooks
call your code for everything a lab builds.
"""

from __future__ import annotations

import html
import json
import os
import traceback
from pathlib import Path

import numpy as np

from gptkit.checkpoints import read_safetensors
from gptkit.testing.layout import KIT_ROOT, bind_tree, resolve_impl

TRAINED = Path(__file__).resolve().parent / "data" / "shakespeare_bpe"
_state = {"root": None, "unfinished": []}
IMPL_VARIABLE = "GPTKIT_IMPL"  # set to "solutions" (or a path): every notebook looks at that code


# -- whose code --------------------------------------------------------------------------------

def use(impl: str = "labs"):
    """Bind the implementation tree ``impl`` (``labs``, ``solutions`` or a path) and return
    ``lab``, the tests' binding: ``lab("gpt")`` is that tree's ``gpt`` module. ``$GPTKIT_IMPL``,
    when set, is used instead of ``impl``."""
    from gptkit.testing import loader

    chosen = os.environ.get(IMPL_VARIABLE, "").strip()
    source = f"{IMPL_VARIABLE}={chosen}" if chosen else f"IMPL = {impl!r}"
    impl = chosen or impl
    root = resolve_impl(impl)
    if not root.is_dir():
        raise FileNotFoundError(f"{source}: there is no {root.name}/ in this copy of the kit"
                                + (" (the reference solutions come with the full kit only)" if impl == "solutions" else ""))
    bind_tree(root)
    loader.set_root(root)
    _state["root"], _state["unfinished"] = root, []
    _autoreload()
    _inline_figures()
    _audit_figures()
    _one_blas_thread()
    try:
        shown = root.relative_to(KIT_ROOT)
    except ValueError:
        shown = root
    print(f"code under study: {shown}/ ({'the reference solutions' if root.name == 'solutions' else 'your code'})")
    return loader.lab


def _autoreload() -> None:
    """In IPython, reload edited lab files before each cell (edit, save, rerun the cell)."""
    try:
        shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821
    except NameError:
        return
    try:
        shell.run_line_magic("load_ext", "autoreload")
        shell.run_line_magic("autoreload", "2")
    except Exception:  # noqa: BLE001 - reloading is a convenience only
        pass


def _inline_figures() -> None:
    """In a notebook, figures are drawn into the page, whatever MPLBACKEND says (a backend
    such as Agg set for scripts would draw nothing there)."""
    try:
        shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821
    except NameError:
        return
    try:
        shell.run_line_magic("matplotlib", "inline")
    except Exception:  # noqa: BLE001 - without matplotlib there is nothing to draw
        pass


AUDIT_VARIABLE = "GPTKIT_FIGURE_AUDIT"  # a file: each figure shown is measured, one JSON line per figure


def _audit_figures() -> None:
    """With ``$GPTKIT_FIGURE_AUDIT`` set (the notebooks' tests set it), ``plt.show()``
    first measures each open figure (``gptkit.testing.figures``) and appends what it finds
    to that file. Without it, nothing changes."""
    target = os.environ.get(AUDIT_VARIABLE)
    if not target:
        return
    import matplotlib.pyplot as plt

    from gptkit.testing.figures import legibility_problems

    show = getattr(plt.show, "_unaudited", plt.show)

    def audited_show(*args, **kwargs):
        with open(target, "a", encoding="utf-8") as out:
            for number in plt.get_fignums():
                fig = plt.figure(number)
                titles = [t for t in [fig._suptitle.get_text() if fig._suptitle else ""]
                          + [ax.get_title() for ax in fig.axes] if t]
                out.write(json.dumps({"figure": titles[0] if titles else "", "problems": legibility_problems(fig)})
                          + "\n")
        return show(*args, **kwargs)

    audited_show._unaudited = show
    plt.show = audited_show


def _one_blas_thread() -> None:
    """The notebooks' models are small: their matrix products run faster on one BLAS thread
    than split over several, much faster when other work shares the cores (a training step
    of lab 07's notebook: 0.40 s on two threads, 0.046 s on one, measured on a busy 2-core
    machine)."""
    from threadpoolctl import threadpool_limits

    global _blas_limit
    _blas_limit = threadpool_limits(1, user_api="blas")


_blas_limit = None


def _lab_frame(tb) -> tuple[str, int] | None:
    """(the file as the student knows it, the line) of the innermost frame in the bound
    tree's code, or None."""
    root = _state["root"]
    found = None
    for frame in traceback.extract_tb(tb):
        path = Path(frame.filename)
        if root is not None and root in path.parents:
            try:
                found = (str(path.relative_to(KIT_ROOT)), frame.lineno)
            except ValueError:
                found = (str(path), frame.lineno)
    return found


class task:
    """``with task(): …`` runs lab code; a stub, an import problem or an error in lab code
    ends the block with one printed line instead of a traceback. ``task.done`` is False
    after such an ending."""

    def __init__(self):
        self.done = True

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None:
            return False
        line = self._explain(exc, tb)
        if line is None:
            return False  # the notebook's own error: keep the traceback
        self.done = False
        try:
            import matplotlib.pyplot as plt

            plt.close("all")  # no half-drawn figure
        except ImportError:
            pass
        print(line)
        return True

    @staticmethod
    def _explain(exc, tb) -> str | None:
        unfinished = _state["unfinished"]
        where = _lab_frame(tb)
        if isinstance(exc, NotImplementedError):
            message = str(exc)
            number = message[4:6] if message.startswith("Lab ") and message[4:6].isdigit() else None
            unfinished.append(message)
            place = f"{where[0]}:{where[1]}" if where else "your code"
            tests = f"; its tests: uv run pytest -m lab{number}" if number else ""
            return f"▶ finish this first: {message}  ({place}{tests})"
        try:
            import pytest

            failed = pytest.fail.Exception
        except ImportError:  # pragma: no cover - pytest is a dependency of the kit
            failed = ()
        if failed and isinstance(exc, failed):  # the binding could not import a lab module
            unfinished.append(str(exc))
            return f"▶ {exc}"
        if isinstance(exc, NameError) and unfinished:
            return (f"▶ skipped: this cell needs `{getattr(exc, 'name', None) or exc}` from a cell above that did not "
                    f"finish (first: {unfinished[0]})")
        if where is not None:
            unfinished.append(f"{type(exc).__name__} in {where[0]}")
            text = str(exc).splitlines()[0] if str(exc) else ""
            return f"▶ your code raised {type(exc).__name__}: {text}  ({where[0]}:{where[1]})"
        return None


# -- the trained model -------------------------------------------------------------------------

class TrainedModel:
    """The kit's small Shakespeare GPT (``gptkit/data/shakespeare_bpe``) as data: its
    ``config`` (``GPTModel``'s keyword arguments), ``state`` (parameters by GPT-2's names),
    BPE ``vocab`` (id → bytes) and ``merges``, ``lines`` (text → ids), ``history``."""

    def __init__(self, folder: Path = TRAINED):
        self.folder = Path(folder)
        if not (self.folder / "model.safetensors").is_file():
            raise FileNotFoundError(f"no trained model in {self.folder}: make it with "
                                    "`uv run python -m gptkit.shakespeare_model`")
        hf = json.loads((self.folder / "config.json").read_text())
        self.config = {"vocab_size": hf["vocab_size"], "d_model": hf["n_embd"], "num_layers": hf["n_layer"],
                       "num_heads": hf["n_head"], "d_ff": hf.get("n_inner") or 4 * hf["n_embd"],
                       "max_seq_len": hf["n_positions"], "layer_norm_eps": hf.get("layer_norm_epsilon", 1e-5)}
        self.state = read_safetensors(self.folder / "model.safetensors")[0]
        tok = json.loads((self.folder / "tokenizer.json").read_text())
        self.vocab = {int(i): bytes.fromhex(h) for i, h in tok["vocab"].items()}
        self.merges = [(bytes.fromhex(a), bytes.fromhex(b)) for a, b in tok["merges"]]
        self.lines = {row["text"]: row["ids"] for row in json.loads((self.folder / "lines.json").read_text())}
        self.history = json.loads((self.folder / "history.json").read_text())

    def build(self, gpt):
        """The model in *your* lab 04 ``gpt.GPTModel``, the trained weights loaded, eval mode."""
        model = gpt.GPTModel(**self.config, rng=np.random.default_rng(0))
        model.load_state_dict(self.state)
        model.eval()
        return model

    def token(self, i: int) -> str:
        """Token ``i`` as readable text: its bytes as UTF-8 (a broken character as �), a
        space shown as ␣ and a newline as ⏎."""
        text = self.vocab[int(i)].decode("utf-8", errors="replace")
        return text.replace(" ", "␣").replace("\n", "⏎")

    def tokens(self, ids) -> list[str]:
        return [self.token(i) for i in ids]

    def text(self, ids) -> str:
        """The text of ``ids`` (the tokens' bytes one after another, as UTF-8)."""
        return b"".join(self.vocab[int(i)] for i in ids).decode("utf-8", errors="replace")

    def ids(self, text: str, tokenizer=None) -> np.ndarray:
        """(1, T) ids of ``text``: stored for the lines in ``lines.json``; others through
        ``tokenizer`` (your lab 10 ``Tokenizer(model.vocab, model.merges)``)."""
        if text in self.lines:
            ids = self.lines[text]
        elif tokenizer is not None:
            ids = tokenizer.encode(text)
        else:
            raise KeyError(f"{text!r} is not among the stored lines ({', '.join(map(repr, self.lines))}); "
                           "other text needs your lab 10 tokenizer")
        return np.array([ids], dtype=np.int64)


# -- pictures ----------------------------------------------------------------------------------

def heatmap(ax, data, *, xlabels=None, ylabels=None, title=None, cmap="viridis", vmin=None, vmax=None,
            colorbar=True, fontsize=8):
    """``data`` (rows × columns) as an image on ``ax`` with optional tick labels."""
    data = np.asarray(data, dtype=float)
    im = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), xlabels, rotation=90, fontsize=fontsize)
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), ylabels, fontsize=fontsize)
    if title:
        ax.set_title(title, fontsize=fontsize + 2)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return im


PALETTE = ["#fde68a", "#bfdbfe", "#bbf7d0", "#fecaca", "#ddd6fe", "#fed7aa"]


def token_html(pieces: list[str], title: str = "") -> str:
    """The text of ``pieces`` (one string per token) with each token on its own colour, so
    that the boundaries show; a newline token shows ⏎ and breaks the line."""
    spans = []
    for n, piece in enumerate(pieces):
        shown = html.escape(piece).replace("\n", "⏎<br>")
        spans.append(f'<span style="background:{PALETTE[n % len(PALETTE)]};padding:1px 0;'
                     f'white-space:pre-wrap;border-right:1px solid #999" title="token {n}">{shown}</span>')
    head = f"<div style='font:12px sans-serif;color:#555'>{html.escape(title)} · {len(pieces)} tokens</div>" \
        if title else ""
    return f"<div class='token-view' style='font:14px monospace;line-height:1.9;margin:4px 0'>{head}{''.join(spans)}</div>"
