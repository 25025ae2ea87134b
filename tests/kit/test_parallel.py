"""``gptkit.parallel``: a batch split into shards on threads gives the whole batch's loss
and gradients, the workers run with one BLAS thread, and code that keeps per-call state
on the model is caught before the trainer relies on it. (The trainer on lab 07's
reference: ``test_train.py``.)"""

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from gptkit.parallel import DataParallel, blas_threads

D, V = 3, 7


def _loss_and_grads(model, x, y, rng=None):
    """A mean over every token of the batch, as lab 07's loss: 0.5·|W[x] − y (+ noise)|²."""
    r = model["W"][x] - y[..., None]
    if rng is not None:
        r = r + rng.standard_normal(r.shape)  # stands for dropout: a draw per call
    grad = np.zeros_like(model["W"])
    np.add.at(grad, x.reshape(-1), r.reshape(-1, D))
    return np.float64(0.5 * np.mean(np.sum(r * r, axis=-1))), {"W": grad / x.size}


def _clip(grads, max_norm):
    norm = float(np.sqrt(sum(np.vdot(g, g) for g in grads.values())))
    factor = min(1.0, max_norm / (norm + 1e-6))
    return {k: g * factor for k, g in grads.items()}, norm


def _train_step(model, optimizer, x, y, *, lr=None, max_norm=None, rng=None):
    loss, grads = TR.loss_and_grads(model, x, y, rng=rng)  # looked up at call time, as a module global
    grads, norm = _clip(grads, max_norm)
    optimizer.lr = lr
    optimizer.step(grads)
    return float(loss), norm


TR = SimpleNamespace(loss_and_grads=_loss_and_grads, clip_grad_norm=_clip, train_step=_train_step)


def _batch(rows, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (rows, 5)), rng.standard_normal((rows, 5)), {"W": rng.standard_normal((V, D))}


@pytest.mark.parametrize("rows", [1, 3, 5, 12])
@pytest.mark.parametrize("workers", [2, 3, 8])
def test_shards_give_the_whole_batchs_loss_and_gradients(rows, workers):
    x, y, model = _batch(rows)
    loss, grads = _loss_and_grads(model, x, y)
    with DataParallel(TR, workers) as par:
        sharded_loss, sharded = par.loss_and_grads(model, x, y)
    assert sharded_loss == pytest.approx(float(loss), rel=1e-12), "shards of unequal rows must be weighted by them"
    np.testing.assert_allclose(sharded["W"], grads["W"], rtol=1e-12, atol=1e-15)


def test_the_train_step_is_lab_07s_with_the_sharded_gradients():
    x, y, model = _batch(6)
    got = {}
    opt = SimpleNamespace(lr=0.0, step=lambda grads: got.update(grads))
    with DataParallel(TR, 2) as par:
        loss, norm = par.train_step(model, opt, x, y, lr=0.25, max_norm=1e-3)
        assert par.calls == 1 and par.sharding
    assert TR.loss_and_grads is _loss_and_grads, "the module's own loss_and_grads must come back after the step"
    want_loss, want = _loss_and_grads(model, x, y)
    clipped, want_norm = _clip(want, 1e-3)
    assert (loss, opt.lr) == (pytest.approx(float(want_loss)), 0.25) and norm == pytest.approx(want_norm)
    np.testing.assert_allclose(got["W"], clipped["W"], rtol=1e-10)


def test_a_train_step_that_skips_loss_and_grads_runs_plainly_after_its_first_step():
    seen = []

    def own_way(model, optimizer, x, y, **kwargs):
        seen.append(blas_threads())
        return 0.0, 0.0

    x, y, model = _batch(4)
    with ThreadpoolController().limit(limits=2, user_api="blas"):
        with DataParallel(SimpleNamespace(loss_and_grads=_loss_and_grads, train_step=own_way), 2) as par:
            par.train_step(model, None, x, y)
            assert not par.sharding
            par.train_step(model, None, x, y)
        assert seen == [1, blas_threads()], "once shards are known unused, BLAS keeps its threads"


def test_each_shard_draws_from_its_own_generator_and_a_seed_repeats():
    x, y, model = _batch(4)
    with DataParallel(TR, 2) as par:
        a = par.loss_and_grads(model, x, y, rng=np.random.default_rng(1))
        b = par.loss_and_grads(model, x, y, rng=np.random.default_rng(1))
        c = par.loss_and_grads(model, x, y, rng=np.random.default_rng(2))
    assert a[0] == b[0] and np.array_equal(a[1]["W"], b[1]["W"]), "the same seed must give the same step"
    assert a[0] != c[0], "another seed must give other draws"


def test_workers_run_with_one_blas_thread_and_the_setting_comes_back():
    seen = []

    def spy(model, x, y, rng=None):
        seen.append(blas_threads())
        return _loss_and_grads(model, x, y, rng)

    x, y, model = _batch(4)
    with ThreadpoolController().limit(limits=2, user_api="blas"):
        before = blas_threads()
        with DataParallel(SimpleNamespace(loss_and_grads=spy), 2) as par:
            par.loss_and_grads(model, x, y)
        assert blas_threads() == before
    assert seen == [1, 1], "N shards on N threads must not also use N BLAS threads each"


def test_code_that_keeps_state_on_the_model_is_caught():
    both_in = threading.Barrier(2, timeout=10)

    def stateful(model, x, y, rng=None):
        model["last_x"] = x  # per-call state on a shared model: the other shard overwrites it
        if threading.current_thread() is not threading.main_thread():
            both_in.wait()
        return _loss_and_grads(model, model["last_x"], y)

    x, y, model = _batch(4)
    with DataParallel(SimpleNamespace(loss_and_grads=stateful), 2) as par:
        problem = par.agrees(model, x, y)
    assert problem is not None and problem.startswith("W differs"), problem
    with DataParallel(TR, 2) as par:
        assert par.agrees(model, x, y) is None


def test_workers_below_one_are_refused():
    with pytest.raises(ValueError, match="workers must be at least 1"):
        DataParallel(TR, 0)


def test_float32_gradients_stay_float32():
    """The shards' weights are Python numbers: a NumPy float64 weight would turn the
    float32 gradients of lab 07 into float64 (and AdamW's moments with them)."""
    x, y, model = _batch(5)
    model, y = {"W": model["W"].astype(np.float32)}, y.astype(np.float32)
    with DataParallel(TR, 2) as par:
        _, sharded = par.loss_and_grads(model, x, y)
    assert sharded["W"].dtype == np.float32, f"sharded gradients came back as {sharded['W'].dtype}"
