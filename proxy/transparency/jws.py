"""Compact JWS (RFC 7515) under ES256 (RFC 7518 section 3.4), verified: opgate's one verifier of
a signed JSON token, for the mandates a person or an agent signed (proxy/mandates/sdjwt.py), the
receipts opgate signed and is shown back (proxy/mandates/receipts.py), and the mandates a
bundle's records hold (proxy/observe/auditlog/evidence.py). Pure: the key is the caller's, from
its own configuration, never from the token.

One token reads one way wherever it is verified, so every rule is the strictest reading:

    segments    exactly three, separated by ``.``, none empty (no detached or unsigned form)
    base64url   RFC 7515 section 2: the URL-safe alphabet only, no ``=`` padding, and canonical
                (the unused bits of the last character zero): one text per value
    header      a UTF-8 JSON object, no member named twice, no NaN or Infinity, no lone
                surrogate or NUL, nesting bounded before the (recursive) parser runs
    alg         exactly ``ES256``
    crit        refused, whatever it lists: this verifier understands no extension (RFC 7515
                section 4.1.11); so is ``b64`` (RFC 7797), which changes what is signed
    signature   exactly 64 bytes, R || S big-endian (RFC 7518 section 3.4), each in 1..n-1
    key         a JWK of ``kty`` EC on ``crv`` P-256, ``x`` and ``y`` 32 bytes each, a point of
                the curve

Each refusal is ``JwsInvalid`` with a sentence naming the rule; nothing is repaired.

ECDSA signatures are malleable: when (R, S) verifies, so does (R, n - S), and RFC 7518 does not
ask for the low S. Refusing the high one would refuse half of every issuer's genuine tokens, so
both are accepted: a token's text is therefore not its identity (anyone holding it can make a
second valid text of it); what is signed (``header.payload``) is. Where a token's text keys a
record (a mandate's digest), it is keyed by ``identity``: the digest of its canonical text, the
one whose S is the lower of S and n - S, which a token and its twin share.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

ALGORITHM = "ES256"
# Nesting of any JSON text read out of base64url, counted on the bytes BEFORE the parser runs:
# Python's parser recurses, and a header of a few thousand brackets would exhaust the stack
# before any signature is checked.
MAX_JSON_DEPTH = 32
# The order of P-256's base point: R and S are each in 1..n-1 (SEC 1 section 4.1.4)
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
# header members whose meaning this verifier would have to understand to read the token as its
# signer meant it: refused rather than ignored
_EXTENSIONS = ("crit", "b64")


class JwsInvalid(ValueError):
    """Not a compact ES256 JWS by the rules above, or one the key did not sign."""


class SignatureMismatch(JwsInvalid):
    """A well-formed token the given key did not sign (or whose signed text was altered)."""


@dataclass(frozen=True, slots=True)
class Jws:
    """A verified token: its protected header and its payload's bytes (parsed by the caller)."""

    header: dict[str, Any]
    payload: bytes


def b64url_encode(raw: bytes) -> str:
    """base64url without padding (RFC 7515 section 2)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str, what: str) -> bytes:
    """The bytes of unpadded, canonical base64url ``text``; else JwsInvalid naming ``what``."""
    if not text.isascii() or not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise JwsInvalid(f"{what} is not unpadded base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise JwsInvalid(f"{what} is not unpadded base64url") from exc
    if b64url_encode(raw) != text:  # stray bits in the last character: a second spelling
        raise JwsInvalid(f"{what} is not canonical base64url")
    return raw


def strict_json(raw: bytes, what: str) -> Any:
    """``raw`` parsed as strict JSON: UTF-8, depth bounded before parsing, no member named
    twice, no NaN or Infinity, no lone surrogate or NUL; else JwsInvalid naming ``what``."""
    if not json_depth_within(raw, MAX_JSON_DEPTH):
        raise JwsInvalid(f"{what} nests JSON deeper than {MAX_JSON_DEPTH}")
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
        # a lone surrogate (\ud800) parses, then breaks every encoder after it
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeError, ValueError) as exc:
        raise JwsInvalid(f"{what} is not strict JSON ({exc})") from exc
    if "\\u0000" in text or "\x00" in text:
        raise JwsInvalid(f"{what} holds a NUL character")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # a member named twice reads differently to different parsers (first or last wins)
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("a member is named twice")
    return value


def json_depth_within(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects at most ``limit`` deep, counted
    on its bytes (brackets inside strings do not count) without parsing it."""
    depth, in_string, escaped = 0, False, False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return False
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return True


def _segments(compact: str) -> tuple[str, str, str]:
    # emptiness is the caller's to refuse: an unsigned token (``alg: none``, an empty third
    # segment) is refused for its algorithm, the first thing a reader of it is told
    parts = compact.split(".")
    if len(parts) != 3:
        raise JwsInvalid("not a compact JWS (three segments)")
    return parts[0], parts[1], parts[2]


