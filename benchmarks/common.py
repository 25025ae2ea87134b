"""Shared set-up for the model benchmarks: one thread count for NumPy's BLAS and for
PyTorch, the machine's description, and a GPT-2-small-shaped random checkpoint loaded
into both the reference NumPy model and HuggingFace's GPT2LMHeadModel. For the decoding
benchmarks (``bench_generation.py``, ``bench_llama.py``, ``bench_seq2seq.py``): their
command line, HuggingFace's greedy ``generate()``, the timing of each decoder, the table
of speeds, the memory-bandwidth bound and the targets.

Import this module before NumPy: it sets the BLAS thread count from ``--threads``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the kit's packages (gptkit), whatever the working directory


def set_threads(argv: list[str]) -> int:
    """The thread count (``--threads N``, default: every core), set for BLAS before NumPy
    loads. Every benchmark calls this first, so it also sets up the process's memory as
    the kit's commands do (``gptkit.command.keep_freed_memory``), for NumPy and PyTorch alike."""
    n = os.cpu_count() or 1
    if "--threads" in argv:
        n = int(argv[argv.index("--threads") + 1])
    if "numpy" in sys.modules:
        raise RuntimeError("benchmarks.common.set_threads must run before numpy is imported")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    from gptkit.command import keep_freed_memory  # imports NumPy: after the variables above

    keep_freed_memory()
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


# --- the decoding benchmarks ------------------------------------------------------------------

def decoding_args(doc: str, threads: int, *, seq2seq: bool = False, new_tokens: int = 128,
                  small: str | None = None) -> argparse.Namespace:
    """A decoding benchmark's command line: ``--threads``, the input's length (a decoder-only
    model generates after a ``--prompt``, an encoder–decoder decodes from a ``--source``),
    ``--new-tokens``, ``--repeats``, and ``--small`` (with its help) where ``small`` is given."""
    flag, what, verb, decoder = (("--source", "source length", "decode", "decoder") if seq2seq
                                 else ("--prompt", "prompt length", "generate", "generator"))
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=threads, help="BLAS and torch threads (default: all cores)")
    parser.add_argument(flag, type=int, default=32, help=f"{what} (default 32)")
    parser.add_argument("--new-tokens", type=int, default=new_tokens, help=f"tokens to {verb} (default {new_tokens})")
    parser.add_argument("--repeats", type=int, default=3, help=f"timed runs of each cached {decoder} (best counts)")
    if small is not None:
        parser.add_argument("--small", action="store_true", help=small)
    return parser.parse_args()


def print_machine(threads: int | None = None, extra: str = "") -> None:
    """The first line of a benchmark's report: the machine, the versions and, for a model
    benchmark (``threads`` given), the threads of NumPy's BLAS and of PyTorch; ``extra`` is
    appended. Then a blank line."""
    import numpy as np

    if threads is None:
        setting = f"numpy {np.__version__}"
    else:
        import torch

        setting = (f"{threads} thread(s) for NumPy's BLAS and for PyTorch "
                   f"(torch {torch.__version__}, threads {torch.get_num_threads()}; numpy {np.__version__})")
    print(f"machine: {machine()}; {setting}{extra}")
    print()


def print_table(header: list[str], rows: list[list]) -> None:
    """A markdown table (``python -m benchmarks`` copies every report into docs/performance.md),
    then a blank line."""
    print_row(header)
    print_row(["---"] * len(header))
    for row in rows:
        print_row(row)
    print()


def print_row(cells: list) -> None:
    """One markdown table row, printed at once (a long benchmark shows its progress)."""
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def threads(n: int) -> str:
    """``1 thread``, ``2 threads``: for a summary."""
    return f"{n} thread{'s' if n != 1 else ''}"


def print_summary(text: str) -> None:
    """The report's one-line summary (``python -m benchmarks`` also puts it in README.md)."""
    print(f"summary: {text}")


