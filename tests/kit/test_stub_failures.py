"""Every lab test must fail on the stubs, with the stub's NotImplementedError naming the
lab: a test that passes on an empty implementation checks nothing."""

import pytest

from gptkit.testing.layout import KIT_ROOT, lab_dirs
from grader.validate import check_stubs_fail

LABS = [lab for lab in lab_dirs(KIT_ROOT / "labs")]


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_stubs_fail_every_test_of_the_lab(lab):
    section = check_stubs_fail(lab.marker)
    assert section.ok, "\n".join(section.lines)
