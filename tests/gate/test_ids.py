"""The one grammar of ids (proxy/gate/ids.py): what each kind may be, the prefixes a new
operation id may not take, and the command line's reading of an id."""

from __future__ import annotations

import argparse
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.gate.ids import (
    NEW_OPERATION_ID,
    RESERVED_PREFIXES,
    IdKind,
    id_argument,
    id_rule,
    reserved_prefix,
    valid_id,
    valid_operation_id,
)
from proxy.gate.reasons import REASONS, Reason

PRINTABLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        pytest.param("op_0123abcd", True, id="generated id"),
        pytest.param("a", True, id="one character"),
        pytest.param("~" * 255, True, id="255 printable characters"),
        pytest.param("order-42:refund.1", True, id="punctuation"),
        pytest.param("", False, id="empty"),
        pytest.param("x" * 256, False, id="256 characters"),
        pytest.param("op 1", False, id="space"),
        pytest.param("op\x001", False, id="NUL"),
        pytest.param("op\t1", False, id="tab"),
        pytest.param("op\x7f", False, id="DEL"),
        pytest.param("op\u00e9", False, id="non-ASCII letter"),
        pytest.param("op\udcc3(", False, id="undecodable byte as aiohttp reads it"),
    ],
)
def test_valid_operation_id(value: str, valid: bool) -> None:
    """An operation id (or idempotency key) is 1-255 printable ASCII characters, no space."""
    assert valid_operation_id(value) is valid


@pytest.mark.parametrize(
    ("kind", "value", "valid"),
    [
        pytest.param(IdKind.PROPOSAL, "prop_0123abcd", True, id="proposal"),
        pytest.param(IdKind.PROPOSAL, "op_0123abcd", False, id="proposal, an operation's prefix"),
        pytest.param(IdKind.PROPOSAL, "prop_", False, id="proposal, the prefix alone"),
        pytest.param(IdKind.PROPOSAL, "PROP_x", False, id="proposal, prefix in capitals"),
        pytest.param(IdKind.PROPOSAL, "prop_" + "x" * 251, False, id="proposal, 256 characters"),
        pytest.param(IdKind.PROPOSAL, "prop_a\x00", False, id="proposal, NUL"),
        pytest.param(IdKind.TASK, "prop_refund_42", True, id="task, either kind's spelling"),
        pytest.param(IdKind.MANDATE, "A" * 43, True, id="mandate digest"),
        pytest.param(IdKind.MANDATE, "A" * 42 + "=", False, id="mandate digest, padding"),
        pytest.param(IdKind.MANDATE, "A" * 44, False, id="mandate digest, 44"),
        pytest.param(IdKind.NONCE, "n-_0" * 10, True, id="nonce"),
        pytest.param(IdKind.NONCE, "a.b", False, id="nonce, not base64url"),
        pytest.param(IdKind.NONCE, "x" * 257, False, id="nonce, 257"),
        pytest.param(IdKind.AUDIT_STREAM, "requests/host:1", True, id="audit stream"),
        pytest.param(IdKind.AUDIT_STREAM, "requests/\u202e", False, id="audit stream, bidi"),
        pytest.param(IdKind.OPERATION, None, False, id="not a string"),
        pytest.param(IdKind.OPERATION, 42, False, id="a number"),
    ],
)
def test_each_kind_has_its_grammar(kind: IdKind, value: object, valid: bool) -> None:
    """Each kind of id is read by its own grammar; what is not a str is no id."""
    assert valid_id(value, kind) is valid


@given(st.text(min_size=1, max_size=300))
def test_an_id_with_any_character_outside_printable_ascii_is_no_id_of_any_kind(
    value: str,
) -> None:
    """No kind admits a NUL, a space, a control, a non-ASCII or an undecodable character, or
    more than 512 characters: nothing PostgreSQL refuses or a reader could read two ways."""
    printable = all("\x21" <= c <= "\x7e" for c in value)
    for kind in IdKind:
        if valid_id(value, kind):
            assert printable, (kind, value)
            assert len(value) <= 512, (kind, value)


@given(st.text(PRINTABLE, min_size=1, max_size=255))
def test_any_printable_ascii_up_to_255_is_an_operation_id(value: str) -> None:
    """Every id the gate could have been handed is one it can read back (no id it stored is
    refused at another entry point)."""
    assert valid_operation_id(value)
    assert valid_id(value, IdKind.TASK)
    assert valid_id(value, IdKind.IDEMPOTENCY_KEY)


@given(st.from_regex(NEW_OPERATION_ID, fullmatch=True))
def test_a_new_operation_id_is_an_operation_id(value: str) -> None:
    """What an operator may choose at creation is a strict subset of what is read."""
    assert valid_operation_id(value)


@pytest.mark.parametrize(
    ("operation_id", "reserved"),
    [
        pytest.param("prop_refund_42", True, id="a proposal's"),
        pytest.param("PROP_refund_42", True, id="a proposal's, in capitals"),
        pytest.param("ap2_0123", True, id="a mandate operation's"),
        pytest.param("op_refund_42", False, id="an operation's own"),
        pytest.param("proposal-42", False, id="a word that starts alike"),
        pytest.param("refund-prop_42", False, id="the prefix inside"),
    ],
)
def test_a_new_operation_id_may_not_take_another_kinds_prefix(
    operation_id: str, reserved: bool
) -> None:
    """prop_ and ap2_ (any case) are other kinds' ids: refused with a sentence naming the
    prefix; any other id is not."""
    said = reserved_prefix(operation_id)
    assert (said is not None) is reserved
    if said is not None:
        assert any(prefix in said for prefix in RESERVED_PREFIXES)


def test_the_reserved_code_names_every_reserved_prefix() -> None:
    """The next action of operation_id_reserved names each prefix the grammar reserves."""
    action = REASONS[Reason.OPERATION_ID_RESERVED].next_action
    assert all(prefix in action for prefix in RESERVED_PREFIXES)


def test_the_rule_of_a_kind_never_holds_the_value() -> None:
    """A refusal's detail says what the kind is, not what was sent (it may be anything)."""
    for kind in IdKind:
        assert id_rule(kind)
        assert "\x00" not in id_rule(kind)


def test_the_command_line_refuses_an_id_no_operation_can_have() -> None:
    """An id argument that no id of its kind can be exits 2 naming the kind, before anything
    is sent; a valid one is passed on as typed."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("operation_id", type=id_argument(IdKind.OPERATION))
    assert parser.parse_args(["op_1/..?#%"]).operation_id == "op_1/..?#%"
    for bad in ("op \u00e9", "x" * 256, ""):
        with pytest.raises(argparse.ArgumentError, match=re.escape("invalid operation id")):
            parser.parse_args([bad])
