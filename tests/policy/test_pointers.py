"""JSON pointers read one way (proxy/policy/pointers.py): RFC 6901's own examples, its array
index and nothing looser, and the readers that used to have their own copy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.gate.classify import object_id_from
from proxy.gate.lookup import Inconclusive, interpret_lookup
from proxy.policy.expressions import Pointer
from proxy.policy.expressions import resolve as resolve_expression
from proxy.policy.model import ReconcileLookup
from proxy.policy.pointers import MISSING, array_index, escape, resolve, tokens, unescape

# RFC 6901, section 5
RFC_DOCUMENT: dict[str, Any] = json.loads(
    r"""{
      "foo": ["bar", "baz"],
      "": 0,
      "a/b": 1,
      "c%d": 2,
      "e^f": 3,
      "g|h": 4,
      "i\\j": 5,
      "k\"l": 6,
      " ": 7,
      "m~n": 8
   }"""
)
RFC_EXAMPLES: list[tuple[str, Any]] = [
    ("", RFC_DOCUMENT),
    ("/foo", ["bar", "baz"]),
    ("/foo/0", "bar"),
    ("/", 0),
    ("/a~1b", 1),
    ("/c%d", 2),
    ("/e^f", 3),
    ("/g|h", 4),
    ("/i\\j", 5),
    ('/k"l', 6),
    ("/ ", 7),
    ("/m~0n", 8),
]


@pytest.mark.parametrize(("pointer", "expected"), RFC_EXAMPLES)
def test_the_rfcs_examples(pointer: str, expected: Any) -> None:
    """Every example of RFC 6901 section 5 names what the RFC says it names."""
    assert resolve(RFC_DOCUMENT, pointer) == expected


def test_tilde_one_is_unescaped_before_tilde_zero() -> None:
    """``~01`` is the key ``~1`` (RFC 6901 section 4), never ``/``."""
    assert unescape("~01") == "~1"
    assert resolve({"~1": "tilde-one", "/": "slash"}, "/~01") == "tilde-one"
    assert tokens("/a~1b/m~0n/~01") == ["a/b", "m~n", "~1"]


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("0", 0), ("1", 1), ("10", 10),
        ("01", None), ("00", None), ("-", None), ("-1", None), ("+1", None), ("1.0", None),
        (" 1", None), ("1 ", None), ("", None), ("²", None), ("\uff11", None), ("\u0661", None),
    ],
)  # fmt: skip
def test_an_array_index_is_the_rfcs_and_ascii(token: str, expected: int | None) -> None:
    """Only ``0`` or ASCII digits without a leading zero index an array (str.isdigit accepts
    superscript two, and int() reads a fullwidth or an Arabic-Indic one as 1)."""
    assert array_index(token) == expected


def test_what_names_nothing_is_missing_not_null() -> None:
    """A missing key, a position past the end, a non-index token and a step into a scalar are
    MISSING; a JSON null is None."""
    document = {"a": None, "list": ["x"], "n": 1}
    assert resolve(document, "/a") is None
    for pointer in ("/b", "/list/1", "/list/01", "/list/\uff11", "/list/²", "/n/0", "/a/b"):
        assert resolve(document, pointer) is MISSING, pointer


@given(st.text(max_size=8))
def test_escaping_a_key_and_reading_it_back_is_the_key(key: str) -> None:
    """Any key, escaped as RFC 6901 says, reads back as itself, in an object and as one token."""
    escaped = escape(key)
    assert escaped == key.replace("~", "~0").replace("/", "~1")
    assert unescape(escaped) == key
    assert resolve({key: "value"}, "/" + escaped) == "value"


@pytest.mark.parametrize(("pointer", "expected"), RFC_EXAMPLES[1:])
def test_the_readers_that_had_their_own_copy_agree(pointer: str, expected: Any) -> None:
    """A precondition's pointer and the object id reader read the RFC's examples as the
    helper does."""
    assert resolve_expression(RFC_DOCUMENT, Pointer(pointer)) == expected
    body = json.dumps(RFC_DOCUMENT).encode()
    assert object_id_from(pointer, body) == (expected if isinstance(expected, str) else None)


def test_a_lookup_list_behind_a_non_ascii_digit_is_no_list() -> None:
    """A lookup's ``items`` whose token is ``²`` names no element: the answer is inconclusive
    (it raised ValueError from int())."""
    lookup = ReconcileLookup(path="/v1/x", items="/data/²")
    document = {"data": [[{"metadata": {"operation_id": "op_1"}}]] * 3}
    result = interpret_lookup(lookup, 200, json.dumps(document).encode(), "op_1")
    assert isinstance(result, Inconclusive)
    assert object_id_from("/data/²/0", json.dumps(document).encode()) is None
