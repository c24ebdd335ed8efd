"""Partial argument matching: what an expectation gives must be in the call."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from handrail.evals import matches, mismatch

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
mappings = st.dictionaries(st.text(max_size=5), values, max_size=5)


@given(values)
def test_every_value_matches_itself(value: Any) -> None:
    assert matches(value, value)


@given(mappings)
def test_an_empty_expectation_matches_any_mapping(actual: dict[str, Any]) -> None:
    assert matches({}, actual)


@given(mappings, mappings)
def test_extra_keys_in_the_call_do_not_matter(
    expected: dict[str, Any], extra: dict[str, Any]
) -> None:
    assert matches(expected, {**extra, **expected})


@given(mappings, st.text(max_size=5), values)
def test_a_missing_key_is_named(actual: dict[str, Any], key: str, value: Any) -> None:
    actual.pop(key, None)
    assert mismatch({key: value}, actual) == f"{key} is missing"


@given(st.integers(min_value=-(2**50), max_value=2**50))
def test_numbers_match_across_int_and_float(number: int) -> None:
    assert matches({"amount": number}, {"amount": float(number)})
    assert matches({"amount": float(number)}, {"amount": number})


def test_nested_mappings_match_partially_and_lists_match_whole() -> None:
    call = {"order": {"id": "A1", "lines": [{"sku": "x", "qty": 2}]}, "note": "hi"}
    assert matches({"order": {"id": "A1"}}, call)
    assert matches({"order": {"lines": [{"sku": "x"}]}}, call)
    assert mismatch({"order": {"lines": []}}, call) == (
        "order.lines is [{'sku': 'x', 'qty': 2}], not []"
    )
    assert mismatch({"order": {"lines": [{"qty": 3}]}}, call) == "order.lines[0].qty is 2, not 3"


def test_a_bool_is_not_a_number_and_types_must_agree() -> None:
    assert not matches({"flag": 1}, {"flag": True})
    assert not matches({"id": "1"}, {"id": 1})
    assert mismatch({"a": {"b": 1}}, {"a": 5}) == "a is 5, not a mapping"
