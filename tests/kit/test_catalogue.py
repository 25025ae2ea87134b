"""The bug catalogue is the proof that the tests have teeth: every bug must be caught,
and a failure message must name the concept."""

import pytest

from gptkit.testing.layout import KIT_ROOT, lab_dirs
from grader.catalogue import check_catalogue, describe, load_catalogue

LABS = [lab.name for lab in lab_dirs(KIT_ROOT / "solutions")]


@pytest.mark.parametrize("lab", LABS)
def test_every_catalogued_bug_is_caught(lab):
    bugs = load_catalogue(labs=[lab])
    assert bugs, f"{lab} has no bug catalogue (solutions/{lab}/bugs.toml)"
    results = check_catalogue(bugs, jobs=2)
    bad = [describe(r) for r in results if not r.ok]
    assert not bad, "\n".join(bad)
