from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, field_serializer
from pydantic_core import to_json

from handrail.context import (
    MISSING,
    ContextStore,
    Index,
    Key,
    Segment,
    Wildcard,
    check_path,
    format_path,
    parse_path,
    walk,
)
from handrail.exceptions import ConfigError, ContextFullError, PathError, UserError

# -- helpers and fixtures ---------------------------------------------------------------------


def message(call: Any, *args: Any, error: type[Exception] = PathError) -> str:
    with pytest.raises(error) as info:
        call(*args)
    return str(info.value)


def size(value: Any) -> int:
    return len(to_json(value))


class Item(BaseModel):
    sku: str
    qty: int


class Order(BaseModel):
    id: str
    items: list[Item]


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    known: int


@dataclass
class Point:
    x: int
    y: int


class Plain:
    def __init__(self) -> None:
        self.visible = 1
        self._hidden = 2


class Slotted:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 3


class Empty:
    pass


@pytest.fixture
def store() -> ContextStore:
    context = ContextStore(
        vars={"cart": {"items": [1, 2, 3], "total": 6}},
        sys={"org_id": "acme", "user_id": "u1", "session_id": "s1", "now": "2025-01-02T03:04:05Z"},
    )
    context.record("orders.lookup", "c1", {"items": [{"sku": "A"}], "total": 3})
    context.record("orders.lookup", "c2", {"items": [{"sku": "B"}, {"sku": "C"}], "total": 4})
    context.record("search", "c3", ["hit"])
    return context


# -- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "segments"),
    [
        ("", ()),
        ("items", (Key("items"),)),
        (".items", (Key("items"),)),
        ("items[0].sku", (Key("items"), Index(0), Key("sku"))),
        ("[-1]", (Index(-1),)),
        ("[*].x[*]", (Wildcard(), Key("x"), Wildcard())),
        ('["a b"]', (Key("a b"),)),
        ("['a.b']", (Key("a.b"),)),
        ('a["x"]["y"]', (Key("a"), Key("x"), Key("y"))),
        ('["say \\"hi\\""]', (Key('say "hi"'),)),
        ("['it\\'s']", (Key("it's"),)),
        ('["back\\\\slash"]', (Key("back\\slash"),)),
        ('["it\'s"]', (Key("it's"),)),
        ('[""]', (Key(""),)),
        ("user-id.first", (Key("user-id"), Key("first"))),
        ("prénom", (Key("prénom"),)),
        ("[007]", (Index(7),)),
        ("[999999999999999999]", (Index(999_999_999_999_999_999),)),
    ],
)
def test_parse_path_reads_keys_indexes_wildcards_and_quoted_keys(
    path: str, segments: tuple[Segment, ...]
) -> None:
    assert parse_path(path) == segments


def test_parse_path_is_cached() -> None:
    assert parse_path("cached.path[3]") is parse_path("cached.path[3]")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a..b", "syntax error at position 2: unexpected '.'; expected a key after \".\""),
        ("a.", 'syntax error at position 2: unexpected end of path; expected a key after "."'),
        ("a[0", 'syntax error at position 3: unexpected end of path; expected "]"'),
        ("[*", 'syntax error at position 2: unexpected end of path; expected "]"'),
        ('["a"x', "syntax error at position 4: unexpected 'x'; expected \"]\""),
        (
            "a[x]",
            "syntax error at position 2: unexpected 'x'; expected an index, \"*\" or a quoted"
            ' key after "["',
        ),
        (
            "a[]",
            "syntax error at position 2: unexpected ']'; expected an index, \"*\" or a quoted"
            ' key after "["',
        ),
        (
            "a[-]",
            "syntax error at position 2: unexpected '-'; expected an index, \"*\" or a quoted"
            ' key after "["',
        ),
        (
            "a b",
            'syntax error at position 1: unexpected \' \'; expected "." or "[" after a segment',
        ),
        ("!a", 'syntax error at position 0: unexpected \'!\'; expected a key, "." or "["'),
        (
            '["a',
            "syntax error at position 3: unexpected end of path; expected '\"' to close the"
            " quoted key",
        ),
        (
            "['a\\",
            "syntax error at position 4: unexpected end of path; only \\\\, \\\" and \\' are"
            " escapes in a quoted key",
        ),
        (
            '["a\\n"]',
            "syntax error at position 4: unexpected 'n'; only \\\\, \\\" and \\' are escapes in"
            " a quoted key",
        ),
        (
            "[1234567890123456789]",
            "syntax error at position 19: unexpected '9'; an index has at most 18 digits",
        ),
        (
            "[-1234567890123456789]",
            "syntax error at position 20: unexpected '9'; an index has at most 18 digits",
        ),
    ],
)
def test_parse_path_syntax_error_names_position_and_character(path: str, expected: str) -> None:
    with pytest.raises(PathError) as info:
        parse_path(path)
    assert str(info.value) == f'"{path}": {expected}'
    assert info.value.path == path
    assert info.value.segment is None


