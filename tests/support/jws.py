"""Compact ES256 tokens signed over exactly the text a test spells, with RFC 7515 Appendix A.3's
P-256 key: a token that breaks a rule of proxy/transparency/jws.py (a padded segment, a header
member named twice) still carries a valid signature, so only the rule can refuse it."""

from __future__ import annotations

import base64
import json
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

# RFC 7515 Appendix A.3.1: the example's elliptic curve key, typed in from the RFC
RFC_JWK = {
    "kty": "EC",
    "crv": "P-256",
    "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
    "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0",
    "d": "jpsQnnGQmL-YBIffH1136cspYG6-0iY7X1fCE9-E9LI",
}
RFC_PUBLIC_JWK = {k: v for k, v in RFC_JWK.items() if k != "d"}
# RFC 7515 Appendix A.3.1: the example's JWS, in its three segments
RFC_HEADER = "eyJhbGciOiJFUzI1NiJ9"
RFC_PAYLOAD = (
    "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ"
)
RFC_SIGNATURE = (
    "DtEhU3ljbEg8L38VWAfUAqOyKAM6-Xx-F4GawxaepmXFCgfTjDxw5djxLa8ISlSApmWQxfKTUJqPP3-Kg6NU1Q"
)
RFC_JWS = f"{RFC_HEADER}.{RFC_PAYLOAD}.{RFC_SIGNATURE}"
# RFC 7515 Appendix A.1.1: the payload's octets (the JSON with CRLF line breaks)
RFC_PAYLOAD_BYTES = b'{"iss":"joe",\r\n "exp":1300819380,\r\n "http://example.com/is_root":true}'


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _private_key() -> ec.EllipticCurvePrivateKey:
    d = int.from_bytes(base64.urlsafe_b64decode(RFC_JWK["d"] + "="), "big")
    return ec.derive_private_key(d, ec.SECP256R1())


def raw_signature(signing_input: str) -> bytes:
    """R || S (32 bytes each) of ES256 over ``signing_input`` under the RFC's key."""
    der = _private_key().sign(signing_input.encode("ascii"), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def signed(header_b64: str, payload_b64: str, signature: bytes | None = None) -> str:
    """``header_b64.payload_b64.signature``, signed over exactly those two segments' text (the
    given raw signature instead, when one is)."""
    raw = raw_signature(f"{header_b64}.{payload_b64}") if signature is None else signature
    return f"{header_b64}.{payload_b64}.{b64url(raw)}"


def token(header: dict[str, Any] | str, payload: dict[str, Any] | bytes) -> str:
    """A well-formed ES256 token of ``header`` (a dict, or its JSON text as spelt) and
    ``payload`` (a dict, or its bytes), signed with the RFC's key."""
    header_text = header if isinstance(header, str) else json.dumps(header)
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return signed(b64url(header_text.encode()), b64url(body))
