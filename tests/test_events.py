"""Events: one discriminated union, every member JSON round-trippable."""

from __future__ import annotations

import dataclasses
import json
import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import handrail.events
from handrail import (
    EVENT,
    EVENTS,
    AgentCompleted,
    ApprovalRequired,
    Event,
    RunFailed,
    TextDelta,
    ToolCallStarted,
)

DESIGN_PAGE = Path(__file__).resolve().parent.parent / "docs" / "design.md"


def design_event_types() -> list[str]:
    """The event names of docs/design.md's events table (its rows' first cells)."""
    section = DESIGN_PAGE.read_text().split("## Events", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [name for cell in rows for name in re.findall(r"`([a-z-]+)`", cell)]


EVENT_CLASSES: tuple[type[Any], ...] = get_args(get_args(Event)[0])


def type_tag(cls: type[Any]) -> str:
    [tag] = get_args(get_type_hints(cls)["type"])
    return tag


# -- strategies, derived from each event's field annotations, so a new field is covered -------

texts = st.text(max_size=20)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)


def strategy_for(annotation: Any) -> st.SearchStrategy[Any]:
    origin = get_origin(annotation)
    if annotation is Any:
        return json_values
    if annotation is type(None):
        return st.none()
    if annotation is str:
        return texts
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.integers()
    if annotation is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if origin is Literal:
        return st.sampled_from(get_args(annotation))
    if origin in (Union, types.UnionType):
        return st.one_of(*(strategy_for(arg) for arg in get_args(annotation)))
    if origin is list:
        return st.lists(strategy_for(get_args(annotation)[0]), max_size=4)
    if origin is dict:
        key, value = get_args(annotation)
        return st.dictionaries(strategy_for(key), strategy_for(value), max_size=4)
    raise NotImplementedError(f"no strategy for {annotation!r}: extend strategy_for")


def event_strategy(cls: type[Any]) -> st.SearchStrategy[Any]:
    hints = get_type_hints(cls)
    return st.builds(
        cls,
        **{
            f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls) if f.name != "type"
        },
    )


any_event = st.one_of(*(event_strategy(cls) for cls in EVENT_CLASSES))


# -- the union --------------------------------------------------------------------------------


def test_the_event_types_are_exactly_those_of_the_design_page():
    tags = [type_tag(cls) for cls in EVENT_CLASSES]
    documented = design_event_types()
    assert len(documented) == 16  # the page's table is found and read whole
    assert len(tags) == len(set(tags))
    assert sorted(tags) == sorted(documented)


def test_every_event_class_of_the_module_is_in_the_union():
    defined = {
        obj
        for name in handrail.events.__all__
        if dataclasses.is_dataclass(obj := getattr(handrail.events, name))
    }
    assert defined == set(EVENT_CLASSES)


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=type_tag)
def test_an_event_carries_its_type_by_default(cls: type[Any]):
    field = next(f for f in dataclasses.fields(cls) if f.name == "type")
    assert field.default == type_tag(cls)


# -- round trips ------------------------------------------------------------------------------


@given(any_event)
def test_one_event_round_trips_through_json(event: Any):
    assert EVENT.validate_json(EVENT.dump_json(event)) == event


@given(st.lists(any_event, max_size=6))
def test_a_list_of_events_round_trips_through_json(events: list[Any]):
    assert EVENTS.validate_json(EVENTS.dump_json(events)) == events


@given(st.lists(any_event, max_size=6))
def test_a_list_of_events_round_trips_through_json_compatible_python(events: list[Any]):
    dumped = EVENTS.dump_python(events, mode="json")
    assert EVENTS.validate_python(dumped) == events
    assert json.loads(EVENTS.dump_json(events)) == dumped


@given(any_event)
def test_the_json_form_of_an_event_names_its_type(event: Any):
    assert EVENT.dump_python(event, mode="json")["type"] == type_tag(type(event))


# -- the wire form ----------------------------------------------------------------------------


def test_an_event_is_flat_json_with_its_type():
    assert json.loads(EVENT.dump_json(TextDelta(agent="a", message_id="msg_1", delta="Hi"))) == {
        "type": "text-delta",
        "agent": "a",
        "message_id": "msg_1",
        "delta": "Hi",
    }
    assert EVENT.dump_python(
        ApprovalRequired(tool_call_id="c1", name="orders.refund", args={"amount": 5}),
        mode="json",
    ) == {
        "type": "approval-required",
        "tool_call_id": "c1",
        "name": "orders.refund",
        "args": {"amount": 5},
        "prompt": None,
        "amendable": [],
        "kind": "approval",
        "digest": None,
        "agent": None,
    }


def test_events_validate_from_json_with_their_defaults():
    assert EVENTS.validate_json(
        '[{"type": "agent-completed", "agent": "a"},'
        ' {"type": "tool-call-started", "agent": "a", "tool_call_id": "c", "name": "n",'
        ' "args": null}]'
    ) == [
        AgentCompleted(agent="a"),
        ToolCallStarted(agent="a", tool_call_id="c", name="n", args=None),
    ]


def test_an_unknown_event_type_is_rejected():
    with pytest.raises(ValidationError) as caught:
        EVENT.validate_json('{"type": "run-paused"}')

    [error] = caught.value.errors(include_url=False)
    assert error["type"] == "union_tag_invalid"
    assert error["ctx"]["tag"] == "run-paused"


def test_an_event_missing_a_required_field_is_rejected():
    with pytest.raises(ValidationError) as caught:
        EVENT.validate_json('{"type": "text-delta", "agent": "a", "message_id": "m"}')

    [error] = caught.value.errors(include_url=False)
    assert (error["type"], error["loc"]) == ("missing", ("text-delta", "delta"))


def test_a_run_failed_reason_outside_the_known_ones_is_rejected():
    with pytest.raises(ValidationError):
        EVENT.validate_python({"type": "run-failed", "reason": "crashed"})
    assert EVENT.validate_python({"type": "run-failed", "reason": "error"}) == RunFailed(
        reason="error"
    )