@pytest.mark.parametrize(
    ("segments", "text"),
    [
        ((Key("items"), Index(0), Key("sku")), "items[0].sku"),
        ((Index(-1), Key("a")), "[-1].a"),
        ((Wildcard(), Key("x")), "[*].x"),
        ((Key("a b"), Key("c")), '["a b"].c'),
        ((Key('q"\\'),), '["q\\"\\\\"]'),
        ((), ""),
    ],
)
def test_format_path_writes_canonical_text(segments: tuple[Segment, ...], text: str) -> None:
    assert format_path(segments) == text


segments_strategy = st.lists(
    st.one_of(
        st.builds(Key, st.text(max_size=8)),
        st.builds(Index, st.integers(min_value=-(10**18) + 1, max_value=10**18 - 1)),
        st.just(Wildcard()),
    ),
    max_size=6,
).map(tuple)


@given(segments_strategy)
def test_format_then_parse_round_trips(segments: tuple[Segment, ...]) -> None:
    assert parse_path(format_path(segments)) == segments


path_characters = st.sampled_from(list("ab01-_.[]*\"'\\ é:!"))


@given(st.text(path_characters, max_size=24) | st.text(max_size=24))
def test_garbage_either_parses_or_raises_path_error(text: str) -> None:
    try:
        segments = parse_path(text)
    except PathError as error:
        assert error.path == text
        assert re.search(r"syntax error at position \d+: unexpected ", str(error))
    else:
        assert parse_path(format_path(segments)) == segments


@given(
    st.sampled_from(["var:", "tool:", "call:", "sys:", "", "nope:", "tool:orders.lookup"]),
    st.text(path_characters, max_size=20) | st.text(max_size=20),
)
def test_garbage_store_paths_resolve_or_raise_path_error(prefix: str, text: str) -> None:
    context = ContextStore(vars={"a": {"b": [1]}}, sys={"user_id": "u"})
    context.record("orders.lookup", "c1", {"a": [1, 2]})
    context.record("a", "a1", {"b": 1})
    try:
        context.get(prefix + text)
    except PathError as error:
        assert error.path == prefix + text
    try:
        context.set(prefix + text, 1)
    except PathError as error:
        assert error.path == prefix + text


# -- walking ----------------------------------------------------------------------------------

json_leaves = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4)
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=25,
)


@st.composite
def value_with_path(draw: st.DrawFn) -> tuple[Any, tuple[Segment, ...], Any]:
    """A JSON value, a valid path into it, and the element reached by direct indexing."""
    value = draw(json_values)
    segments: list[Segment] = []
    reached = value
    while draw(st.integers(0, 4)):
        if isinstance(reached, dict) and reached:
            key = draw(st.sampled_from(sorted(reached)))
            segments.append(Key(key))
            reached = reached[key]
        elif isinstance(reached, list) and reached:
            how = draw(st.sampled_from(["index", "first", "last"]))
            if how == "index":
                position = draw(st.integers(-len(reached), len(reached) - 1))
                segments.append(Index(position))
                reached = reached[position]
            else:
                segments.append(Key(how))
                reached = reached[0] if how == "first" else reached[-1]
        else:
            break
    return value, tuple(segments), reached


@given(value_with_path())
def test_walk_reaches_the_element_direct_indexing_reaches(
    case: tuple[Any, tuple[Segment, ...], Any],
) -> None:
    value, segments, reached = case
    assert walk(value, format_path(segments)) is reached


@given(st.lists(st.fixed_dictionaries({"x": json_values})))
def test_fan_out_equals_a_list_comprehension(items: list[dict[str, Any]]) -> None:
    assert walk(items, "[*].x") == [item["x"] for item in items]


@given(st.lists(st.lists(json_values, max_size=3), max_size=4))
def test_nested_fan_out_flattens_one_level_per_wildcard(rows: list[list[Any]]) -> None:
    assert walk(rows, "[*][*]") == [cell for row in rows for cell in row]
    assert walk(rows, "[*]") == rows


@given(
    st.lists(
        st.fixed_dictionaries(
            {"items": st.lists(st.fixed_dictionaries({"sku": st.text(max_size=3)}), max_size=3)}
        ),
        max_size=4,
    )
)
def test_fan_out_through_keys_is_one_flat_list(orders: list[dict[str, Any]]) -> None:
    expected = [item["sku"] for order in orders for item in order["items"]]
    assert walk(orders, "[*].items[*].sku") == expected
    assert walk({"orders": orders}, "orders[*].items") == [order["items"] for order in orders]


def test_walk_empty_path_returns_the_value_itself() -> None:
    value = {"a": 1}
    assert walk(value, "") is value


def test_first_and_last_on_a_list_are_its_ends_and_a_real_key_wins_on_a_mapping() -> None:
    assert walk([1, 2, 3], ".first") == 1
    assert walk([1, 2, 3], "last") == 3
    assert walk({"first": "real", "last": "key"}, "first") == "real"
    assert walk({"xs": (4, 5)}, "xs.last") == 5


def test_walk_reads_pydantic_models_dataclasses_and_objects_by_attribute() -> None:
    order = Order(id="o-1", items=[Item(sku="A", qty=2), Item(sku="B", qty=1)])
    assert walk(order, "items[-1].sku") == "B"
    assert walk(order, "items[*].qty") == [2, 1]
    assert walk(Loose(known=1, extra_field=2), "extra_field") == 2
    assert walk(Point(1, 2), "y") == 2
    assert walk(Plain(), "visible") == 1
    assert walk(Slotted(), "value") == 3


