"""Strict body parsing, canonical serialisation, field lookup and injection
(proxy/gate/bodies.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.gate.bodies import (
    BodyRejected,
    ParsedBody,
    inject,
    parse_body,
    parse_form,
    parse_json_object,
)
from proxy.policy.model import BodyKind

FORM = BodyKind.FORM
JSON = BodyKind.JSON
NONE = BodyKind.NONE
FORM_CT = ["application/x-www-form-urlencoded"]
JSON_CT = ["application/json"]


# --- accepted bodies ---------------------------------------------------------------------------


def test_form_decodes_plus_and_percent_escapes() -> None:
    """A form body decodes '+' as space and %XX as UTF-8 bytes, keeping pair order."""
    assert parse_form(b"b=%2B+x&a=caf%C3%A9&c=") == (("b", "+ x"), ("a", "café"), ("c", ""))


def test_empty_form_body_has_no_pairs() -> None:
    """An empty form body is zero pairs, not an error."""
    assert parse_form(b"") == ()


def test_parse_body_accepts_charset_utf8_parameter() -> None:
    """`charset=utf-8` (any case, quoted or not) is the one Content-Type parameter accepted."""
    for content_type in (
        "application/x-www-form-urlencoded; charset=utf-8",
        'Application/X-WWW-Form-URLEncoded;charset="UTF-8"',
    ):
        assert parse_body(FORM, [content_type], b"a=1").form == (("a", "1"),)


def test_parse_body_without_content_type_accepts_an_empty_body() -> None:
    """A bodiless POST needs no Content-Type and parses as an empty body of the rule's kind."""
    assert parse_body(FORM, [], b"") == ParsedBody(FORM)


def test_parse_body_none_kind_without_body() -> None:
    """A `body: none` rule accepts an empty body and serialises to nothing."""
    parsed = parse_body(NONE, [], b"")
    assert parsed == ParsedBody(NONE)
    assert parsed.serialise() == b""
    assert parsed.fields() == {}
    assert parsed.media_type is None


def test_parse_body_json() -> None:
    """A JSON object with the JSON media type parses to the same dict json.loads gives."""
    raw = b'{"amount": 100, "meta": {"k": [1, 2.5, true, null, "s"]}}'
    assert parse_body(JSON, JSON_CT, raw).json == json.loads(raw)


def test_json_accepts_the_largest_safe_integers() -> None:
    """+-(2**53 - 1) are the largest integers every JSON parser reads alike, so they pass."""
    assert parse_json_object(b'{"a": 9007199254740991, "b": -9007199254740991}') == {
        "a": 2**53 - 1,
        "b": -(2**53 - 1),
    }


def test_form_serialise_is_canonical() -> None:
    """Form serialisation percent-encodes everything but unreserved characters, space as %20."""
    body = ParsedBody(FORM, form=(("metadata[k]", "a b+c/é"), ("x", "")))
    assert body.serialise() == b"metadata%5Bk%5D=a%20b%2Bc%2F%C3%A9&x="
    assert body.media_type == "application/x-www-form-urlencoded"


def test_json_serialise_is_compact_utf8() -> None:
    """JSON serialisation has no whitespace and writes non-ASCII as UTF-8, not \\u escapes."""
    body = ParsedBody(JSON, json={"a": "é", "b": [1, {"c": None}]})
    assert body.serialise() == '{"a":"é","b":[1,{"c":null}]}'.encode()
    assert body.media_type == "application/json"


# --- rejected bodies ---------------------------------------------------------------------------