def hf_greedy(hf, prompt, n: int):
    """A function running HuggingFace's ``generate()`` with its cache: ``n`` tokens greedily
    after ``prompt`` (a (1, T) array), never stopping early; it returns the ids as NumPy."""
    import torch

    ids = torch.from_numpy(prompt)
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1, eos_token_id=None,
                  pad_token_id=0, max_new_tokens=n, min_new_tokens=n)

    def generate():
        with torch.inference_mode():
            return hf.generate(ids, **kwargs).numpy()

    return generate


PAUSE = 0.2  # seconds of idle before each timed call (see time_runs)


def time_runs(runs: dict) -> tuple[dict, dict]:
    """``{name: (fn, repeats)}`` → (``{name: fastest time}``, ``{name: what fn returned}``).

    Each fn runs once untimed, then the runs take turns (one call each per round, for as
    many rounds as its repeats), so that a change in the machine's load falls on all of
    them alike rather than on whichever ran at that moment. Each timed call starts after
    ``PAUSE`` seconds of idle: PyTorch's worker threads keep spinning for tens of
    milliseconds after its parallel work, and whatever ran next lost up to a quarter of
    its bandwidth to them (measured on 2 cores: the 512 MB mat-vec right after PyTorch
    products 25–28 GB/s, after 50 ms of idle 33–34)."""
    times, outputs = {}, {}
    for name, (fn, _) in runs.items():
        fn()
    for round_ in range(max(repeats for _, repeats in runs.values())):
        for name, (fn, repeats) in runs.items():
            if round_ < repeats:
                time.sleep(PAUSE)
                start = time.perf_counter()
                out = fn()
                times[name] = min(times.get(name, float("inf")), time.perf_counter() - start)
                if not name.startswith(PROBE):
                    outputs[name] = out
    return times, outputs


def print_speeds(times: dict, n: int, digits: int = 2) -> dict:
    """Each run's seconds and tokens/s (``n`` new tokens), as a markdown table; returns the
    tokens/s."""
    speed = {name: n / t for name, t in times.items()}
    print_table(["run", "seconds", "tokens/s"], [[name, f"{t:.{digits}f}", f"{speed[name]:.1f}"]
                                                 for name, t in times.items()])
    return speed


PROBE = "mat-vec "  # the names of the bandwidth runs in time_runs' results


def bandwidth_runs(repeats: int) -> dict:
    """Runs for ``time_runs`` that measure the memory bandwidth beside the decoders: W @ x
    and x @ W for a 512 MB float32 W (16384 × 8192), read once per product (OpenBLAS reads
    the two orientations with different kernels, and either may be the faster)."""
    import numpy as np

    rng = np.random.default_rng(0)
    W = rng.standard_normal((16384, 8192), dtype=np.float32)
    x_right = rng.standard_normal(8192, dtype=np.float32)
    x_left = rng.standard_normal(16384, dtype=np.float32)
    return {PROBE + "W @ x": (lambda: W @ x_right, max(3, repeats)),
            PROBE + "x @ W": (lambda: x_left @ W, max(3, repeats))}


def matvecs_run(matrices: list, n: int, repeats: int, *, rows: int = 1, prefill: int = 0,
                name: str = "products alone") -> dict:
    """A run for ``time_runs`` (named ``PROBE + name``): the decoder's own products and
    nothing else, ``n`` tokens' worth: ``x @ M`` for every matrix M in the order a token
    meets them (x ``rows`` rows of ones: one per stream decoded together), back to back,
    without the biases, norms, attention and sampling between them; first, with
    ``prefill`` > 0, one product per matrix of that many rows (a prompt pass). Its tokens/s
    is the most a decoder can reach with these products as BLAS runs them; its ratio to the
    bound separates the products' own speed from the rest of a step."""
    import numpy as np

    xs = [np.ones((rows, m.shape[0]), np.float32) for m in matrices]
    pre = [np.ones((prefill, m.shape[0]), np.float32) for m in matrices] if prefill else []

    def products():
        for x, m in zip(pre, matrices):
            x @ m
        for _ in range(n):
            for x, m in zip(xs, matrices):
                x @ m

    return {PROBE + name: (products, repeats)}


