"""`grader validate`, the kit's check of itself, as part of the kit's test suite: stubs and
fixtures current, solutions pass every test, stubs fail every lab test with their
NotImplementedError, the student copy holds no solution text, and every catalogued
student bug is caught with a message that names its concept (the proof that the tests
have teeth). One run checks every lab; its report is the failure message."""

from grader import validate


def test_grader_validate_passes():
    sections = validate.run(jobs=2)
    report = validate.render(sections)
    print(report)
    assert all(s.ok for s in sections), "grader validate found problems:\n" + report
