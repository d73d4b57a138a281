"""What an EIP-3009 nonce's state proves about a payment whose outcome is unknown, and the
JSON-RPC ``eth_call`` that reads it (``authorizationState(authorizer, nonce)``, a view of
every EIP-3009 token). Pure: proxy/recovery/x402_state.py asks the chain and acts.

- the nonce is used: the authorization (the only one with that nonce the token can accept)
  was settled: the operation was paid;
- the nonce is unused after the authorization's ``validBefore`` (and a margin for the chain's
  clock and a lagging node): it can never settle: provably not paid;
- anything else (unused and still valid): not known yet, it may still be settled.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

# keccak256("authorizationState(address,bytes32)")[:4]; a known answer in the tests
AUTHORIZATION_STATE_SELECTOR = "e94a0102"
_WORD = re.compile(r"0x[0-9a-fA-F]{64}")


class NonceVerdict(StrEnum):
    PAID = "paid"  # the nonce is used
    NOT_PAID = "not_paid"  # unused, and its authorization expired: it can never be used
    OPEN = "open"  # unused, and its authorization may still be settled


def authorization_state_call(token: str, payer: str, nonce: str, request_id: int = 1) -> Any:
    """The JSON-RPC request reading the token's state of ``nonce`` for ``payer``."""
    data = (
        "0x"
        + AUTHORIZATION_STATE_SELECTOR
        + payer.lower().removeprefix("0x").rjust(64, "0")
        + nonce.lower().removeprefix("0x")
    )
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "eth_call",
        "params": [{"to": token, "data": data}, "latest"],
    }


def read_nonce_used(answer: Any) -> bool | None:
    """The ``eth_call``'s boolean, or None if the answer is not one (an error, any other form)."""
    if not isinstance(answer, dict) or "error" in answer:
        return None
    result = answer.get("result")
    if not isinstance(result, str) or not _WORD.fullmatch(result):
        return None
    value = int(result, 16)
    return None if value > 1 else value == 1


def judge(used: bool, valid_before: int, now: int, margin: int) -> NonceVerdict:
    """What the nonce's state, read after ``now`` (unix seconds), proves. ``margin``: seconds
    after validBefore before an unused nonce is taken as never usable (block times are the
    validator's clock, and a node may answer from a block some seconds old)."""
    if used:
        return NonceVerdict.PAID
    if now > valid_before + margin:
        return NonceVerdict.NOT_PAID
    return NonceVerdict.OPEN
