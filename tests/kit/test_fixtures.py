"""Fixtures are current, reproducible (the same recipe twice gives the same bytes) and small."""

import pytest

from gptkit.testing.layout import KIT_ROOT
from grader.fixtures import load_recipe, npz_bytes, torch_available, use_solutions, generate, recipes

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
    first, second = module.build(), module.build()
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
