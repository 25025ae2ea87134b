"""Shared set-up for the model benchmarks: one thread count for NumPy's BLAS and for
PyTorch, the machine's description, and a GPT-2-small-shaped random checkpoint loaded
into both the reference NumPy model and HuggingFace's GPT2LMHeadModel.

Import this module before NumPy: it sets the BLAS thread count from ``--threads``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def set_threads(argv: list[str]) -> int:
    """The thread count (``--threads N``, default: every core), set for BLAS before NumPy loads."""
    n = os.cpu_count() or 1
    if "--threads" in argv:
        n = int(argv[argv.index("--threads") + 1])
    if "numpy" in sys.modules:
        raise RuntimeError("benchmarks.common.set_threads must run before numpy is imported")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    return n


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical cores, Python {platform.python_version()}"


def use_reference_solutions() -> None:
    """Make the reference labs importable by module name (``import gpt``)."""
    sys.path.insert(0, str(ROOT))
    from gptkit.testing.layout import bind_tree

    bind_tree(ROOT / "solutions")


def gpt2_small_pair(threads: int, seed: int = 0):
    """(NumPy GPTModel, HuggingFace GPT2LMHeadModel, parameter count) with the same random
    GPT-2-small-shaped weights; PyTorch limited to ``threads`` threads."""
    import numpy as np
    import torch

    use_reference_solutions()
    import gpt
    from gptkit.checkpoints import GPT2_SMALL, hf_model, random_gpt2_state

    torch.set_num_threads(threads)
    state = random_gpt2_state(GPT2_SMALL, np.random.default_rng(seed))
    ours = gpt.GPTModel(**GPT2_SMALL.model_kwargs(), rng=np.random.default_rng(seed)).load_state_dict(state).eval()
    theirs = hf_model(state, GPT2_SMALL)
    return ours, theirs, sum(v.size for v in state.values())


def best_of(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