REJECTED: list[tuple[str, BodyKind, list[str], bytes, bool]] = [
    # (scenario, kind, content types, raw, is a content-type problem)
    ("form duplicate key", FORM, FORM_CT, b"a=1&a=1", False),
    ("form duplicate key after decoding", FORM, FORM_CT, b"a=1&%61=2", False),
    ("form semicolon separator", FORM, FORM_CT, b"a=1;b=2", False),
    ("form pair without '='", FORM, FORM_CT, b"a", False),
    ("form empty pair", FORM, FORM_CT, b"a=1&&b=2", False),
    ("form trailing '&'", FORM, FORM_CT, b"a=1&", False),
    ("form empty key", FORM, FORM_CT, b"=1", False),
    ("form bad escape %zz", FORM, FORM_CT, b"a=%zz", False),
    ("form truncated escape", FORM, FORM_CT, b"a=%4", False),
    ("form double percent", FORM, FORM_CT, b"a=%%41", False),
    ("form %ff is not UTF-8", FORM, FORM_CT, b"a=%ff", False),
    ("form raw non-ASCII bytes", FORM, FORM_CT, "a=é".encode(), False),
    ("form raw space", FORM, FORM_CT, b"a=1 2", False),
    ("form raw control byte", FORM, FORM_CT, b"a=1\n", False),
    ("json duplicate key", JSON, JSON_CT, b'{"a": 1, "a": 1}', False),
    ("json nested duplicate key", JSON, JSON_CT, b'{"m": {"k": 1, "k": 2}}', False),
    ("json duplicate key inside array", JSON, JSON_CT, b'{"l": [{"k": 1, "k": 2}]}', False),
    ("json NaN", JSON, JSON_CT, b'{"a": NaN}', False),
    ("json Infinity", JSON, JSON_CT, b'{"a": Infinity}', False),
    ("json -Infinity", JSON, JSON_CT, b'{"a": -Infinity}', False),
    ("json 2**53", JSON, JSON_CT, b'{"a": 9007199254740992}', False),
    ("json -(2**53)", JSON, JSON_CT, b'{"a": -9007199254740992}', False),
    ("json byte-order mark", JSON, JSON_CT, b'\xef\xbb\xbf{"a": 1}', False),
    ("json lone surrogate value", JSON, JSON_CT, b'{"a": "\\ud800"}', False),
    ("json lone surrogate key", JSON, JSON_CT, b'{"\\udfff": 1}', False),
    ("json lone surrogate in array", JSON, JSON_CT, b'{"a": ["\\ud800"]}', False),
    ("json top-level array", JSON, JSON_CT, b"[1, 2]", False),
    ("json top-level string", JSON, JSON_CT, b'"a"', False),
    ("json not UTF-8", JSON, JSON_CT, b'{"a": "\xff"}', False),
    ("json syntax error", JSON, JSON_CT, b'{"a": 1,}', False),
    ("json trailing data", JSON, JSON_CT, b'{"a": 1} {}', False),
    ("json empty body", JSON, JSON_CT, b"", False),
    ("form body sent as JSON", FORM, JSON_CT, b"a=1", True),
    ("JSON body sent as form", JSON, FORM_CT, b'{"a": 1}', True),
    ("multipart content type", FORM, ["multipart/form-data; boundary=x"], b"a=1", True),
    ("two Content-Type headers", FORM, [*FORM_CT, *FORM_CT], b"a=1", True),
    ("charset=latin-1", FORM, ["application/x-www-form-urlencoded; charset=latin-1"], b"a=1", True),
    ("unknown parameter", JSON, ["application/json; foo=bar"], b"{}", True),
    ("body without Content-Type", FORM, [], b"a=1", True),
    ("empty Content-Type", FORM, [""], b"a=1", True),
    ("body on kind none", NONE, [], b"a=1", False),
    ("body on kind none with a type", NONE, FORM_CT, b"a=1", False),
]


@pytest.mark.parametrize(
    ("kind", "content_types", "raw", "content_type_problem"),
    [pytest.param(*case[1:], id=case[0]) for case in REJECTED],
)
def test_ambiguous_bodies_are_rejected(
    kind: BodyKind, content_types: list[str], raw: bytes, content_type_problem: bool
) -> None:
    """Every body (or content type) that could be read two ways raises BodyRejected."""
    with pytest.raises(BodyRejected) as info:
        parse_body(kind, content_types, raw)
    assert info.value.content_type is content_type_problem


# --- fields ------------------------------------------------------------------------------------


def test_form_fields_are_the_keys_as_sent() -> None:
    """Form fields are addressed by their literal (bracketed) keys."""
    body = ParsedBody(FORM, form=(("metadata[operation_id]", "op_1"), ("amount", "5")))
    assert body.fields() == {"metadata[operation_id]": "op_1", "amount": "5"}


def test_json_fields_are_leaves_by_json_pointer() -> None:
    """JSON fields are every leaf by JSON pointer, '~' and '/' escaped, empty containers leaves."""
    body = ParsedBody(
        JSON,
        json={"a": {"b": 1}, "l": [True, {"c": None}], "e": {}, "z": [], "x/y~": "s"},
    )
    assert body.fields() == {
        "/a/b": 1,
        "/l/0": True,
        "/l/1/c": None,
        "/e": {},
        "/z": [],
        "/x~1y~0": "s",
    }


def test_empty_json_object_has_no_fields() -> None:
    """An empty JSON document has no fields (not a field named '' holding {})."""
    assert ParsedBody(JSON, json={}).fields() == {}


# --- inject ------------------------------------------------------------------------------------


