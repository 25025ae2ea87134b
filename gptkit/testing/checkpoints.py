"""Checkpoints in tests: a stored fixture's checkpoint written back to disk as HuggingFace
wrote it, and a real model's folder, which the tests use when it is on this machine and
skip without (nothing is downloaded).

Labs 05 (GPT-2) and 08 (Llama) store their checkpoint fixtures alike: the bytes of
``model.safetensors`` and ``config.json`` under ``model_safetensors`` / ``config_json``,
and the parameters that the loader must return under ``param.<name>`` (``fixture_params``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from gptkit.testing.fixtures import load_fixture


def checkpoint_on_disk(tmp_path: Path, lab: str, case: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The fixture ``case`` of ``lab`` as a checkpoint folder (``tmp_path/case`` holding
    ``model.safetensors`` and ``config.json``), and the fixture."""
    f = load_fixture(lab, case)
    folder = tmp_path / case
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(f["model_safetensors"].tobytes())
    (folder / "config.json").write_bytes(f["config_json"].tobytes())
    return folder, f


def real_checkpoint(find: Callable[[], Path | None], how_to_get: str) -> Path:
    """The folder of a real checkpoint on this machine (``find()``); without one the test
    skips with ``how_to_get``. Loading it is left to the caller, so that the lab's code is
    imported only when there is something to load."""
    folder = find()
    if folder is None:
        pytest.skip(how_to_get)
    return folder