def test_walk_reads_any_mapping_and_sequence() -> None:
    assert walk(MappingProxyType({"a": {"b": 1}}), "a.b") == 1
    assert walk(range(10), "[-2]") == 8
    assert walk((1, (2, 3)), "[1][0]") == 2


def test_walk_does_not_create_keys_in_a_defaultdict() -> None:
    counts: defaultdict[str, int] = defaultdict(int)
    with pytest.raises(PathError):
        walk(counts, "missing")
    assert counts == {}


@pytest.mark.parametrize(
    ("value", "path", "expected"),
    [
        (
            {"items": [1, 2, 3]},
            "items[5]",
            'at "[5]": index 5 is out of range for a list of 3 items',
        ),
        ({"items": [1]}, "items[-2]", 'at "[-2]": index -2 is out of range for a list of 1 item'),
        ((1, 2), "[2]", 'at "[2]": index 2 is out of range for a tuple of 2 items'),
        ((), "[0]", 'at "[0]": index 0 is out of range for an empty tuple'),
        ([], "[0]", 'at "[0]": index 0 is out of range for an empty list'),
        (range(1), "[1]", 'at "[1]": index 1 is out of range for a range of 1 item'),
        (
            {"items": [], "total": 0},
            "totl",
            'at ".totl": no key "totl" in an object with keys: items, total',
        ),
        (MappingProxyType({}), "a", 'at ".a": no key "a" in an empty object'),
        (
            [1, 2],
            "x",
            'at ".x": cannot read key "x" of a list of 2 items: use an index such as [0], or'
            " .first / .last",
        ),
        ([], "first", 'at ".first": .first of an empty list'),
        ((), "last", 'at ".last": .last of an empty list'),
        (3, "x", 'at ".x": cannot read key "x" of an int (3)'),
        (None, "x", 'at ".x": cannot read key "x" of None'),
        ("abc", "[0]", "at \"[0]\": cannot index a str ('abc'): [0] needs a list"),
        (
            "x" * 50,
            "a",
            f'at ".a": cannot read key "a" of a str (\'{"x" * 38}…)',
        ),
        (
            {"a": 1},
            "[0]",
            'at "[0]": cannot index an object with keys: a: [0] needs a list; use a key, as'
            ' .name or ["name"]',
        ),
        (
            {"a": 1},
            "[*]",
            'at "[*]": cannot fan out over an object with keys: a: [*] needs a list',
        ),
        (
            Item(sku="A", qty=1),
            "price",
            'at ".price": no attribute "price" on an Item with fields: qty, sku',
        ),
        (
            Loose(known=1, more=2),
            "price",
            'at ".price": no attribute "price" on a Loose with fields: known, more',
        ),
        (Point(1, 2), "z", 'at ".z": no attribute "z" on a Point with fields: x, y'),
        (Plain(), "gone", 'at ".gone": no attribute "gone" on a Plain with fields: visible'),
        (Slotted(), "gone", 'at ".gone": no attribute "gone" on a Slotted'),
        (Empty(), "gone", 'at ".gone": no attribute "gone" on an Empty'),
        (
            Plain(),
            "_hidden",
            'at "._hidden": attribute "_hidden" is private: a path reads public attributes only',
        ),
        (
            Plain(),
            "__class__",
            'at ".__class__": attribute "__class__" is private: a path reads public attributes'
            " only",
        ),
        (
            {"a b": {}},
            '["a b"]["c d"]',
            'at "["c d"]": no key "c d" in an empty object',
        ),
    ],
)
def test_walk_resolution_error_names_segment_and_what_was_found(
    value: Any, path: str, expected: str
) -> None:
    with pytest.raises(PathError) as info:
        walk(value, path)
    assert str(info.value) == f'"{path}": {expected}'
    assert info.value.path == path
    assert info.value.segment == expected.split('": ', 1)[0].removeprefix('at "')


def test_walk_error_segment_attribute_is_the_failing_segment() -> None:
    with pytest.raises(PathError) as info:
        walk({"items": [1]}, "items[3].x")
    assert info.value.segment == "[3]"


def test_key_listing_is_sorted_and_truncated() -> None:
    wide = {f"k{n:02}": n for n in range(25)}
    shown = ", ".join(f"k{n:02}" for n in range(20))
    assert message(walk, wide, "zz") == (
        f'"zz": at ".zz": no key "zz" in an object with keys: {shown}, … and 5 more'
    )
    long_key = "k" * 60
    assert message(walk, {long_key: 1}, "zz") == (
        f'"zz": at ".zz": no key "zz" in an object with keys: {"k" * 39}…'
    )


def test_fan_out_error_names_the_element_where_it_failed() -> None:
    orders = {"orders": [{"total": 1}, {"id": 2}]}
    assert message(walk, orders, "orders[*].total") == (
        '"orders[*].total": at ".total" in orders[1]: no key "total" in an object with keys: id'
    )
    nested = [{"xs": [1]}, {"xs": [2, {"y": 3}]}]
    assert message(walk, nested, "[*].xs[*].y") == (
        '"[*].xs[*].y": at ".y" in [0].xs[0]: cannot read key "y" of an int (1)'
    )
    assert message(walk, [[1], 2], "[*][*]") == (
        '"[*][*]": at "[*]" in [1]: cannot fan out over an int (2): [*] needs a list'
    )


