"""Signing escalation notices the Standard Webhooks way (https://www.standardwebhooks.com/), so
a receiver can tell opgate's notices from anyone's and refuse replays: headers ``webhook-id``,
``webhook-timestamp`` (Unix seconds) and ``webhook-signature`` = ``v1,`` + base64 of
HMAC-SHA256 over ``{id}.{timestamp}.{body}``, with the secret ``webhook_key``
(``OPGATE_SECRET_WEBHOOK_KEY`` or ``<secrets_dir>/webhook_key``) in the ``whsec_<base64>``
form the standard's libraries take. Pure: the caller gives the clock and the secret."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

# The secret's NAME, not its value.
WEBHOOK_KEY_SECRET = "webhook_key"  # noqa: S105
_PREFIX = "whsec_"


class WebhookKeyInvalid(ValueError):
    """The configured secret is not ``whsec_`` followed by base64."""


def webhook_key(secret: str) -> bytes:
    """The HMAC key a ``whsec_...`` secret stands for."""
    if not secret.startswith(_PREFIX):
        raise WebhookKeyInvalid(f"{WEBHOOK_KEY_SECRET} must be whsec_ followed by base64")
    try:
        key = base64.b64decode(secret[len(_PREFIX) :], validate=True)
    except binascii.Error as exc:
        raise WebhookKeyInvalid(f"{WEBHOOK_KEY_SECRET} is not valid base64") from exc
    if len(key) < 24:  # the standard asks for 24 to 64 random bytes
        raise WebhookKeyInvalid(f"{WEBHOOK_KEY_SECRET} must hold at least 24 bytes")
    return key


def signed_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest).decode("ascii"),
    }