def test_inject_form_appends_the_field() -> None:
    """Injecting into a form appends the pair after the agent's pairs."""
    body = ParsedBody(FORM, form=(("amount", "5"),))
    injected = inject(body, "metadata[operation_id]", "op_1")
    assert injected.form == (("amount", "5"), ("metadata[operation_id]", "op_1"))
    assert injected.serialise() == b"amount=5&metadata%5Boperation_id%5D=op_1"


def test_inject_form_keeps_an_identical_agent_value() -> None:
    """If the agent already sent the injected value, the body is unchanged (no duplicate key)."""
    body = ParsedBody(FORM, form=(("metadata[operation_id]", "op_1"), ("amount", "5")))
    assert inject(body, "metadata[operation_id]", "op_1") is body


def test_inject_form_refuses_a_different_agent_value() -> None:
    """An agent-set injected field with another value is refused, never overwritten."""
    body = ParsedBody(FORM, form=(("metadata[operation_id]", "op_2"),))
    with pytest.raises(BodyRejected):
        inject(body, "metadata[operation_id]", "op_1")


def test_inject_json_creates_parents_and_leaves_the_original_intact() -> None:
    """JSON injection creates missing parent objects in a copy; the checked parse is unchanged."""
    original: dict[str, Any] = {"amount": 5, "metadata": {"k": "v"}}
    body = ParsedBody(JSON, json=original)
    injected = inject(body, "/metadata/operation_id", "op_1")
    assert injected.json == {"amount": 5, "metadata": {"k": "v", "operation_id": "op_1"}}
    assert original == {"amount": 5, "metadata": {"k": "v"}}
    assert inject(ParsedBody(JSON, json={}), "/a~1b/c~0d", "x").json == {"a/b": {"c~d": "x"}}


def test_inject_json_accepts_an_identical_agent_value() -> None:
    """An agent-set JSON field equal to the injected value is accepted."""
    body = ParsedBody(JSON, json={"metadata": {"operation_id": "op_1"}})
    assert inject(body, "/metadata/operation_id", "op_1").json == body.json


@pytest.mark.parametrize(
    "document",
    [
        pytest.param({"metadata": {"operation_id": "op_2"}}, id="different value"),
        pytest.param({"metadata": {"operation_id": 1}}, id="non-string value"),
        pytest.param({"metadata": "flat"}, id="parent is a string"),
        pytest.param({"metadata": ["op_1"]}, id="parent is an array"),
    ],
)
def test_inject_json_refuses_conflicts(document: dict[str, Any]) -> None:
    """JSON injection refuses a different agent value or a parent that is not an object."""
    with pytest.raises(BodyRejected):
        inject(ParsedBody(JSON, json=document), "/metadata/operation_id", "op_1")


def test_inject_into_no_body_is_a_no_op() -> None:
    """A `body: none` request has nothing to inject into and is returned as is."""
    body = ParsedBody(NONE)
    assert inject(body, "metadata[operation_id]", "op_1") is body


# --- properties --------------------------------------------------------------------------------


form_pairs = st.lists(
    st.tuples(st.text(min_size=1), st.text()), unique_by=lambda pair: pair[0]
).map(tuple)


@given(form_pairs)
def test_form_serialise_parse_round_trips(pairs: tuple[tuple[str, str], ...]) -> None:
    """Any unicode form with unique non-empty keys parses back from its serialisation."""
    raw = ParsedBody(FORM, form=pairs).serialise()
    assert parse_form(raw) == pairs
    assert parse_body(FORM, FORM_CT, raw).form == pairs


SAFE_INT = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | SAFE_INT
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=6)


@given(json_objects)
def test_json_serialise_parse_round_trips(document: dict[str, Any]) -> None:
    """Any JSON object of safe ints and finite floats parses back from its serialisation."""
    raw = ParsedBody(JSON, json=document).serialise()
    assert parse_json_object(raw) == document
    assert parse_body(JSON, JSON_CT, raw).json == document


@given(json_objects)
def test_json_serialisation_is_a_fixed_point(document: dict[str, Any]) -> None:
    """Re-serialising a parsed canonical serialisation yields the same bytes."""
    raw = ParsedBody(JSON, json=document).serialise()
    assert ParsedBody(JSON, json=parse_json_object(raw)).serialise() == raw


@given(st.binary(max_size=64))
def test_form_parser_only_raises_body_rejected(raw: bytes) -> None:
    """Arbitrary bytes either parse as a form or raise BodyRejected, never another exception."""
    try:
        pairs = parse_form(raw)
    except BodyRejected:
        return
    assert parse_form(ParsedBody(FORM, form=pairs).serialise()) == pairs
