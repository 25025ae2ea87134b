"""Fixtures are reproducible (regenerating them changes no byte) and small."""

from gptkit.testing.layout import KIT_ROOT
from grader.fixtures import generate, recipes

MAX_FIXTURE_BYTES = 8 * 1024 * 1024


def test_fixtures_regenerate_byte_for_byte():
    report = generate(check=True, log=lambda *_: None)
    stale = [str(p.relative_to(KIT_ROOT)) for p in report.stale]
    assert not stale, f"fixtures differ from what `uv run grader fixtures` makes: {stale}"
    assert report.unchanged, "no fixture was checked"


def test_every_recipe_has_fixtures_and_the_folder_is_small():
    total = 0
    for recipe in recipes():
        files = list((recipe.parent / "fixtures").glob("*.npz"))
        assert files, f"{recipe.parent.name} has a recipe but no stored fixtures"
        total += sum(f.stat().st_size for f in files)
    assert total < MAX_FIXTURE_BYTES, f"fixtures take {total / 1e6:.1f} MB; keep them under a few MB"
