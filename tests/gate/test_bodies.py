"""Strict body parsing, canonical serialisation, field lookup and injection
(proxy/gate/bodies.py)."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from proxy.gate.bodies import (
    MAX_JSON_DEPTH,
    BodyRejected,
    ParsedBody,
    form_key_readings,
    inject,
    parse_body,
    parse_form,
    parse_json_object,
    reads_as_field,
    with_value,
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


# --- parse limits: nesting depth, numbers the serialiser would rewrite -----------------------


def nested(depth: int) -> bytes:
    """An object whose value is ``depth - 1`` nested arrays: ``depth`` levels in all."""
    return b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_json_nesting_up_to_the_bound_parses() -> None:
    """A document nested exactly MAX_JSON_DEPTH levels deep (the top object included) parses."""
    assert parse_json_object(nested(MAX_JSON_DEPTH))["a"] is not None


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 30_000])
def test_json_nested_deeper_than_the_bound_is_rejected(depth: int) -> None:
    """Nesting deeper than MAX_JSON_DEPTH is BodyRejected, never a RecursionError."""
    with pytest.raises(BodyRejected, match="nested"):
        parse_json_object(nested(depth))


def test_json_depth_ignores_brackets_inside_strings() -> None:
    """Brackets inside strings (escaped quotes included) do not count as nesting."""
    text = '{"a": "' + "[" * 500 + '\\"' + "{" * 500 + '"}'
    assert parse_json_object(text.encode())["a"].startswith("[[")


@pytest.mark.parametrize(
    "number",
    [
        pytest.param("1e400", id="overflows to infinity"),
        pytest.param("-1e400", id="overflows to minus infinity"),
        pytest.param("1.00000000000000000001", id="more digits than a double keeps"),
        pytest.param("9007199254740993.0", id="float beyond 2**53 rounds"),
        pytest.param("1e-400", id="underflows to zero"),
        pytest.param("0.1000000000000000000000001", id="rounds to 0.1"),
    ],
)
def test_json_numbers_the_serialiser_would_rewrite_are_rejected(number: str) -> None:
    """A number whose parsed float does not serialise back to the same value is refused: what
    leaves would not be what was checked (1e400 would leave as the bare word Infinity)."""
    with pytest.raises(BodyRejected, match="number"):
        parse_json_object(b'{"x": ' + number.encode() + b"}")


@pytest.mark.parametrize(
    ("number", "value"),
    [
        ("0.1", 0.1),
        ("1.5e3", 1500.0),
        ("1E2", 100.0),
        ("-0.0", -0.0),
        ("0.30000000000000004", 0.30000000000000004),
        ("1.7976931348623157e308", 1.7976931348623157e308),
        ("5e-324", 5e-324),
        ("2.50", 2.5),
    ],
)
def test_json_numbers_kept_exactly_are_accepted(number: str, value: float) -> None:
    """A float whose serialisation has the value written (0.1, 1.5e3, 2.50) is accepted."""
    assert parse_json_object(b'{"x": ' + number.encode() + b"}") == {"x": value}


def test_json_serialise_never_writes_a_non_finite_number() -> None:
    """Serialising a document holding infinity raises rather than writing `Infinity`."""
    with pytest.raises(ValueError, match="JSON compliant"):
        ParsedBody(JSON, json={"x": float("inf")}).serialise()


@given(st.binary(max_size=256))
def test_json_parser_only_raises_body_rejected(raw: bytes) -> None:
    """Arbitrary bytes either parse as a JSON object or raise BodyRejected, never another
    exception; what parses serialises and parses back to the same document."""
    try:
        document = parse_json_object(raw)
    except BodyRejected:
        return
    assert parse_json_object(ParsedBody(JSON, json=document).serialise()) == document


JSON_TOKENS = st.sampled_from(
    [
        '{"a":',
        '{"',
        '"',
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        "1e400",
        "1.00000000000000000001",
        "-0",
        "0.1",
        "9007199254740993",
        "true",
        "NaN",
        '"\\ud800"',
        '"\\u0000"',
        "\\",
        " ",
    ]
)


@given(st.lists(JSON_TOKENS | st.text(max_size=3), max_size=40).map("".join))
def test_json_parser_on_json_like_text_only_raises_body_rejected(text: str) -> None:
    """Text assembled from JSON fragments either parses or raises BodyRejected."""
    try:
        document = parse_json_object(text.encode("utf-8", "surrogatepass"))
    except BodyRejected:
        return
    assert parse_json_object(ParsedBody(JSON, json=document).serialise()) == document


@given(st.binary(max_size=256), st.sampled_from([FORM, JSON, NONE]))
def test_parse_body_only_raises_body_rejected(raw: bytes, kind: BodyKind) -> None:
    """Whatever the rule's body kind, any bytes are a parsed body or BodyRejected."""
    content_type = {FORM: FORM_CT, JSON: JSON_CT, NONE: []}[kind]
    with contextlib.suppress(BodyRejected):
        parse_body(kind, content_type, raw)