def test_fan_out_over_an_empty_list_is_an_empty_list() -> None:
    assert walk({"xs": []}, "xs[*].anything[*]") == []


# -- namespaces -------------------------------------------------------------------------------


def test_path_without_namespace_is_refused_even_with_default(store: ContextStore) -> None:
    assert message(store.get, "cart.total") == (
        '"cart.total": a context path starts with a namespace, one of: var:, tool:, call:, sys:'
    )
    with pytest.raises(PathError):
        store.get("cart.total", None)


def test_unknown_namespace_names_the_valid_ones_even_with_default(store: ContextStore) -> None:
    with pytest.raises(PathError) as info:
        store.get("env:HOME", default=None)
    assert str(info.value) == (
        '"env:HOME": unknown namespace "env:"; valid namespaces: var:, tool:, call:, sys:'
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "var:",
            "syntax error at position 4: unexpected end of path; expected a variable name after"
            ' "var:"',
        ),
        (
            "var:[0]",
            "syntax error at position 4: unexpected '['; expected a variable name after \"var:\"",
        ),
        (
            "var:.cart",
            "syntax error at position 4: unexpected '.'; expected a variable name after \"var:\"",
        ),
        (
            "sys:",
            'syntax error at position 4: unexpected end of path; expected a sys key after "sys:"',
        ),
        ("var:cart..x", "syntax error at position 9: unexpected '.'; expected a key after \".\""),
        (
            "tool:",
            "syntax error at position 5: unexpected end of path; expected a tool name after"
            ' "tool:"',
        ),
        (
            "tool:.x",
            "syntax error at position 5: unexpected '.'; expected a tool name after \"tool:\"",
        ),
        (
            "tool:[]",
            "syntax error at position 5: unexpected '['; expected a tool name after \"tool:\"",
        ),
        (
            "tool:a b",
            'syntax error at position 6: unexpected \' \'; expected "." or "[" after a segment',
        ),
        (
            "tool:a[]x",
            'syntax error at position 8: unexpected \'x\'; expected "." or "[" after the name',
        ),
        (
            "tool:orders.lookup.items[0",
            'syntax error at position 26: unexpected end of path; expected "]"',
        ),
        (
            "call:",
            "syntax error at position 5: unexpected end of path; expected a tool call id after"
            ' "call:"',
        ),
        (
            "call:c1é",
            'syntax error at position 7: unexpected \'é\'; expected "." or "[" after the name',
        ),
        (
            "call:c1[]",
            "syntax error at position 8: unexpected ']'; expected an index, \"*\" or a quoted"
            ' key after "["',
        ),
    ],
)
def test_malformed_store_path_is_a_syntax_error_even_with_default(
    store: ContextStore, path: str, expected: str
) -> None:
    with pytest.raises(PathError) as info:
        store.get(path, default=None)
    assert str(info.value) == f'"{path}": {expected}'
    assert info.value.segment is None
    with pytest.raises(PathError):
        check_path(path)


def test_check_path_accepts_well_formed_paths_without_reading_them() -> None:
    for path in ("var:cart.total", "tool:orders.lookup[][-1].id", "call:call_1", "sys:now"):
        check_path(path)


# -- var: -------------------------------------------------------------------------------------


def test_var_paths_read_session_variables(store: ContextStore) -> None:
    assert store.get("var:cart") == {"items": [1, 2, 3], "total": 6}
    assert store.get("var:cart.items.last") == 3
    assert store.get("var:cart.items[*]") == [1, 2, 3]


def test_missing_variable_lists_the_variables_set(store: ContextStore) -> None:
    with pytest.raises(PathError) as info:
        store.get("var:cartt")
    assert str(info.value) == '"var:cartt": no variable "cartt" is set; variables set: cart'
    assert info.value.segment == "cartt"
    assert message(ContextStore().get, "var:x") == (
        '"var:x": no variable "x" is set; variables set: none'
    )


def test_var_resolution_error_names_the_segment(store: ContextStore) -> None:
    assert message(store.get, "var:cart.items[5]") == (
        '"var:cart.items[5]": at "[5]": index 5 is out of range for a list of 3 items'
    )
    assert message(store.get, "var:cart.totl") == (
        '"var:cart.totl": at ".totl": no key "totl" in an object with keys: items, total'
    )


def test_fan_out_error_in_a_var_names_the_element_from_the_variable() -> None:
    context = ContextStore(vars={"orders": [{"total": 1}, {"id": 2}]})
    assert message(context.get, "var:orders[*].total") == (
        '"var:orders[*].total": at ".total" in var:orders[1]: no key "total" in an object with'
        " keys: id"
    )


def test_default_is_returned_for_any_path_that_does_not_resolve(store: ContextStore) -> None:
    for path in (
        "var:nope",
        "var:cart.items[9]",
        "tool:nope",
        "tool:search[5]",
        "call:nope",
        "call:c3.x",
        "sys:nope",
        "sys:now.x",
    ):
        assert store.get(path, default=None) is None
        assert store.get(path, "fallback") == "fallback"


