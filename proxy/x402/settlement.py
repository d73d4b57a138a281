"""``PAYMENT-RESPONSE`` read strictly: the settlement the upstream reports for a payment."""

from __future__ import annotations

import base64
import binascii
import json

from pydantic import ValidationError
from x402.schemas import SettleResponse

from proxy.x402.challenge import MAX_DEPTH, MAX_HEADER_BYTES, depth
from proxy.x402.refusal import Refused, Why


def read_payment_response(header: str) -> SettleResponse | Refused:
    """The settlement in ``header``, or why it is not one."""
    if len(header) > MAX_HEADER_BYTES:
        return Refused(Why.MALFORMED, "PAYMENT-RESPONSE is oversized")
    try:
        document = json.loads(base64.b64decode(header.strip(), validate=True))
    except (binascii.Error, ValueError, RecursionError):
        return Refused(Why.MALFORMED, "PAYMENT-RESPONSE is not base64-encoded JSON")
    if not isinstance(document, dict) or depth(document) > MAX_DEPTH:
        return Refused(Why.MALFORMED, "PAYMENT-RESPONSE is not a settlement response")
    try:
        return SettleResponse.model_validate(document)
    except ValidationError:
        return Refused(Why.MALFORMED, "PAYMENT-RESPONSE does not have the protocol's fields")
