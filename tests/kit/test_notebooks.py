"""The notebook beside each lab (labs/NN_name/explore.ipynb): stored without outputs; run
top to bottom on the reference, every figure drawn, not blank and legible (no text under
8 pt, a colour bar for every heatmap, no overlapping tick labels: gptkit/testing/figures.py); run on the stubs, one
"finish this first" line where a task is missing and no traceback; one notebook rendered to
HTML and screenshot in headless Chromium; lab 04's notebook in a released copy draws the
trained model's attention maps from the student's own gpt.py."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gptkit.testing.layout import KIT_ROOT, lab_dirs

LABS = [lab.name for lab in lab_dirs(KIT_ROOT / "labs")]
NEEDS_EXTRA = "the notebooks extra is not installed (`uv sync --extra notebooks`; CI installs it): notebooks not run"
MARK = "▶"  # how gptkit.notebook.task starts the one line it prints for an unfinished task or a skipped cell
TIMES: dict[str, float] = {}
AUDITS: dict[str, list[dict]] = {}  # "<lab> on <impl>" → what each figure shown measured


def notebook_path(lab: str, root: Path = KIT_ROOT) -> Path:
    return root / "labs" / lab / "explore.ipynb"


def test_every_lab_has_a_notebook_stored_without_outputs():
    for lab in LABS:
        path = notebook_path(lab)
        assert path.is_file(), f"{lab} has no explore.ipynb beside its README"
        nb = json.loads(path.read_text(encoding="utf-8"))
        for n, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            assert not cell.get("outputs"), f"{path.relative_to(KIT_ROOT)} cell {n} holds outputs: store it cleared"
            assert cell.get("execution_count") is None, \
                f"{path.relative_to(KIT_ROOT)} cell {n} holds an execution count: store it cleared"
        params = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(params) == 1 and "".join(params[0]["source"]).startswith('IMPL = "labs"'), \
            f"{lab}: the first code cell, tagged parameters, sets IMPL = \"labs\""


def execute(path: Path, impl: str, *, env: dict | None = None, extra_cell: str | None = None):
    """The notebook at ``path`` run top to bottom with IMPL = ``impl``; its cells."""
    nbformat = pytest.importorskip("nbformat", reason=NEEDS_EXTRA)
    nbclient = pytest.importorskip("nbclient", reason=NEEDS_EXTRA)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.metadata.get("tags", []):
            cell.source = f"IMPL = {impl!r}"
    if extra_cell:
        nb.cells.append(nbformat.v4.new_code_cell(extra_cell))
    client = nbclient.NotebookClient(nb, timeout=600, startup_timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    import tempfile

    from gptkit.notebook import AUDIT_VARIABLE, IMPL_VARIABLE

    base = {k: v for k, v in os.environ.items() if k != IMPL_VARIABLE}  # the IMPL cell decides, unless env says
    with tempfile.TemporaryDirectory() as scratch:
        audit = Path(scratch) / "figures.jsonl"
        client.execute(env={**base, AUDIT_VARIABLE: str(audit), **(env or {})})
        AUDITS[f"{path.parent.name} on {impl}"] = [json.loads(line) for line in audit.read_text().splitlines()] \
            if audit.is_file() else []
    TIMES[f"{path.parent.name} on {impl}"] = time.perf_counter() - start
    return nb


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def errors_of(nb) -> list[str]:
    return [f"{o['ename']}: {o['evalue']}" for c in nb.cells for o in c.get("outputs", [])
            if o.get("output_type") == "error"]


def images_of(cell) -> list[np.ndarray]:
    import matplotlib.pyplot as plt

    return [plt.imread(io.BytesIO(base64.b64decode(o["data"]["image/png"])), format="png")
            for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]


def not_blank(image: np.ndarray) -> bool:
    """More than a few colours and some spread: a drawn figure, not an empty canvas."""
    rgb = np.round(image[..., :3] * 255).astype(np.int32)
    colours = np.unique(rgb.reshape(-1, 3) @ np.array([1 << 16, 1 << 8, 1]))
    return colours.size > 16 and float(rgb.std()) > 5.0


_executed: dict[str, object] = {}


def reference_run(lab: str):
    if lab not in _executed:
        if not (KIT_ROOT / "solutions").is_dir():
            pytest.skip("no solutions/ here (a student copy): the notebooks are checked in the full kit")
        _executed[lab] = execute(notebook_path(lab), "solutions")
    return _executed[lab]


def _use_in(root: Path, impl_variable: str | None) -> subprocess.CompletedProcess:
    """``use("labs")``, as a notebook's first cells call it, in a fresh interpreter at ``root``."""
    from gptkit.notebook import IMPL_VARIABLE

    env = {k: v for k, v in os.environ.items() if k != IMPL_VARIABLE}
    if impl_variable is not None:
        env[IMPL_VARIABLE] = impl_variable
    return subprocess.run([sys.executable, "-c", "from gptkit.notebook import use; use('labs')"], cwd=root,
                          env={**env, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=120)


def test_the_environment_variable_shows_the_reference_without_editing_a_notebook():
    """README.md names GPTKIT_IMPL: set to solutions, every notebook's `use(IMPL)` binds the
    reference although its first cell says "labs"; unset, the student's code."""
    if not (KIT_ROOT / "solutions").is_dir():
        pytest.skip("no solutions/ here (a student copy)")
    from gptkit.notebook import IMPL_VARIABLE

    assert f"`{IMPL_VARIABLE}=solutions`" in (KIT_ROOT / "README.md").read_text()
    chosen = _use_in(KIT_ROOT, "solutions")
    assert chosen.returncode == 0 and "code under study: solutions/ (the reference solutions)" in chosen.stdout, \
        chosen.stdout + chosen.stderr
    default = _use_in(KIT_ROOT, None)
    assert default.returncode == 0 and "code under study: labs/ (your code)" in default.stdout, \
        default.stdout + default.stderr


@pytest.mark.parametrize("lab", LABS)
def test_notebook_runs_on_the_reference_and_draws_every_figure(lab):
    nb = reference_run(lab)
    assert not errors_of(nb), f"{lab}: {errors_of(nb)}"
    for n, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        out = text_of(cell)
        assert MARK not in out, f"{lab} cell {n}, on the reference code: {out.strip()[:500]}"
        tags = cell.metadata.get("tags", [])
        if "figure" in tags:
            images = images_of(cell)
            assert images, f"{lab} cell {n} should draw a figure and drew none: {out.strip()[:500]}"
            assert all(not_blank(im) for im in images), f"{lab} cell {n} drew a blank figure"
        if "html" in tags:
            pages = [o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]
            assert pages and all(p.count("<span") >= 5 for p in pages), f"{lab} cell {n} should show coloured tokens"
    audits = AUDITS.get(f"{lab} on solutions", [])
    assert len(audits) >= sum("figure" in c.metadata.get("tags", []) for c in nb.cells), \
        f"{lab}: fewer figures measured ({len(audits)}) than figure cells: does each call plt.show()?"
    unreadable = [f"{a['figure'] or 'a figure'}: {p}" for a in audits for p in a["problems"]]
    assert not unreadable, f"{lab}'s figures are hard to read:\n" + "\n".join(unreadable)
    print(f"{lab}: {TIMES.get(f'{lab} on solutions', 0):.1f} s on the reference")


@pytest.mark.parametrize("lab", LABS)
def test_notebook_on_the_stubs_says_what_to_finish_and_goes_on(lab):
    nb = execute(notebook_path(lab), "labs")
    assert not errors_of(nb), f"{lab} on the stubs: {errors_of(nb)}"
    lines = [line for c in nb.cells if c.cell_type == "code" for line in text_of(c).splitlines() if MARK in line]
    finish = [line for line in lines if "finish this first: Lab " in line]
    assert finish, f"{lab} on the stubs printed no 'finish this first' line"
    assert all("uv run pytest -m lab" in line for line in finish), finish
    assert all("Traceback" not in text_of(c) for c in nb.cells if c.cell_type == "code")
    print(f"{lab}: {TIMES.get(f'{lab} on labs', 0):.1f} s on the stubs; first line: {finish[0]}")


def test_the_legibility_check_finds_small_text_bare_heatmaps_and_overlapping_ticks():
    """gptkit/testing/figures.py on figures made to fail and to pass, without a notebook."""
    pytest.importorskip("matplotlib", reason=NEEDS_EXTRA)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gptkit.testing.figures import legibility_problems

    words = [f"token number {i}" for i in range(12)]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 4))
    a.imshow(np.eye(12))
    a.set_title("bare", fontsize=6)
    b.plot(range(12))
    b.set_xticks(range(12), words)  # flat, long and crowded: they overlap
    c.set_xticks(range(12), words, rotation=90)  # the same words upright: they do not
    found = legibility_problems(fig)
    plt.close(fig)
    assert any("6.0 pt" in p for p in found) and any("'bare' draws a heatmap without a colour bar" in p
                                                    for p in found), found
    assert sum("tick labels overlap" in p for p in found) == 1, found
    fig, axes = plt.subplots(1, 2, figsize=(8, 4), layout="constrained")
    for ax in axes:
        im = ax.imshow(np.eye(4), vmin=0, vmax=1)
        ax.set_xticks(range(4), ["a", "b", "c", "d"])
    fig.colorbar(im, ax=axes)  # one bar for both: the same colour scale
    assert legibility_problems(fig) == []
    plt.close(fig)


