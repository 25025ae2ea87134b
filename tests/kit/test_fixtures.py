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
