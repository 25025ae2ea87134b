"""Fixtures are current, reproducible (the same recipe twice gives the same bytes) and small;
"current" forgives another CPU's float32 rounding but not a changed recipe."""

import numpy as np
import pytest

from gptkit.testing.layout import KIT_ROOT
from grader.fixtures import (built_once, generate, load_recipe, npz_bytes, recipes, same_values, torch_available,
                             use_solutions)

MAX_FIXTURE_BYTES = 8 * 1024 * 1024


def test_stored_fixtures_are_current():
    report = generate(check=True, log=lambda *_: None)
    stale = [str(p.relative_to(KIT_ROOT)) for p in report.stale]
    assert not stale, f"fixtures differ from what `uv run grader fixtures` makes: {stale}"
    assert report.unchanged, "no fixture was checked"


@pytest.mark.parametrize("recipe", recipes(), ids=lambda p: p.parent.name)
def test_recipe_gives_the_same_bytes_twice(recipe):
    use_solutions(KIT_ROOT / "solutions")
    module = load_recipe(recipe)
    if getattr(module, "NEEDS_TORCH", False) and not torch_available():
        pytest.skip("this recipe needs torch and transformers (`uv sync --extra torch`)")
    # The first build is the one the check above compared with the stored fixtures (made
    # earlier in this process, where it ran); the second is new.
    first, second = built_once(recipe, module), module.build()
    assert sorted(first) == sorted(second)
    changed = [case for case in first if npz_bytes(first[case]) != npz_bytes(second[case])]
    assert not changed, f"{recipe.parent.name}: cases {changed} differ between two runs of the recipe"


def test_every_recipe_has_fixtures_and_the_folder_is_small():
    total = 0
    for recipe in recipes():
        files = list((recipe.parent / "fixtures").glob("*.npz"))
        assert files, f"{recipe.parent.name} has a recipe but no stored fixtures"
        total += sum(f.stat().st_size for f in files)
    assert total < MAX_FIXTURE_BYTES, f"fixtures take {total / 1e6:.1f} MB; keep them under a few MB"


def _logits_like():
    x = np.random.default_rng(0).normal(0, 0.7, (3, 24, 48)).astype(np.float32)
    x[0, 0, :4] = [1e-7, -2e-6, 0.0, 3e-6]  # elements near zero, where rounding is largest relative to them
    return x


def test_float32_rounding_of_another_cpu_is_not_a_change():
    x = _logits_like()
    noise = x.copy()
    noise[0, 0, :4] += np.float32(3.5e-6)  # what another BLAS gave on logits of size ~2 (issue 8)
    noise[1] *= np.float32(1 + 3e-7)  # a few ulps everywhere
    assert same_values(x, noise)
    assert same_values(np.zeros(3, np.float32), np.zeros(3, np.float32))


@pytest.mark.parametrize("change", ["one element by 1e-3", "all scaled by 1.001", "dtype", "shape"])
def test_a_real_change_of_floats_is_detected(change):
    x = _logits_like()
    y = x.copy()
    if change == "one element by 1e-3":
        y[2, 5, 7] += np.float32(1e-3)
    elif change == "all scaled by 1.001":
        y *= np.float32(1.001)
    elif change == "dtype":
        y = y.astype(np.float64)
    else:
        y = y[:, :-1]
    assert not same_values(x, y)


def test_integers_strings_and_bools_must_be_exact():
    ids = np.arange(12).reshape(3, 4)
    assert same_values(ids, ids.copy())
    assert not same_values(ids, ids + np.eye(3, 4, dtype=ids.dtype))
    assert not same_values(np.array("a post-norm block"), np.array("a post-norm block."))
    assert not same_values(np.array([True, False]), np.array([True, True]))


RECIPE = """
import numpy as np
NEEDS_TORCH = False
def build():
    x = np.random.default_rng(SEED).normal(size=(4, 5)).astype(np.float32)
    return {"case": {"x": x, "y": np.tanh(x) * SCALE}}
"""


def test_an_edited_recipe_is_reported_stale(tmp_path):
    recipe = tmp_path / "01_demo" / "make_fixtures.py"
    recipe.parent.mkdir()
    recipe.write_text(RECIPE.replace("SEED", "1").replace("SCALE", "1"))
    quiet = {"tests_dir": tmp_path, "log": lambda *_: None}
    assert [p.name for p in generate(**quiet).written] == ["case.npz"]
    assert not generate(check=True, **quiet).stale
    for seed, scale in [("2", "1"), ("1", "1.001")]:  # another input; a formula changed by 0.1%
        recipe.write_text(RECIPE.replace("SEED", seed).replace("SCALE", scale))
        assert [p.name for p in generate(check=True, **quiet).stale] == ["case.npz"], (seed, scale)


# -- the staleness bound is certified on a panel of honest rebuilds (docs/fixture_noise.json,
# written by `uv run grader fixtures --noise --write`): every other CPU kernel, thread count
# and the float64 reference stays well inside it, while an edited recipe lands far beyond.

def _noise_report():
    import json

    from grader.fixtures import NOISE_JSON

    return json.loads(NOISE_JSON.read_text(encoding="utf-8"))


def test_the_noise_report_measures_the_current_bound_on_a_full_panel():
    from grader.fixtures import FLOAT_ATOL_OF_MAX, FLOAT_RTOL, NOISE_MARGIN

    report = _noise_report()
    assert report["bound"] == {"rtol": FLOAT_RTOL, "atol_of_max": FLOAT_ATOL_OF_MAX}, \
        "the staleness bound changed since it was measured: run `uv run grader fixtures --noise --write`"
    assert report["margin"] == NOISE_MARGIN
    ids = {run["id"] for run in report["panel"]}
    assert {"reference", "float64", "threads-1"} <= ids, ids
    assert any(i.startswith("kernel-") for i in ids), f"no other OpenBLAS kernel in the panel: {ids}"
    assert all(run["fixtures"] for run in report["panel"]), "a variant rebuilt no fixture"


def test_every_stored_float_array_has_a_noise_measurement():
    arrays = _noise_report()["arrays"]
    missing = []
    for recipe in recipes():
        for path in sorted((recipe.parent / "fixtures").glob("*.npz")):
            with np.load(path, allow_pickle=False) as stored:
                floats = [k for k in stored.files if stored[k].dtype.kind in "fc"]
            missing += [f"{recipe.parent.name}/{path.stem}:{k}" for k in floats
                        if f"{recipe.parent.name}/{path.stem}:{k}" not in arrays]
    assert not missing, (f"{len(missing)} stored arrays were never rebuilt by the noise panel (first: {missing[:5]}): "
                         "run `uv run grader fixtures --noise --write`")


def test_every_honest_rebuild_stays_within_the_margin():
    from grader.fixtures import NOISE_MARGIN

    over = {k: v for k, v in _noise_report()["arrays"].items() if not v["deviation"] <= NOISE_MARGIN}
    assert not over, (f"these arrays move by more than {NOISE_MARGIN} of the staleness bound when rebuilt honestly, "
                      f"so another machine may call them stale: {dict(list(over.items())[:8])}")


def test_an_edit_of_a_tenth_of_a_percent_lands_far_beyond_the_worst_honest_rebuild():
    from grader.fixtures import NOISE_MARGIN, deviation

    x = _logits_like()
    moved = deviation(x, x * np.float32(1.001))
    assert moved >= 8 * NOISE_MARGIN, moved  # an edit moves values ≥ 8× as far as any honest rebuild may
