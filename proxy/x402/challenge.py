"""``PAYMENT-REQUIRED`` (x402 v2) read strictly: a header an upstream controls, so its size,
its base64, its JSON's depth and every amount are bounded before the SDK's model reads it."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic import ValidationError
from x402.schemas import PaymentRequired

from proxy.x402.refusal import Refused, Why

MAX_HEADER_BYTES = 16 * 1024  # a challenge with a handful of requirements is ~1 KiB
MAX_DEPTH = 8  # PaymentRequired nests 4 deep (accepts[].extra.{...}); room for extensions
MAX_REQUIREMENTS = 16
MAX_UINT256_DIGITS = 78  # an EIP-3009 value is a uint256: 2**256 has 78 decimal digits


def read_payment_required(header: str) -> PaymentRequired | Refused:
    """The challenge in ``header``, or why it is not one opgate will read."""
    if len(header) > MAX_HEADER_BYTES:
        return Refused(Why.MALFORMED, f"PAYMENT-REQUIRED is over {MAX_HEADER_BYTES} bytes")
    try:
        raw = base64.b64decode(header.strip(), validate=True)
        document = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):  # RecursionError: json's own limit
        return Refused(Why.MALFORMED, "PAYMENT-REQUIRED is not base64-encoded JSON")
    if depth(document) > MAX_DEPTH:
        return Refused(Why.MALFORMED, f"PAYMENT-REQUIRED nests deeper than {MAX_DEPTH}")
    if not isinstance(document, dict) or document.get("x402Version") != 2:
        return Refused(Why.MALFORMED, "PAYMENT-REQUIRED is not an x402 version 2 challenge")
    try:
        required = PaymentRequired.model_validate(document)
    except ValidationError:
        return Refused(Why.MALFORMED, "PAYMENT-REQUIRED does not have the protocol's fields")
    if not 1 <= len(required.accepts) <= MAX_REQUIREMENTS:
        return Refused(Why.MALFORMED, f"PAYMENT-REQUIRED needs 1 to {MAX_REQUIREMENTS} accepts")
    for requirement in required.accepts:
        amount = requirement.amount
        if not (amount.isascii() and amount.isdigit() and len(amount) <= MAX_UINT256_DIGITS):
            return Refused(Why.MALFORMED, "an amount in PAYMENT-REQUIRED is not a uint256")
        if int(amount) >= 2**256:
            return Refused(Why.MALFORMED, "an amount in PAYMENT-REQUIRED is not a uint256")
    return required


def depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest
