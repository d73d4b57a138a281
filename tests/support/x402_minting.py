"""Valid x402 challenges, minted for tests (kept apart from the code that checks them)."""

from __future__ import annotations

import base64
import json
from typing import Any

from tests.support.x402_ledger import NETWORK, TOKEN, TOKEN_NAME, TOKEN_VERSION
from tests.support.x402_server import PAYEE, PRICE

RESOURCE = "http://127.0.0.1:1/report"


def requirement(**changes: Any) -> dict[str, Any]:
    return {
        "scheme": "exact",
        "network": NETWORK,
        "asset": TOKEN,
        "amount": str(PRICE),
        "payTo": PAYEE,
        "maxTimeoutSeconds": 300,
        "extra": {"name": TOKEN_NAME, "version": TOKEN_VERSION},
        **changes,
    }


def challenge(*accepts: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {
        "x402Version": 2,
        "resource": {"url": RESOURCE},
        "accepts": list(accepts) or [requirement()],
        **changes,
    }


def nested(depth: int) -> Any:
    """A JSON object ``depth`` levels deep."""
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def encoded(document: Any) -> str:
    return base64.b64encode(json.dumps(document).encode()).decode()