def read_header(compact: str) -> dict[str, Any]:
    """The protected header as written (base64url and strict JSON, an object), not yet judged
    by ``alg`` or ``crit``: what a refused token named (its ``kid``), kept for the record."""
    encoded, _, _ = _segments(compact)
    value = strict_json(b64url_decode(encoded, "the JWS header"), "the JWS header")
    if not isinstance(value, dict):
        raise JwsInvalid("the JWS header is not a JSON object")
    return value


def header(compact: str) -> dict[str, Any]:
    """The protected header of ``compact``, by every rule above but the signature's: what
    picks the key (``kid``) before anything is verified."""
    value = read_header(compact)
    if value.get("alg") != ALGORITHM:
        raise JwsInvalid("the signature algorithm is not accepted (ES256 only)")
    for name in _EXTENSIONS:
        if name in value:
            raise JwsInvalid(f"a JWS with a {name!r} header parameter is not accepted")
    return value


def public_key(jwk: Mapping[str, Any]) -> ec.EllipticCurvePublicKey:
    """The P-256 public key a JWK holds; else JwsInvalid."""
    if jwk.get("kty") != "EC" or jwk.get("crv") != "P-256":
        raise JwsInvalid("the key is not a P-256 key (kty EC, crv P-256)")
    x, y = jwk.get("x"), jwk.get("y")
    if not isinstance(x, str) or not isinstance(y, str):
        raise JwsInvalid("the key's x and y are not strings")
    xs, ys = b64url_decode(x, "the key's x"), b64url_decode(y, "the key's y")
    if len(xs) != 32 or len(ys) != 32:  # RFC 7518 section 6.2.1.2: the full coordinate length
        raise JwsInvalid("the key's x or y is not 32 bytes")
    try:
        numbers = ec.EllipticCurvePublicNumbers(
            int.from_bytes(xs, "big"), int.from_bytes(ys, "big"), ec.SECP256R1()
        )
        return numbers.public_key()
    except ValueError as exc:  # not a point of the curve
        raise JwsInvalid("the key is not a point of P-256") from exc


def verify(compact: str, jwk: Mapping[str, Any]) -> Jws:
    """The header and payload of ``compact`` when the P-256 key ``jwk`` signed it under ES256,
    by every rule above; else JwsInvalid. The payload is decoded, not parsed."""
    if not compact.isascii():
        raise JwsInvalid("not a compact JWS (not ASCII)")
    protected = header(compact)
    header_b64, payload_b64, signature_b64 = _segments(compact)
    if not payload_b64:  # the detached form (RFC 7515 appendix F) signs what is not here
        raise JwsInvalid("the JWS payload is empty")
    payload = b64url_decode(payload_b64, "the JWS payload")
    r, s = _signature(signature_b64)
    key = public_key(jwk)
    try:
        key.verify(
            encode_dss_signature(r, s),
            f"{header_b64}.{payload_b64}".encode("ascii"),
            ec.ECDSA(hashes.SHA256()),
        )
    except InvalidSignature as exc:
        raise SignatureMismatch("the signature does not verify") from exc
    return Jws(protected, payload)


def low_s(compact: str) -> str:
    """``compact`` with its signature's S replaced by min(S, n - S): the canonical text of a
    token and of its twin (R, n - S). Reads only the signature (64 bytes of canonical base64url,
    R and S in 1..n-1) and verifies nothing; else JwsInvalid."""
    return _spelled(compact, flip=False)


def twin(compact: str) -> str:
    """The other valid text of ``compact``: its signature (R, n - S). Verifies nothing."""
    return _spelled(compact, flip=True)


def identity(compact: str) -> str:
    """base64url SHA-256 of ``low_s(compact)``: one value for a token and its twin, and a
    different one for tokens that differ in anything else. Verifies nothing; else JwsInvalid."""
    return b64url_encode(hashlib.sha256(low_s(compact).encode("ascii")).digest())


def _spelled(compact: str, *, flip: bool) -> str:
    # flip: S becomes n - S (the twin); else the low S is kept or made (the canonical text)
    if not compact.isascii():
        raise JwsInvalid("not a compact JWS (not ASCII)")
    header_b64, payload_b64, signature_b64 = _segments(compact)
    r, s = _signature(signature_b64)
    other = P256_ORDER - s
    chosen = other if flip else min(s, other)
    spelled = b64url_encode(r.to_bytes(32, "big") + chosen.to_bytes(32, "big"))
    return f"{header_b64}.{payload_b64}.{spelled}"


def _signature(signature_b64: str) -> tuple[int, int]:
    """R and S of an ES256 signature: 64 bytes of canonical base64url, each in 1..n-1; else
    JwsInvalid (one reading for verifying and for spelling a token's twin)."""
    signature = b64url_decode(signature_b64, "the JWS signature")
    if len(signature) != 64:
        raise JwsInvalid("the signature is not 64 bytes (R || S, RFC 7518 section 3.4)")
    r, s = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    if not (0 < r < P256_ORDER and 0 < s < P256_ORDER):
        raise JwsInvalid("the signature's R or S is out of range")
    return r, s