def test_missing_sentinel_is_distinct_from_none() -> None:
    assert repr(MISSING) == "MISSING"
    assert ContextStore(vars={"a": None}).get("var:a") is None


def test_quoted_variable_names_work(store: ContextStore) -> None:
    store.set('var:["my var"]', {"a.b": 1})
    assert store.get("var:['my var']['a.b']") == 1


def test_set_replaces_a_variable(store: ContextStore) -> None:
    store.set("var:cart", {"total": 0})
    assert store.get("var:cart") == {"total": 0}
    assert store.vars == {"cart": {"total": 0}}


def test_set_writes_into_dicts_and_lists_along_the_path(store: ContextStore) -> None:
    store.set("var:cart.total", 9)
    store.set("var:cart.items[-1]", 30)
    store.set("var:cart.items.first", 10)
    assert store.get("var:cart") == {"items": [10, 2, 30], "total": 9}


def test_set_creates_dicts_for_missing_keys(store: ContextStore) -> None:
    store.set("var:profile.address.city", "Lyon")
    store.set("var:cart.meta.source", "web")
    assert store.get("var:profile") == {"address": {"city": "Lyon"}}
    assert store.get("var:cart.meta") == {"source": "web"}


def test_set_copies_containers_so_earlier_reads_do_not_change(store: ContextStore) -> None:
    before = store.get("var:cart")
    store.set("var:cart.items[0]", 100)
    assert before == {"items": [1, 2, 3], "total": 6}
    assert store.get("var:cart.items") == [100, 2, 3]


def test_set_nested_into_a_list_of_dicts() -> None:
    context = ContextStore(vars={"rows": [{"a": 1}, {"a": 2}]})
    context.set("var:rows[1].a", 20)
    assert context.get("var:rows[*].a") == [1, 20]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "var:cart.items[5]",
            'at "[5]": index 5 is out of range for a list of 3 items',
        ),
        (
            "var:cart.items[*]",
            'at "[*]": cannot write through [*]: a write goes to one place',
        ),
        (
            "var:cart.total.x",
            'at ".x": cannot write into an int (6): only dicts and lists can be written into; set'
            " the whole variable instead",
        ),
        (
            "var:cart[0]",
            'at "[0]": cannot index an object with keys: items, total: [0] needs a list; use a'
            ' key, as .name or ["name"]',
        ),
        (
            "var:cart.items.x",
            'at ".x": cannot read key "x" of a list of 3 items: use an index such as [0], or'
            " .first / .last",
        ),
        (
            "var:point.x",
            'at ".x": cannot write into a tuple of 2 items: only dicts and lists can be written'
            " into; set the whole variable instead",
        ),
    ],
)
def test_set_refuses_paths_that_do_not_lead_to_a_dict_or_list(path: str, expected: str) -> None:
    context = ContextStore(vars={"cart": {"items": [1, 2, 3], "total": 6}, "point": (1, 2)})
    before = context.dump()
    assert message(context.set, path, 1) == f'"{path}": {expected}'
    assert context.dump() == before


def test_set_refuses_a_value_that_is_not_json(store: ContextStore) -> None:
    before = store.dump()
    assert message(store.set, "var:thing", object()) == (
        '"var:thing": the value cannot be stored: Unable to serialize unknown type: <class'
        " 'object'>. Variables are persisted with the session, so they must serialise to JSON"
    )
    assert store.dump() == before


def test_constructor_refuses_a_variable_that_is_not_json() -> None:
    with pytest.raises(PathError) as info:
        ContextStore(vars={"a b": object()})
    assert info.value.path == 'var:["a b"]'


@pytest.mark.parametrize("path", ["sys:user_id", "sys:now.x"])
def test_sys_is_read_only(store: ContextStore, path: str) -> None:
    assert message(store.set, path, "u2") == (
        f'"{path}": sys is read-only: its values are set when the ContextStore is built (sys=...)'
    )
    assert store.get("sys:user_id") == "u1"


@pytest.mark.parametrize("path", ["tool:search", "call:c3"])
def test_tool_and_call_paths_cannot_be_set(store: ContextStore, path: str) -> None:
    namespace = path.split(":")[0]
    assert message(store.set, path, 1) == (
        f'"{path}": {namespace}: paths are read-only: the dispatcher records tool outputs with'
        " record(); only var: paths can be set"
    )


def test_vars_property_is_a_copy(store: ContextStore) -> None:
    store.vars["injected"] = 1
    assert "injected" not in store.vars


# -- sys: -------------------------------------------------------------------------------------


def test_sys_paths_read_the_values_given_at_construction(store: ContextStore) -> None:
    assert store.get("sys:org_id") == "acme"
    assert store.get("sys:now") == "2025-01-02T03:04:05Z"
    assert ContextStore(sys={"scopes": ["read"]}).get("sys:scopes.first") == "read"