STRIPPED = "NumPy, stripped step"  # the name of the stripped decoder's run (benchmarks/stripped.py)


def print_speeds_and_bound(times: dict, n: int, read_per_token: int, what: str) -> tuple[dict, float]:
    """The table of speeds (``print_speeds``), then the bound on tokens/s when a token reads
    ``read_per_token`` bytes (``what`` they are), from the memory bandwidth: the faster of
    the two mat-vec orientations (the ``bandwidth_runs`` timed among ``times``), since
    either one reaching it shows the memory can deliver it. Returns (tokens/s, bound)."""
    probe_bytes = 16384 * 8192 * 4
    rates = {k: probe_bytes / times.pop(PROBE + k) / 1e9 for k in ("W @ x", "x @ W")}
    gb_s = max(rates.values())
    speed = print_speeds(times, n)
    bound = gb_s * 1e9 / read_per_token
    print(f"- weights read per token: {read_per_token / 1e6:.0f} MB ({what}, float32)")
    print("- mat-vec bandwidth, 512 MB float32, timed in turn with the runs above: "
          + ", ".join(f"{k} {v:.1f} GB/s" for k, v in rates.items()))
    print(f"- bound: {gb_s:.1f} GB/s (the faster) ÷ {read_per_token / 1e6:.0f} MB = {bound:.1f} tokens/s")
    alone = speed.get(PROBE + "products alone")
    if alone:
        print(f"- the decoder's products alone (no other work between them): {100 * alone / bound:.0f}% of the bound")
    if STRIPPED in speed:
        print(f"- the stripped step (the same products, every other operation at its fewest NumPy calls, "
              f"no checks): {100 * speed[STRIPPED] / bound:.0f}% of the bound")
    return speed, bound


def print_target(name: str, value: float, target: float, percent: bool = False) -> None:
    """One target line (a list item): the value (× or %), the target and whether it is met."""
    shown, goal = (f"{100 * value:.0f}%", f"{100 * target:.0f}%") if percent else (f"{value:.2f}×", f"{target:g}×")
    print(f"- {name}: {shown} (target ≥ {goal}: {'met' if value >= target else 'NOT met'})")


def all_same(outputs) -> str:
    """``yes`` when every array of ``outputs`` equals the first (shape and values), else ``NO``."""
    import numpy as np

    first, *rest = outputs
    return "yes" if all(np.array_equal(o, first) for o in rest) else "NO"


# --- scaling with cores -----------------------------------------------------------------------------

def thread_counts(threads: int) -> list[int]:
    """The thread counts of a scaling table: 1, 2 and ``threads`` (every core by default),
    each once, none above ``threads``. The environment variable ``BENCH_COUNTS`` (e.g.
    ``2,16``) replaces them, for a run that has no time for the one-thread rows."""
    chosen = os.environ.get("BENCH_COUNTS")
    if chosen:
        return sorted({min(int(c), threads) for c in chosen.split(",")})
    return sorted({1, min(2, threads), threads})


class at_threads:
    """Inside the block, NumPy's BLAS and PyTorch both use ``n`` threads (threadpoolctl and
    ``torch.set_num_threads``); after it, what they used before. BLAS never goes above the
    count the benchmark started with (``set_threads``)."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        import torch
        from threadpoolctl import threadpool_limits

        self._torch = torch.get_num_threads()
        torch.set_num_threads(self.n)
        self._limit = threadpool_limits(self.n, user_api="blas")
        return self

    def __exit__(self, *exc):
        import torch

        self._limit.restore_original_limits()
        torch.set_num_threads(self._torch)


def print_scaling(header: list[str], rows: list[list]) -> None:
    """A scaling table: one row per thread count, its first cell that count, the same count
    for NumPy and for PyTorch."""
    print_table(["threads (NumPy's BLAS and PyTorch)", *header], rows)