# --- the approved value replaces the agent's spelling ----------------------------------------


def test_with_value_replaces_a_form_field_in_place() -> None:
    """with_value rewrites one form pair's value, keeping the pair order."""
    body = ParsedBody(FORM, form=(("amount", "5"), ("currency", "USD"), ("x", "1")))
    assert with_value(body, "currency", "usd").form == (
        ("amount", "5"),
        ("currency", "usd"),
        ("x", "1"),
    )


def test_with_value_replaces_a_json_leaf_in_a_copy() -> None:
    """with_value rewrites one JSON leaf in a copy; the checked parse stays as it was."""
    original: dict[str, Any] = {"amount": 5, "money": {"currency": "USD"}}
    replaced = with_value(ParsedBody(JSON, json=original), "/money/currency", "usd")
    assert replaced.json == {"amount": 5, "money": {"currency": "usd"}}
    assert original == {"amount": 5, "money": {"currency": "USD"}}


# --- how bracket parsers read a form key ----------------------------------------------------

INJECTED = "metadata[operation_id]"


@pytest.mark.parametrize(
    "key",
    [
        "metadata[operation_id][]",
        "metadata[operation_id][x]",
        "metadata[operation_id]]",
        "metadata[operation_id]x",
        "metadata[operation_id",
        "metadata]operation_id",
        "[metadata][operation_id]",
        "metadata.operation_id",
        "metadata.operation_id[x]",
        "metadata[[operation_id]]",
        " metadata[operation_id]",
        "metadata[ operation_id ]",
        "metadata[][operation_id]",
        "[metadata]x[operation_id]",
        "[metadata]x.operation_id",
    ],
)
def test_keys_a_bracket_parser_may_read_as_the_injected_field(key: str) -> None:
    """Keys that Rack, qs or PHP may read as (or inside) the injected field are flagged."""
    assert reads_as_field(FORM, key, INJECTED)


@pytest.mark.parametrize(
    "key",
    [
        INJECTED,  # the field itself is compared by value, not flagged as a lookalike
        "metadata[operation_idx]",
        "metadata[order][operation_id]",
        "metadata[note]",
        "metadata[]",
        "metadata",
        "operation_id",
        "metadataoperation_id",
        "xmetadata[operation_id]",
        "meta[data][operation_id]",
    ],
)
def test_keys_no_bracket_parser_reads_as_the_injected_field(key: str) -> None:
    """Other keys, even under the same parent, are not flagged."""
    assert not reads_as_field(FORM, key, INJECTED)


def test_json_pointers_below_the_injected_field_are_flagged() -> None:
    """For JSON, a leaf below the injected pointer (or the pointer itself) reads as it."""
    assert reads_as_field(JSON, "/metadata/operation_id/x", "/metadata/operation_id")
    assert reads_as_field(JSON, "/metadata/operation_id/0", "/metadata/operation_id")
    assert not reads_as_field(JSON, "/metadata/operation_id", "/metadata/operation_id")
    assert not reads_as_field(JSON, "/metadata/operation_idx", "/metadata/operation_id")
    assert not reads_as_field(JSON, "/metadata[operation_id]", "/metadata/operation_id")