def test_the_engine_updates_sys_values_and_the_others_are_kept(store: ContextStore) -> None:
    store.update_sys({"user_id": "u-2", "now": "2025-01-02T04:00:00Z"})
    assert store.get("sys:user_id") == "u-2"
    assert store.get("sys:org_id") == "acme"
    with pytest.raises(PathError, match="sys is read-only"):
        store.set("sys:user_id", "u-3")


def test_missing_sys_key_lists_the_sys_keys(store: ContextStore) -> None:
    with pytest.raises(PathError) as info:
        store.get("sys:org")
    assert (
        str(info.value) == '"sys:org": no sys key "org"; sys keys: now, org_id, session_id, user_id'
    )
    assert info.value.segment == "org"


def test_sys_tail_error_names_the_segment(store: ContextStore) -> None:
    assert message(store.get, "sys:now.x") == (
        '"sys:now.x": at ".x": cannot read key "x" of a str (\'2025-01-02T03:04:05Z\')'
    )


# -- tool: and call: --------------------------------------------------------------------------


def test_tool_path_reads_the_last_output_of_the_tool_this_turn(store: ContextStore) -> None:
    assert store.get("tool:orders.lookup.total") == 4
    assert store.get("tool:orders.lookup.items[0].sku") == "B"
    assert store.get("tool:search") == ["hit"]


def test_tool_brackets_read_all_outputs_in_recording_order(store: ContextStore) -> None:
    assert store.get("tool:orders.lookup[]") == [
        {"items": [{"sku": "A"}], "total": 3},
        {"items": [{"sku": "B"}, {"sku": "C"}], "total": 4},
    ]
    assert store.get("tool:orders.lookup[][-1].total") == 4
    assert store.get("tool:orders.lookup[][0].items.first.sku") == "A"
    assert store.get("tool:orders.lookup[][*].items[*].sku") == ["A", "B", "C"]


def test_tool_name_is_the_longest_recorded_prefix() -> None:
    context = ContextStore()
    context.record("orders", "c1", {"lookup": {"items": "from orders"}})
    assert context.get("tool:orders.lookup.items") == "from orders"
    context.record("orders.lookup", "c2", {"items": "from orders.lookup"})
    assert context.get("tool:orders.lookup.items") == "from orders.lookup"
    context.record("orders.lookup.items", "c3", "whole")
    assert context.get("tool:orders.lookup.items") == "whole"
    assert context.get("tool:orders.lookup[]") == [{"items": "from orders.lookup"}]


def test_brackets_after_an_unrecorded_longer_name_are_not_a_syntax_error() -> None:
    context = ContextStore()
    context.record("a", "c1", {"b": [1]})
    assert message(context.get, "tool:a.b[]") == (
        '"tool:a.b[]": no output of tool "a.b" was recorded this turn; tools recorded this turn: a'
    )
    assert context.get("tool:a.b[]", default="none") == "none"


def test_missing_tool_output_lists_the_tools_recorded(store: ContextStore) -> None:
    with pytest.raises(PathError) as info:
        store.get("tool:orders.find.items[0]")
    assert str(info.value) == (
        '"tool:orders.find.items[0]": no output of tool "orders.find.items" (nor "orders.find",'
        ' "orders") was recorded this turn; tools recorded this turn: orders.lookup, search'
    )
    assert info.value.segment == "orders.find.items"
    assert message(ContextStore().get, "tool:search") == (
        '"tool:search": no output of tool "search" was recorded this turn; tools recorded this'
        " turn: none"
    )


def test_tool_tail_error_names_the_segment_and_the_element(store: ContextStore) -> None:
    assert message(store.get, "tool:orders.lookup.items[2]") == (
        '"tool:orders.lookup.items[2]": at "[2]": index 2 is out of range for a list of 2 items'
    )
    assert message(store.get, "tool:orders.lookup[][*].totl") == (
        '"tool:orders.lookup[][*].totl": at ".totl" in tool:orders.lookup[][0]: no key "totl"'
        " in an object with keys: items, total"
    )
    assert message(store.get, "tool:orders.lookup.items[*].qty") == (
        '"tool:orders.lookup.items[*].qty": at ".qty" in tool:orders.lookup.items[0]: no key'
        ' "qty" in an object with keys: sku'
    )


def test_call_path_reads_one_call_output(store: ContextStore) -> None:
    assert store.get("call:c1.total") == 3
    assert store.get("call:c3[0]") == "hit"


def test_missing_call_lists_the_calls_recorded(store: ContextStore) -> None:
    with pytest.raises(PathError) as info:
        store.get("call:c9")
    assert str(info.value) == (
        '"call:c9": no output of tool call "c9" was recorded this turn; calls recorded this'
        " turn: c1, c2, c3"
    )
    assert info.value.segment == "c9"


def test_call_tail_error_names_the_element(store: ContextStore) -> None:
    assert message(store.get, "call:c2.items[*].qty") == (
        '"call:c2.items[*].qty": at ".qty" in call:c2.items[0]: no key "qty" in an object with'
        " keys: sku"
    )


