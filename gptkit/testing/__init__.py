"""Test-side helpers: find the code under test, compare arrays with readable messages,
read stored fixtures, and reach PyTorch when it is installed."""

from gptkit.testing.assertions import (
    assert_causal,
    assert_close,
    assert_float32,
    assert_rejects_bad_x,
    explains_errors,
    mismatch_summary,
    raises_clearly,
)
from gptkit.testing.fixtures import diagnosis_label, load_fixture, stored_diagnoses
from gptkit.testing.loader import lab
from gptkit.testing.remote import same_object, shares_memory

__all__ = ["assert_causal", "assert_close", "assert_float32", "assert_rejects_bad_x", "diagnosis_label",
           "explains_errors", "lab", "load_fixture", "mismatch_summary", "raises_clearly", "same_object",
           "shares_memory", "stored_diagnoses"]