# Reference readings of a form key by the common bracket parsers, for the property below. Each
# returns the path of names the parser stores the value under ("" for an array push).


def rack2_path(key: str) -> list[str]:
    """Rack 2 normalize_params: each name is the first run of non-brackets after any brackets;
    ``[]`` pushes onto an array; a trailing ``[`` makes the whole rest one literal name."""
    path: list[str] = []
    name = key
    while True:
        match = re.match(r"[\[\]]*([^\[\]]+)\]*", name)
        if match is None:
            return [*path, ""] if name == "[]" else path
        k, after = match.group(1), name[match.end() :]
        if after == "":
            return [*path, k]
        if after == "[":
            return [*path, name]
        if after == "[]":
            return [*path, k, ""]
        if after.startswith("[]"):
            inner = re.fullmatch(r"\[\]\[([^\[\]]+)\]", after)
            path += [k, ""]
            name = inner.group(1) if inner else after[2:]
            continue
        path.append(k)
        name = after


def rack3_path(key: str) -> list[str]:
    """Rack 3 _normalize_params: the first name ends at a '[' after position 0, then each
    '[name]' (up to the first ']') is one level, '[]' an array; anything else is a literal."""
    path: list[str] = []
    name, depth = key, 0
    while True:
        if depth == 0:
            start = name.find("[", 1)
            k, after = (name[:start], name[start:]) if start > 0 else (name, "")
        elif name.startswith("[]"):
            k, after = "[]", name[2:]
        elif name.startswith("[") and (end := name.find("]", 1)) > 0:
            k, after = name[1:end], name[end + 1 :]
        else:
            k, after = name, ""
        if k == "":
            return []  # Rack stores nothing
        if after == "":
            return [*path, "" if k == "[]" and depth else k]
        if after == "[":
            return [*path, name]
        if after == "[]":
            return [*path, k, ""]
        if after.startswith("[]"):
            inner = after[3:-1]  # x[][inner]: one hash inside the array
            simple = after[2:3] == "[" and after.endswith("]") and inner != ""
            simple = simple and not {"[", "]"} & set(inner)
            path += [k, ""]
            name, depth = (inner if simple else after[2:]), depth + 1
            continue
        path.append(k)
        name, depth = after, depth + 1


def qs_path(key: str, allow_dots: bool) -> list[str]:
    """qs parseKeys (depth 5): the parent before the first '[...]' group without brackets
    inside, then every such group wherever it is, then any remainder as one name."""
    if allow_dots:
        key = re.sub(r"\.([^.\[]+)", r"[\1]", key)
    groups = list(re.finditer(r"\[[^\[\]]*\]", key))
    parent = key[: groups[0].start()] if groups else key
    path = [parent] if parent else []
    path += [g.group(0)[1:-1] for g in groups[:5]]
    if len(groups) > 5:
        path.append(key[groups[5].start() :])
    return path


def php_path(key: str) -> list[str]:
    """PHP's variable registration: leading spaces dropped, the base name up to the first '['
    (with ' ' and '.' made '_'), then '[index]' groups until a character that is not '['."""
    key = key.lstrip(" ")
    start = key.find("[")
    if start < 0 or "]" not in key[start:]:
        return [re.sub(r"[ .\[]", "_", key)]
    path = [re.sub(r"[ .]", "_", key[:start])]
    rest = key[start:]
    while rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            break
        path.append(rest[1:end])
        rest = rest[end + 1 :]
    return path


def readings(key: str) -> list[list[str]]:
    return [
        rack2_path(key),
        rack3_path(key),
        qs_path(key, allow_dots=False),
        qs_path(key, allow_dots=True),
        php_path(key),
    ]