def test_recording_a_call_id_again_replaces_its_output_and_makes_it_newest(
    store: ContextStore,
) -> None:
    before = store.nbytes
    store.record("orders.lookup", "c1", {"total": 30})
    assert store.get("call:c1") == {"total": 30}
    assert store.get("tool:orders.lookup[][*].total") == [4, 30]
    assert store.nbytes == before - size({"items": [{"sku": "A"}], "total": 3}) + size(
        {"total": 30}
    )
    store.record("search", "c2", ["moved"])
    assert store.get("tool:orders.lookup[]") == [{"total": 30}]
    assert store.get("tool:search[]") == [["hit"], ["moved"]]


def test_recording_a_call_as_the_only_output_of_its_tool_again_keeps_it(
    store: ContextStore,
) -> None:
    store.record("search", "c3", ["again"])
    assert store.get("tool:search[]") == [["again"]]


def test_new_turn_forgets_tool_and_call_outputs_but_keeps_vars(store: ContextStore) -> None:
    store.new_turn()
    assert store.get("tool:orders.lookup", None) is None
    assert store.get("call:c1", None) is None
    assert store.get("var:cart.total") == 6
    assert store.nbytes == size({"items": [1, 2, 3], "total": 6})
    assert store.dump()["turn"] == []


def test_record_sizes_a_value_json_cannot_represent_as_its_str() -> None:
    context = ContextStore()
    thing = Empty()
    context.record("make", "c1", thing)
    assert context.get("tool:make") is thing
    assert context.nbytes == len(json.dumps(str(thing)))
    assert context.dump()["turn"][0]["output"] == str(thing)


class Broken(BaseModel):
    x: int

    @field_serializer("x")
    def explode(self, value: int) -> int:
        raise ValueError("boom")


def test_record_refuses_an_output_that_cannot_be_serialised() -> None:
    context = ContextStore()
    assert message(context.record, "t", "c1", Broken(x=1)) == (
        '"call:c1": the output of tool "t" cannot be stored: Error serializing to JSON:'
        " PydanticSerializationError: Error calling function `explode`: ValueError: boom"
    )
    assert context.nbytes == 0
    assert context.get("call:c1", None) is None


def test_record_keeps_an_output_with_a_circular_reference() -> None:
    loop: list[Any] = []
    loop.append(loop)
    context = ContextStore()
    context.record("t", "c1", loop)
    assert context.get("call:c1[0][0]") is loop


# -- size cap ---------------------------------------------------------------------------------


def test_nbytes_is_the_json_length_of_everything_held() -> None:
    context = ContextStore(vars={"a": {"b": 1}})
    context.record("t", "c1", [1, 2, 3])
    assert context.nbytes == size({"b": 1}) + size([1, 2, 3])


def test_over_the_cap_the_oldest_outputs_of_the_turn_are_dropped_first() -> None:
    context = ContextStore(max_bytes=100)
    context.record("search", "c1", "a" * 28)  # 30 bytes each
    context.record("fetch", "c2", "b" * 28)
    context.record("search", "c3", "c" * 28)
    context.record("fetch", "c4", "d" * 28)  # 120 > 100: c1 goes
    assert context.nbytes == 90
    assert context.get("tool:search[]") == ["c" * 28]
    assert context.get("tool:fetch[]") == ["b" * 28, "d" * 28]
    assert context.get("call:c1", None) is None
    assert [entry["call_id"] for entry in context.dump()["turn"]] == ["c2", "c3", "c4"]
    context.record("search", "c5", "e" * 58)  # 150: c2 and c3 go
    assert context.get("tool:fetch[]") == ["d" * 28]
    assert context.get("tool:search[]") == ["e" * 58]
    assert context.nbytes == 90


def test_reading_a_dropped_output_says_it_was_dropped() -> None:
    context = ContextStore(max_bytes=50)
    context.record("search", "c1", "a" * 40)
    context.record("fetch", "c2", "b" * 40)
    assert message(context.get, "tool:search.x") == (
        '"tool:search.x": the outputs of tool "search" recorded this turn were dropped to keep'
        " the context store under max_bytes=50"
    )
    assert message(context.get, "call:c1") == (
        '"call:c1": the output of tool call "c1" (tool "search") was dropped to keep the context'
        " store under max_bytes=50"
    )
    context.record("search", "c1", "small")  # recorded again: no longer dropped
    assert context.get("call:c1") == "small"
    assert context.get("tool:fetch") == "b" * 40


def test_an_output_bigger_than_the_cap_is_dropped_itself() -> None:
    context = ContextStore(vars={"keep": "v"}, max_bytes=20)
    context.record("huge", "c1", "x" * 100)
    assert context.get("tool:huge", None) is None
    assert context.vars == {"keep": "v"}
    assert context.nbytes == 3


def test_setting_a_variable_drops_turn_outputs_to_fit() -> None:
    context = ContextStore(max_bytes=100)
    context.record("t", "c1", "a" * 38)  # 40 bytes
    context.record("t", "c2", "b" * 38)
    context.set("var:notes", "n" * 28)  # 30: 110 > 100, c1 goes
    assert context.get("tool:t[]") == ["b" * 38]
    assert context.nbytes == 70