def _render():
    """tests/grader/test_report_renders.py's headless-Chromium screenshot, loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        "report_renders", KIT_ROOT / "tests" / "grader" / "test_report_renders.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render


def test_a_notebook_renders_in_headless_chromium(tmp_path):
    render = _render()
    lab = "04_gpt_model"
    nb = reference_run(lab)
    nbconvert = pytest.importorskip("nbconvert", reason=NEEDS_EXTRA)
    body, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    page = tmp_path / "explore.html"
    page.write_text(body, encoding="utf-8")
    dom, pixels = render(page, tmp_path, window="1100,2400")
    assert "layer 0" in dom or "<img" in dom, dom[:2000]
    # The figures are colour: pixels whose channels differ by a lot (a page of text is grey).
    coloured = (pixels.max(axis=-1) - pixels.min(axis=-1)) > 60
    assert coloured.sum() > 20_000, f"the screenshot shows {int(coloured.sum())} coloured pixels: no figure rendered"


def test_released_copy_runs_lab_04_notebook_on_the_students_own_code(tmp_path):
    pytest.importorskip("nbclient", reason=NEEDS_EXTRA)
    if not (KIT_ROOT / "solutions").is_dir():
        pytest.skip("no solutions/ here (a student copy)")
    from grader.release import release

    out = tmp_path / "student-kit"
    release(out)
    for lab in LABS:
        assert notebook_path(lab, out).is_file(), f"the release lacks labs/{lab}/explore.ipynb"
    assert (out / "gptkit" / "data" / "shakespeare_bpe" / "model.safetensors").is_file()
    # A finished student: the reference modules in the released labs/*/src.
    for lab in lab_dirs(KIT_ROOT / "solutions"):
        for module in lab.modules():
            shutil.copy2(lab.code_dir / f"{module}.py", out / "labs" / lab.name / "src" / f"{module}.py")
    nb = execute(notebook_path("04_gpt_model", out), "labs", env={"PYTHONPATH": str(out)},
                 extra_cell="import gpt, gptkit\nprint('module:', gpt.__file__)\nprint('kit:', gptkit.__file__)")
    assert not errors_of(nb), errors_of(nb)
    last = text_of(nb.cells[-1])
    assert f"module: {out / 'labs' / '04_gpt_model' / 'src' / 'gpt.py'}" in last, last
    assert f"kit: {out / 'gptkit'}" in last, last
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "your code" in text_of(code[1])
    maps = [c for c in code if "previous-token head" in c.source and "figure" in c.metadata.get("tags", [])]
    assert maps, "lab 04's notebook has no tagged attention-map cell"
    images = images_of(maps[0])
    assert images and not_blank(images[0]), text_of(maps[0])[:500]
    assert "previous-token head" in text_of(maps[0])
    assert all(MARK not in text_of(c) for c in code), [text_of(c) for c in code if MARK in text_of(c)]


def test_jupyter_lab_serves_the_lab_notebooks(tmp_path):
    """README's `uv run --extra notebooks jupyter lab`, from the kit's root: the server
    starts, lists each lab's notebook and offers the Python kernel that runs them."""
    pytest.importorskip("jupyterlab", reason=NEEDS_EXTRA)
    import secrets
    import socket
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],  # CI runs as root
        cwd=KIT_ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "server.log").open("w"),
        env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")})

    def get(path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?token={token}", timeout=10) as r:
            return json.loads(r.read())

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                listing = get("/api/contents/labs/04_gpt_model")
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "jupyter lab did not answer in 120 s"
                time.sleep(1)
        assert "explore.ipynb" in {item["name"] for item in listing["content"]}
        notebook = get("/api/contents/labs/01_causal_mask/explore.ipynb")
        assert notebook["type"] == "notebook" and notebook["content"]["cells"]
        assert "python3" in get("/api/kernelspecs")["kernelspecs"]
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10).read().decode()
        assert "JupyterLab" in page
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def test_lab_05_notebook_uses_gpt2_when_present(tmp_path):
    """With a GPT-2 checkpoint at $GPT2_DIR (here a small random one with GPT-2's vocabulary),
    lab 05's notebook loads it instead of the Shakespeare model and still draws its figures."""
    if not (KIT_ROOT / "solutions").is_dir():
        pytest.skip("no solutions/ here (a student copy)")
    from gptkit.checkpoints import GPT2Shape, random_gpt2_state, write_checkpoint

    shape = GPT2Shape(vocab_size=50257, d_model=32, num_layers=2, num_heads=2, max_seq_len=32)
    folder = write_checkpoint(tmp_path / "gpt2", random_gpt2_state(shape, np.random.default_rng(0)), shape)
    nb = execute(notebook_path("05_gpt2_weights"), "solutions", env={"GPT2_DIR": str(folder)})
    assert not errors_of(nb), errors_of(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert any("real GPT-2 small from" in text_of(c) and "␣France" in text_of(c) for c in code)
    for cell in code:
        assert MARK not in text_of(cell), text_of(cell)
        if "figure" in cell.metadata.get("tags", []):
            assert images_of(cell) and all(not_blank(im) for im in images_of(cell)), text_of(cell)


def test_lab_09_notebook_draws_cross_attention_when_marian_is_present(tmp_path):
    """With a MarianMT checkpoint at $MARIAN_DIR (a small random one, no tokenizer files),
    lab 09's notebook translates token ids with the lab-09 model and draws the cross-attention."""
    if not (KIT_ROOT / "solutions").is_dir():
        pytest.skip("no solutions/ here (a student copy)")
    from gptkit.testing.seq2seq import Seq2SeqShape, hf_marian, random_seq2seq_state
    from gptkit.testing.torchref import torch_or_skip

    torch_or_skip()
    shape = Seq2SeqShape(vocab_size=60, d_model=32, num_layers=2, num_heads=4, d_ff=48, max_seq_len=32)
    hf_marian(random_seq2seq_state(shape, np.random.default_rng(0)), shape).save_pretrained(tmp_path / "marian")
    nb = execute(notebook_path("09_encoder_decoder"), "solutions", env={"MARIAN_DIR": str(tmp_path / "marian")})
    assert not errors_of(nb), errors_of(nb)
    cells = [c for c in nb.cells if "optional-figure" in c.metadata.get("tags", [])]
    assert cells and images_of(cells[0]) and not_blank(images_of(cells[0])[0]), text_of(cells[0])[-1000:]
    assert MARK not in text_of(cells[0]), text_of(cells[0])