KEY_PARTS = st.sampled_from(
    [
        *("metadata", "operation_id", "x", "meta", "data", "operation", "_id"),
        *("[", "]", "[]", ".", " "),
        *("[metadata]", "[operation_id]", "[x]", ".operation_id", "]operation_id"),
    ]
)
NOISE = st.text(alphabet="[]. x_", max_size=3)
SEPARATORS = st.sampled_from(["[", "]", ".", "][", "]x[", "[ ", "]]", "[[", "].", "[]["]) | NOISE
keys = st.one_of(
    st.lists(KEY_PARTS, min_size=1, max_size=8).map("".join),
    # the two names with bracket, dot and space noise around and between them
    st.tuples(
        st.text(alphabet=" [].", max_size=2),
        st.just("metadata"),
        SEPARATORS,
        st.just("operation_id"),
        st.sampled_from(["]", "", "]x", "]]", "][]"]) | NOISE,
    ).map("".join),
)


@given(keys)
@example(" metadata[operation_id]")  # PHP drops leading spaces
@example("[metadata]x[operation_id]")  # qs skips what lies between groups
@example("metadata]operation_id")  # Rack 2 skips bracket runs
@example("metadata.operation_id")  # qs allowDots
def test_every_parser_reading_of_the_injected_field_is_flagged(key: str) -> None:
    """Whenever one of the reference parsers (Rack 2 and 3, qs with and without dots, PHP)
    stores a key under the injected field's path, the normaliser flags the key."""
    if key == INJECTED:
        return
    if any(path[:2] == ["metadata", "operation_id"] for path in readings(key)):
        assert reads_as_field(FORM, key, INJECTED), readings(key)


@given(st.lists(st.text(alphabet="abcdefgh_", min_size=1, max_size=5), min_size=1, max_size=4))
def test_the_normaliser_reads_plain_bracket_keys_as_every_parser_does(names: list[str]) -> None:
    """For a well-formed key ``a[b][c]`` the normaliser's path is the one every parser reads."""
    key = names[0] + "".join(f"[{name}]" for name in names[1:])
    assert form_key_readings(key) == {tuple(names)}
    assert all(path == names for path in readings(key))


@given(keys, st.sampled_from(["[]", "[x]", "]", "x", "[", ".x", "[operation_id]"]))
def test_anything_written_after_the_injected_field_is_flagged(prefix: str, suffix: str) -> None:
    """The injected field followed by any bracket syntax is flagged, as is a lookalike parent."""
    assert reads_as_field(FORM, INJECTED + suffix, INJECTED)
    if form_key_readings(prefix) == {("metadata",)}:
        assert reads_as_field(FORM, prefix + "[operation_id]" + suffix, INJECTED)


def test_injection_and_rewrites_step_into_array_elements() -> None:
    """A pointer through an array index (PayPal's /purchase_units/0/custom_id) is set in the
    element the body has; a missing element is refused, never created or a crash."""
    from proxy.gate.bodies import inject, with_value
    from proxy.policy.model import BodyKind as Kind

    body = ParsedBody(Kind.JSON, json={"purchase_units": [{"amount": {"currency_code": "usd"}}]})
    injected = inject(body, "/purchase_units/0/custom_id", "op_1")
    assert injected.json == {
        "purchase_units": [{"amount": {"currency_code": "usd"}, "custom_id": "op_1"}]
    }
    rewritten = with_value(body, "/purchase_units/0/amount/currency_code", "USD")
    assert rewritten.json == {"purchase_units": [{"amount": {"currency_code": "USD"}}]}
    assert body.json == {"purchase_units": [{"amount": {"currency_code": "usd"}}]}
    with pytest.raises(BodyRejected):
        inject(ParsedBody(Kind.JSON, json={"purchase_units": []}), "/purchase_units/0/x", "v")
    with pytest.raises(BodyRejected):
        inject(ParsedBody(Kind.JSON, json={"a": [1]}), "/a/0/x", "v")
