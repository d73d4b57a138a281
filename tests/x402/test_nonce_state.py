"""What a nonce's state proves, and the eth_call that reads it: a fixed selector (a known
answer), every malformed node answer read as no answer, and the three verdicts at their edges."""

from __future__ import annotations

from typing import Any

import pytest
from eth_utils import keccak

from proxy.x402.nonce_state import (
    AUTHORIZATION_STATE_SELECTOR,
    NonceVerdict,
    authorization_state_call,
    judge,
    read_nonce_used,
)

PAYER = "0x" + "Ab" * 20
NONCE = "0x" + "cd" * 32


def test_the_selector_is_authorization_states() -> None:
    """keccak256("authorizationState(address,bytes32)")[:4], and the call's data layout."""
    assert keccak(text="authorizationState(address,bytes32)")[:4].hex() == (
        AUTHORIZATION_STATE_SELECTOR
    )
    call = authorization_state_call("0x" + "11" * 20, PAYER, NONCE)
    data = call["params"][0]["data"]
    assert data == "0x" + AUTHORIZATION_STATE_SELECTOR + "0" * 24 + "ab" * 20 + "cd" * 32
    assert (call["method"], call["params"][1]) == ("eth_call", "latest")


ANSWERS: dict[str, tuple[Any, bool | None]] = {
    "used": ({"result": "0x" + "0" * 63 + "1"}, True),
    "unused": ({"result": "0x" + "0" * 64}, False),
    "an error": ({"error": {"code": -32000}, "result": "0x" + "0" * 64}, None),
    "not a bool": ({"result": "0x" + "0" * 63 + "2"}, None),
    "short": ({"result": "0x01"}, None),
    "not hex": ({"result": "0x" + "z" * 64}, None),
    "a number": ({"result": 1}, None),
    "no result": ({}, None),
    "a list": ([{"result": "0x" + "0" * 64}], None),
}


@pytest.mark.parametrize("answer", ANSWERS.keys())
def test_a_node_answer_reads_as_used_unused_or_no_answer(answer: str) -> None:
    """Only a 32-byte 0 or 1 is an answer; anything else judges nothing."""
    given, read = ANSWERS[answer]
    assert read_nonce_used(given) is read


def test_the_verdicts_at_their_edges() -> None:
    """Used is paid whenever read; unused is unpaid only strictly after validBefore + margin."""
    assert judge(True, 1_000, 5_000, 0) is NonceVerdict.PAID
    assert judge(False, 1_000, 1_120, 120) is NonceVerdict.OPEN
    assert judge(False, 1_000, 1_121, 120) is NonceVerdict.NOT_PAID
    assert judge(False, 1_000, 999, 0) is NonceVerdict.OPEN
