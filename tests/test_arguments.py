"""Parsing tool-call arguments: valid JSON untouched, near-JSON repaired, the rest named."""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic_core
import pytest
from hypothesis import given
from hypothesis import strategies as st

from handrail import Agent, Runtime, ToolCallPart, tool
from handrail.testing import ScriptedModel, call_raw
from handrail.tools._arguments import (
    ArgumentsError,
    parse_arguments,
    repair_json,
    validate_arguments,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)


@given(json_objects, st.sampled_from([None, 1, 2]), st.booleans())
def test_valid_json_objects_parse_unchanged(value: dict[str, Any], indent: int | None, ascii: bool):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii)
    assert parse_arguments(text) == pydantic_core.from_json(text) == value


@given(json_objects)
def test_repair_leaves_valid_json_meaning_the_same(value: dict[str, Any]):
    text = json.dumps(value)
    assert pydantic_core.from_json(repair_json(text)) == value


@given(json_objects, st.data())
def test_a_truncated_object_is_never_completed_into_a_guess(
    value: dict[str, Any], data: st.DataObject
):
    # Closing cut JSON would invent what the model meant ("Zürich" cut to "Zü"): it is an
    # error the model reads, never a call with part of its arguments.
    text = json.dumps(value)
    cut = data.draw(st.integers(min_value=1, max_value=len(text) - 1))
    with pytest.raises(ArgumentsError, match="not valid JSON"):
        parse_arguments(text[:cut])


@given(st.text())
def test_any_text_parses_to_a_dict_or_a_named_error(text: str):
    try:
        assert isinstance(parse_arguments(text), dict)
    except ArgumentsError as exc:
        assert "arguments" in str(exc)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('```json\n{"city": "Oslo"}\n```', {"city": "Oslo"}),
        ('```\n{"city": "Oslo"}\n```', {"city": "Oslo"}),
        ('{"days": [1, 2,], "city": "Oslo",}', {"days": [1, 2], "city": "Oslo"}),
        ("{'city': 'Oslo', 'note': 'it\\'s \"cold\"'}", {"city": "Oslo", "note": 'it\'s "cold"'}),
        (
            '{"metric": True, "limit": None, "ok": False}',
            {"metric": True, "limit": None, "ok": False},
        ),
        ('{"city": "Oslo", "note": "two\nlines"}', {"city": "Oslo", "note": "two\nlines"}),
        ('{city: "Oslo", days: 3}', {"city": "Oslo", "days": 3}),
        ('Here you go: {"city": "Oslo"} - done.', {"city": "Oslo"}),
        ('{"note": "True story, None left"}', {"note": "True story, None left"}),
    ],
)
def test_near_json_is_repaired(raw: str, expected: dict[str, Any]):
    assert parse_arguments(raw) == expected


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("city=Oslo", "not valid JSON"),
        ('{"city": "Oslo", "days": [1, 2', "not valid JSON"),
        ('{"city": "Zürich", "note": "say \\"h', "not valid JSON"),
        ('{"city": "Oslo", "da', "not valid JSON"),
        ('["Oslo"]', "not a JSON array"),
        ('"Oslo"', "not a JSON string"),
    ],
)
def test_what_cannot_be_repaired_is_named(raw: str, problem: str):
    with pytest.raises(ArgumentsError, match=problem):
        parse_arguments(raw)


@tool
def forecast(city: str, days: int = 1) -> str:
    """The forecast."""
    return f"{city}: sunny for {days} day(s)"


async def test_repaired_calls_run_and_broken_ones_are_counted_as_invalid():
    model = ScriptedModel(
        [
            [
                call_raw("forecast", "{'city': 'Oslo', 'days': 2,}"),
                call_raw("forecast", "city=Bergen"),
            ],
            "Done.",
        ]
    )
    agent = Agent("weather", tools=[forecast])

    result = await agent.run("Forecast?", runtime=Runtime(model=model))

    good, bad = result.state.messages[1].tool_calls
    assert (good.status, good.args, good.result.data) == (
        "completed",
        {"city": "Oslo", "days": 2},
        "Oslo: sunny for 2 day(s)",
    )
    assert bad.status == "failed"
    assert bad.raw_args == "city=Bergen"  # what the model sent is kept
    assert bad.result.error.startswith("Tool 'forecast': the arguments are not valid JSON")
    assert result.state.usage.invalid_tool_calls == 1
    assert result.state.usage.tool_calls == 1
    assert isinstance(good, ToolCallPart)


finite_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@tool
def record(amount: float, extra: Any = None) -> str:
    """Record anything."""
    return "ok"


def _paths(value: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in `value` a leaf could be put: containers' members, and `value` itself."""
    found = [where]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*where, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*where, index))
    return found


def _put(value: Any, where: tuple[Any, ...], leaf: Any) -> Any:
    if not where:
        return leaf
    head, *rest = where
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _put(copy[head], tuple(rest), leaf)
    return copy


@given(
    finite_values,
    st.data(),
    st.sampled_from([float("inf"), float("-inf"), float("nan"), "inf", "NaN", "1e999"]),
)
def test_a_number_that_is_not_finite_anywhere_in_the_arguments_is_named(
    extra: Any, data: st.DataObject, bad: Any
) -> None:
    model = record.input_model
    validated = validate_arguments(model, {"amount": 1.5, "extra": extra})
    assert validated.model_dump()["extra"] == extra
    with pytest.raises(ArgumentsError, match=r"- amount: Input should be a finite number"):
        validate_arguments(model, {"amount": bad, "extra": extra})
    if isinstance(bad, float):  # a string is a string where any value goes
        where = data.draw(st.sampled_from(_paths(extra)))
        path = ".".join(str(p) for p in ("extra", *where))
        message = rf"- {re.escape(path)}: Input should be a finite number"
        with pytest.raises(ArgumentsError, match=message):
            validate_arguments(model, {"amount": 1.5, "extra": _put(extra, where, bad)})
