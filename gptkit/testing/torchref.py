"""PyTorch as a live reference: on CUDA when there is one, on the CPU otherwise.

Tests call ``torch_or_skip()``; without the torch extra they skip with one line that
says how to get it.
"""

from __future__ import annotations

import numpy as np
import pytest

SKIP_REASON = "torch is not installed: live PyTorch checks need `uv sync --extra torch`"


def torch_or_skip():
    """The torch module, configured for exact float32 comparison, or a skip."""
    try:
        import torch
    except ImportError:
        pytest.skip(SKIP_REASON)
    # TF32 matmuls would lose ~3 digits on Ampere+ GPUs; references must be float32-exact.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def device():
    torch = torch_or_skip()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def to_torch(x: np.ndarray):
    torch = torch_or_skip()
    return torch.from_numpy(np.ascontiguousarray(x)).to(device())


def to_numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy()
