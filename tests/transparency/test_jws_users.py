"""The three verifiers of an ES256 token (a mandate's signature, proxy/mandates/sdjwt.py; a
receipt shown back, proxy/mandates/receipts.py; a mandate in a bundle's records,
proxy/observe/auditlog/evidence.py) accept and refuse the same tokens: one verifier's rules
(proxy/transparency/jws.py), so a token the gate refused is not proven by a bundle either."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import pytest
from joserfc.jwk import ECKey

from proxy.mandates.receipts import ReceiptInvalid, key_id, read_receipt
from proxy.mandates.sdjwt import SdJwtInvalid, verify_jws
from proxy.observe.auditlog.evidence import check_mandate
from tests.support.jws import RFC_JWK, RFC_PUBLIC_JWK, b64url, signed, token

KEY = ECKey.import_key(RFC_JWK)
KID = key_id(KEY)
ISSUER = "opgate.test"
CLAIMS = {"iss": ISSUER, "result": "success", "operation_id": "ap2_1", "iat": 10}


def _mandate(jwt: str) -> bool:
    try:
        verify_jws(jwt, RFC_PUBLIC_JWK)
    except SdJwtInvalid:
        return False
    return True


def _receipt(jwt: str) -> bool:
    try:
        read_receipt(KEY, ISSUER, jwt)
    except ReceiptInvalid:
        return False
    return True


def _bundle(jwt: str) -> bool:
    jwks = {"keys": [{**RFC_PUBLIC_JWK, "kid": KID}]}
    mandate = {"presentation": f"{jwt}~", "issuer": "surface", "issuer_jwks": jwks}
    digest = b64url(hashlib.sha256(jwt.encode("ascii")).digest())
    problem, _ = check_mandate(mandate, digest, None)
    return problem is None


VERIFIERS: dict[str, Callable[[str], bool]] = {
    "mandate": _mandate,
    "receipt": _receipt,
    "bundle": _bundle,
}
HEADER = {"alg": "ES256", "kid": KID}
PAYLOAD = json.dumps(CLAIMS).encode()  # 79 bytes: the last character holds spare bits


def _segments(**change: str) -> str:
    h, p = b64url(json.dumps(HEADER).encode()), b64url(PAYLOAD)
    return signed(change.get("h", h), change.get("p", p))


def _spare_bits_set(segment: str) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    return segment[:-1] + alphabet[alphabet.index(segment[-1]) + 1]


CASES: dict[str, Callable[[], str]] = {
    "crit an extension": lambda: token({**HEADER, "crit": ["exp"], "exp": 1}, CLAIMS),
    "b64 without crit": lambda: token({**HEADER, "b64": True}, CLAIMS),
    "kid named twice": lambda: token(
        f'{{"alg":"ES256","kid":"other","kid":{json.dumps(KID)}}}', CLAIMS
    ),
    "alg named twice": lambda: token(f'{{"alg":"none","alg":"ES256","kid":"{KID}"}}', CLAIMS),
    "payload padded": lambda: _segments(p=b64url(PAYLOAD) + "="),
    "payload with spare bits set": lambda: _segments(p=_spare_bits_set(b64url(PAYLOAD))),
    "header with a newline inside": lambda: _segments(
        h=b64url(json.dumps(HEADER).encode())[:8] + "\n" + b64url(json.dumps(HEADER).encode())[8:]
    ),
    "signature padded": lambda: _segments() + "==",
}


def test_the_valid_token_passes_every_verifier() -> None:
    """The token the cases change is accepted by all three (each refusal below is the case's)."""
    good = _segments()
    assert len(b64url(PAYLOAD)) % 4 != 0  # padding and spare bits exist to be tampered with
    assert {name: verify(good) for name, verify in VERIFIERS.items()} == dict.fromkeys(
        VERIFIERS, True
    )


@pytest.mark.parametrize("case", list(CASES))
def test_every_verifier_refuses_what_the_strictest_rule_refuses(case: str) -> None:
    """A signed token that breaks one rule (crit, b64, a header member twice, padding, spare
    bits, whitespace) is refused by the mandate, receipt and bundle verifiers alike."""
    jwt = CASES[case]()
    assert {name: verify(jwt) for name, verify in VERIFIERS.items()} == dict.fromkeys(
        VERIFIERS, False
    )