def test_a_variable_over_the_cap_is_refused_and_the_store_is_unchanged() -> None:
    context = ContextStore(vars={"small": "s" * 8}, max_bytes=100)
    context.record("t", "c1", "o" * 8)
    before = context.dump()
    with pytest.raises(ContextFullError) as info:
        context.set("var:big", "b" * 98)
    assert str(info.value) == (
        '"var:big": variable "big" would take 100 bytes, bringing the variables to 110 bytes,'
        " over the context store's cap of max_bytes=100. Keep less in variables or raise"
        " max_bytes"
    )
    assert info.value.segment == "big"
    assert info.value.path == "var:big"
    assert context.dump() == before
    assert context.nbytes == 20


def test_a_nested_write_over_the_cap_leaves_the_variable_unchanged() -> None:
    context = ContextStore(vars={"cart": {"items": []}}, max_bytes=50)
    with pytest.raises(ContextFullError):
        context.set("var:cart.items", ["x" * 60])
    with pytest.raises(ContextFullError):
        context.set("var:cart.new.deep", "x" * 60)
    assert context.vars == {"cart": {"items": []}}


def test_replacing_a_variable_counts_only_its_new_size() -> None:
    context = ContextStore(vars={"a": "x" * 58}, max_bytes=100)  # 60 bytes
    context.set("var:a", "y" * 78)  # 80, not 140
    assert context.nbytes == 80


def test_constructor_refuses_vars_over_the_cap_naming_the_largest() -> None:
    with pytest.raises(ContextFullError) as info:
        ContextStore(vars={"a": "x" * 8, "b b": "y" * 98}, max_bytes=100)
    assert str(info.value) == (
        '"var:["b b"]": the variables take 110 bytes, over the context store\'s cap of'
        ' max_bytes=100; the largest is "b b" (100 bytes). Keep less in variables or raise'
        " max_bytes"
    )
    assert info.value.segment == "b b"


@pytest.mark.parametrize("max_bytes", [0, -1])
def test_max_bytes_must_be_positive(max_bytes: int) -> None:
    with pytest.raises(ConfigError) as info:
        ContextStore(max_bytes=max_bytes)
    assert str(info.value) == (f"ContextStore(max_bytes={max_bytes}): max_bytes must be positive")


# -- dump / load ------------------------------------------------------------------------------


def test_dump_load_round_trips_through_json(store: ContextStore) -> None:
    data = json.loads(json.dumps(store.dump()))
    resumed = ContextStore.load(data, sys={"user_id": "u2"})
    assert resumed.dump() == store.dump()
    assert resumed.vars == store.vars
    assert resumed.get("tool:orders.lookup[][*].total") == [3, 4]
    assert resumed.get("call:c3") == ["hit"]
    assert resumed.get("sys:user_id") == "u2"
    assert resumed.nbytes == store.nbytes


def test_dump_is_json_with_a_schema_version() -> None:
    context = ContextStore(vars={"point": Point(1, 2)})
    context.record("orders.get", "c1", Order(id="o", items=[Item(sku="A", qty=1)]))
    assert context.dump() == {
        "schema_version": 1,
        "vars": {"point": {"x": 1, "y": 2}},
        "turn": [
            {
                "tool": "orders.get",
                "call_id": "c1",
                "output": {"id": "o", "items": [{"sku": "A", "qty": 1}]},
            }
        ],
        "dropped": {},
    }
    resumed = ContextStore.load(context.dump())
    assert resumed.get("tool:orders.get.items[0].sku") == context.get(
        "tool:orders.get.items[0].sku"
    )


def test_load_keeps_what_was_dropped() -> None:
    context = ContextStore(max_bytes=50)
    context.record("search", "c1", "a" * 40)
    context.record("search", "c2", "b" * 40)
    resumed = ContextStore.load(context.dump(), max_bytes=50)
    assert resumed.dump() == context.dump()
    assert "was dropped" in message(resumed.get, "call:c1")


def test_load_with_a_smaller_cap_drops_the_oldest_outputs() -> None:
    context = ContextStore()
    context.record("t", "c1", "a" * 38)
    context.record("t", "c2", "b" * 38)
    resumed = ContextStore.load(context.dump(), max_bytes=50)
    assert resumed.get("tool:t[]") == ["b" * 38]
    assert resumed.dump()["dropped"] == {"c1": "t"}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"vars": {}},
            "cannot load a context store dump with schema_version=None: this handrail reads"
            " version 1",
        ),
        (
            {"schema_version": 2, "vars": {}, "turn": [], "dropped": {}},
            "cannot load a context store dump with schema_version=2: this handrail reads version"
            " 1; upgrade handrail to read it",
        ),
        (
            {"schema_version": "1"},
            "cannot load a context store dump with schema_version='1': this handrail reads"
            " version 1",
        ),
        (
            ["not", "a", "mapping"],
            "cannot load a context store dump with schema_version=None: this handrail reads"
            " version 1",
        ),
    ],
)
def test_load_refuses_an_unknown_or_newer_version(data: Any, expected: str) -> None:
    assert message(ContextStore.load, data, error=UserError) == expected


def test_load_refuses_a_malformed_dump() -> None:
    text = message(
        ContextStore.load, {"schema_version": 1, "vars": [], "turn": [{}]}, error=UserError
    )
    assert text.startswith("not a context store dump: ")
    assert "vars" in text
    assert "turn.0.tool" in text
