"""Data-parallel training steps on threads, for the kit's trainer (``gptkit.train``) and
the training benchmark: each batch is split by rows into one shard per worker, every
worker runs lab 07's ``loss_and_grads`` on its shard, and the shards' gradients are
averaged, weighted by their rows. The result is the whole batch's loss and gradients (the
loss is a mean over rows of equal length) up to float rounding. The step itself is lab
07's ``train_step``, with its ``loss_and_grads`` call routed to the shards.

Why threads: at the kit's training size (width 128, batch 12 × 64 tokens) about 60% of
a step is elementwise NumPy work and small stacked products, which NumPy runs on one core
whatever the BLAS thread count; PyTorch spreads the same work over its threads. NumPy
releases the GIL inside its loops and BLAS calls, so two shards on two threads use both
cores. While the shards run, BLAS is held to one thread (``threadpoolctl``), so N workers
use N cores, not N × BLAS threads. Measured on 2 cores (docs/performance.md has the numbers): a
step of 62–66 ms with 2 BLAS threads, 49 ms as 2 shards.

Student code runs here unchanged, but two shards share one model at the same time: code
that keeps per-call state on the model would mix the shards. ``agrees`` checks one batch
against a plain call before the trainer relies on it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController


def blas_threads() -> int:
    """The thread count NumPy's BLAS is set to (1 where none reports one)."""
    return max((lib.num_threads for lib in ThreadpoolController().select(user_api="blas").lib_controllers),
               default=1)


class DataParallel:
    """``loss_and_grads`` and ``train_step`` of lab 07 (module ``tr``) over ``workers``
    threads, one shard of the batch's rows each (fewer shards when the batch has fewer
    rows). With dropout, shard i draws its masks from ``rng.spawn(...)[i]``: the masks
    depend on the worker count, and repeat for the same seed and count."""

    def __init__(self, tr, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.tr, self.workers = tr, int(workers)
        self._plain = tr.loss_and_grads
        self.sharding, self.calls = True, 0
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="gptkit-shard")
        self._blas = ThreadpoolController()

    def close(self) -> None:
        self._pool.shutdown()

    def __enter__(self) -> "DataParallel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def loss_and_grads(self, model, x: np.ndarray, y: np.ndarray, rng: np.random.Generator | None = None):
        """Lab 07's ``(loss, grads)`` for the whole batch (B, T), computed shard by shard."""
        self.calls += 1
        x, y = np.asarray(x), np.asarray(y)
        if len(x) < 2:  # nothing to split
            return self._plain(model, x, y, rng=rng)
        bounds = np.linspace(0, len(x), min(self.workers, len(x)) + 1).round().astype(int)
        shards = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        rngs = rng.spawn(len(shards)) if rng is not None else [None] * len(shards)
        with self._blas.limit(limits=1, user_api="blas"):
            futures = [self._pool.submit(self._plain, model, x[s], y[s], rng=r)
                       for s, r in zip(shards, rngs)]
            results = [f.result() for f in futures]
        # Python floats: a NumPy float64 weight would turn every float32 gradient into float64.
        weights = [int(s.stop - s.start) / len(x) for s in shards]
        loss = sum(w * float(r[0]) for w, r in zip(weights, results))
        grads = {}
        for name, g in results[0][1].items():
            total = g * weights[0]
            for w, (_, other) in zip(weights[1:], results[1:]):
                total += w * other[name]
            grads[name] = total
        return loss, grads

    def train_step(self, model, optimizer, x: np.ndarray, y: np.ndarray, **kwargs):
        """Lab 07's own ``train_step(model, optimizer, x, y, **kwargs)``, with the module's
        ``loss_and_grads`` replaced by the sharded one for the duration of the call.

        BLAS stays at one thread for the whole step, clipping and update included: a BLAS
        call on more threads (the clipping's dot products) wakes OpenBLAS's workers, which
        then spin for a while and take the cores from the next step's shards (measured: 85
        ms a step against 49 when only the shards ran on one BLAS thread). A ``train_step``
        that never calls ``loss_and_grads`` gains nothing from shards: after such a step,
        ``sharding`` turns False and later steps call it plainly, with BLAS as it was."""
        if not self.sharding:
            return self.tr.train_step(model, optimizer, x, y, **kwargs)
        calls = self.calls
        with self._blas.limit(limits=1, user_api="blas"):
            self.tr.loss_and_grads = self.loss_and_grads
            try:
                result = self.tr.train_step(model, optimizer, x, y, **kwargs)
            finally:
                self.tr.loss_and_grads = self._plain
        self.sharding = self.calls > calls
        return result

    def agrees(self, model, x: np.ndarray, y: np.ndarray, rtol: float = 1e-3) -> str | None:
        """None when the sharded gradients of one batch (without dropout) match a plain
        ``loss_and_grads`` call; otherwise what differs, in a sentence."""
        _, plain = self._plain(model, x, y)
        _, sharded = self.loss_and_grads(model, x, y)
        if set(plain) != set(sharded):
            return "the shards returned gradients under other names than a plain call"
        for name, g in plain.items():
            err = float(np.max(np.abs(sharded[name] - g), initial=0.0))
            scale = float(np.max(np.abs(g), initial=0.0))
            if not np.isfinite(err) or err > rtol * scale + 1e-7:
                return f"{name} differs by up to {err:.3g} (its largest entry is {scale:.3g})"
        return None
