"""SD-JWT (RFC 9901) verified: the issuer's signature, the disclosures against their digests,
and the claims they reveal. Pure: no IO and no clock; keys and the time are given.

Hand-written on purpose, over opgate's one JWS verifier (proxy/transparency/jws.py: ES256
only, strict): SD-JWT processing is small and every step of it is a security check (RFC 9901
section 7.1). Each failure raises ``SdJwtInvalid`` with a sentence naming the step; nothing is
guessed or repaired.

The compact form is ``<issuer-signed JWT>~<Disclosure>~...~<Disclosure>~[<KB-JWT>]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.transparency import jws

# The digest algorithm of the disclosures: RFC 9901's default, the only one AP2 examples use.
SD_ALG = "sha-256"
# A mandate is a few objects deep; deeper nesting is refused rather than walked.
MAX_DEPTH = 16
MAX_DISCLOSURES = 256
# The last second of 9999-12-31 UTC: any NumericDate past it (or before 0) is refused before it
# is compared or converted (datetime cannot hold it).
MAX_TIME = 253_402_300_799


class SdJwtInvalid(ValueError):
    """The SD-JWT fails a verification step; the message names the step."""


class ClaimWithheld(SdJwtInvalid):
    """A digest of the SD-JWT is left undisclosed: a claim (or an array element) withheld, or a
    decoy, which RFC 9901 makes impossible to tell apart. ``claim`` names where it sits."""

    def __init__(self, claim: str, message: str) -> None:
        super().__init__(message)
        self.claim = claim


@dataclass(frozen=True, slots=True)
class SdJwt:
    """One compact SD-JWT split into its parts (nothing verified yet)."""

    issuer_jwt: str
    disclosures: tuple[str, ...]
    key_binding_jwt: str | None

    @property
    def without_key_binding(self) -> str:
        """The issuer JWT and disclosures, each followed by ``~``: what ``sd_hash`` covers."""
        return "".join(f"{part}~" for part in (self.issuer_jwt, *self.disclosures))


def split(compact: str) -> SdJwt:
    """The parts of a compact SD-JWT; its last ``~``-separated part is a KB-JWT or empty."""
    if not compact.isascii() or "~" not in compact:
        raise SdJwtInvalid("not a compact SD-JWT (no '~' separator)")
    parts = compact.split("~")
    issuer_jwt, disclosures, last = parts[0], parts[1:-1], parts[-1]
    if not issuer_jwt or any(not d for d in disclosures):
        raise SdJwtInvalid("an empty part between '~' separators")
    if len(disclosures) > MAX_DISCLOSURES:
        raise SdJwtInvalid(f"more than {MAX_DISCLOSURES} disclosures")
    return SdJwt(issuer_jwt, tuple(disclosures), last or None)


def b64url_digest(text: str) -> str:
    """base64url (no padding) of SHA-256 over the ASCII text: disclosure digests and sd_hash."""
    return jws.b64url_encode(hashlib.sha256(text.encode("ascii")).digest())


def b64url_json(segment: str, what: str) -> Any:
    """The JSON value a base64url segment holds, by the JWS verifier's rules (unpadded and
    canonical base64url, strict JSON bounded in depth: proxy/transparency/jws.py); else
    SdJwtInvalid naming ``what``."""
    try:
        return jws.strict_json(jws.b64url_decode(segment, what), what)
    except jws.JwsInvalid as exc:
        raise SdJwtInvalid(str(exc)) from exc


def parse_json(raw: bytes, what: str) -> Any:
    """``raw`` parsed as strict JSON (no NaN or Infinity), depth bounded before parsing."""
    try:
        return jws.strict_json(raw, what)
    except jws.JwsInvalid as exc:
        raise SdJwtInvalid(str(exc)) from exc


def unverified_header(jwt: str) -> dict[str, Any]:
    """The protected header of a compact JWS, read without verifying or judging it (to pick
    the key; verify_jws judges it)."""
    try:
        return jws.read_header(jwt)
    except jws.JwsInvalid as exc:
        raise SdJwtInvalid(str(exc)) from exc


def verify_jws(jwt: str, public_jwk: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and payload of a compact JWS signed with ``public_jwk``; else SdJwtInvalid."""
    try:
        verified = jws.verify(jwt, public_jwk)
    except jws.JwsInvalid as exc:
        raise SdJwtInvalid(str(exc)) from exc
    return verified.header, _json_object(verified.payload, "the JWS payload")


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    value = parse_json(raw, what)
    if not isinstance(value, dict):
        raise SdJwtInvalid(f"{what} is not a JSON object")
    return value


@dataclass(frozen=True, slots=True)
class _Disclosure:
    name: str | None  # None: an array element
    value: Any


def _decode_disclosures(disclosures: tuple[str, ...]) -> dict[str, _Disclosure]:
    by_digest: dict[str, _Disclosure] = {}
    for text in disclosures:
        decoded = b64url_json(text, "a disclosure")
        if not isinstance(decoded, list) or len(decoded) not in (2, 3):
            raise SdJwtInvalid("a disclosure is not a JSON array of 2 or 3 elements")
        if not isinstance(decoded[0], str):
            raise SdJwtInvalid("a disclosure's salt is not a string")
        if len(decoded) == 3:
            name = decoded[1]
            if not isinstance(name, str) or name in ("_sd", "...", "_sd_alg"):
                raise SdJwtInvalid("a disclosure's claim name is not a string or is reserved")
            disclosure = _Disclosure(name, decoded[2])
        else:
            disclosure = _Disclosure(None, decoded[1])
        digest = b64url_digest(text)
        if digest in by_digest:
            raise SdJwtInvalid("a disclosure is given twice")
        by_digest[digest] = disclosure
    return by_digest


# (path of an object, its revealed claims) -> the claims a decision reads there by name
Named = Callable[[str, dict[str, Any]], Sequence[str]]


def _nothing_named(_path: str, _claims: dict[str, Any]) -> Sequence[str]:
    return ()


class _Revealer:
    """Replaces digests by the claims their disclosures hold (RFC 9901 section 7.1, step 3).

    A digest no disclosure answers is refused (``ClaimWithheld``), not skipped: it is a claim
    or array element the holder withheld, or a decoy, and RFC 9901 makes the two
    indistinguishable by design. opgate reads a mandate whole (docs/mandates.md, "Not shown is
    never not there"), so it never decides on a part of one."""

    def __init__(
        self,
        disclosures: dict[str, _Disclosure],
        named: Named,
        words: frozenset[str],
    ) -> None:
        self._disclosures = disclosures
        self._named = named
        self._words = words
        self._seen: set[str] = set()

    def unused(self) -> int:
        return len(self._disclosures.keys() - self._seen)

    def _take(self, digest: object) -> _Disclosure | None:
        if not isinstance(digest, str):
            raise SdJwtInvalid("a digest is not a string")
        if digest in self._seen:
            raise SdJwtInvalid("a digest appears more than once")
        self._seen.add(digest)
        return self._disclosures.get(digest)

    def reveal(self, value: Any, path: str, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise SdJwtInvalid(f"claims nested deeper than {MAX_DEPTH}")
        if isinstance(value, dict):
            return self._object(value, path, depth)
        if isinstance(value, list):
            return self._array(value, path, depth)
        return value

    def _object(self, value: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        digests = value.get("_sd", [])
        if not isinstance(digests, list):
            raise SdJwtInvalid("_sd is not an array")
        revealed = {
            k: self.reveal(v, _member(path, k, self._words), depth + 1)
            for k, v in value.items()
            if k != "_sd"
        }
        withheld = 0
        for digest in digests:
            disclosure = self._take(digest)
            if disclosure is None:
                withheld += 1
                continue
            if disclosure.name is None:
                raise SdJwtInvalid("an array-element disclosure is referenced from _sd")
            if disclosure.name in revealed:
                raise SdJwtInvalid("a claim is disclosed over an existing one")
            revealed[disclosure.name] = self.reveal(
                disclosure.value, _member(path, disclosure.name, self._words), depth + 1
            )
        if withheld:
            # name the claim a decision reads that is not shown, where the caller named them
            absent = [name for name in self._named(path, revealed) if name not in revealed]
            claim = _member(path, absent[0], self._words) if absent else path or "$"
            candidates = ", ".join(_member(path, name, self._words) for name in absent)
            raise ClaimWithheld(
                claim,
                f"{withheld} digest(s) of {path or 'the claims'} undisclosed (a withheld claim or "
                "a decoy; opgate reads a mandate whole)"
                + (f": not shown, of those read by name: {candidates}" if absent else ""),
            )
        return revealed

    def _array(self, value: list[Any], path: str, depth: int) -> list[Any]:
        revealed: list[Any] = []
        for index, element in enumerate(value):
            if isinstance(element, dict) and "..." in element:
                if len(element) != 1:
                    raise SdJwtInvalid("an array-element digest object has other keys")
                disclosure = self._take(element["..."])
                if disclosure is None:
                    raise ClaimWithheld(
                        f"{path}[{index}]",
                        f"{path}[{index}] is withheld: an array element's digest undisclosed "
                        "(a withheld element or a decoy; opgate reads a mandate whole)",
                    )
                if disclosure.name is not None:
                    raise SdJwtInvalid("a claim disclosure is referenced as an array element")
                element = disclosure.value
            revealed.append(self.reveal(element, f"{path}[{index}]", depth + 1))
        return revealed


def _member(path: str, name: str, words: frozenset[str]) -> str:
    # a path is answered to the presenter: only names the caller knows are shown, never text
    # of the presentation's own
    shown = name if name in words else "*"
    return f"{path}.{shown}" if path else shown


def reveal(
    payload: dict[str, Any],
    disclosures: tuple[str, ...],
    named: Named | None = None,
    words: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The payload with every disclosed claim in place and the SD-JWT machinery removed.

    Refused: an ``_sd_alg`` other than sha-256, a digest no disclosure answers
    (``ClaimWithheld``: ``named`` gives the claims a decision reads by name in an object at a
    path, so that a withheld one is named; a path shows only ``words``), a disclosure
    given twice or not referenced by any digest, a digest referenced twice, a claim disclosed
    over an existing one."""
    sd_alg = payload.get("_sd_alg", SD_ALG)
    if sd_alg != SD_ALG:
        raise SdJwtInvalid("_sd_alg is not sha-256")
    revealer = _Revealer(_decode_disclosures(disclosures), named or _nothing_named, words)
    claims = revealer.reveal({k: v for k, v in payload.items() if k != "_sd_alg"}, "")
    if revealer.unused():
        raise SdJwtInvalid("a disclosure is not referenced by any digest of the SD-JWT")
    assert isinstance(claims, dict)
    return claims


def check_times(claims: dict[str, Any], now: int, skew: int, what: str) -> None:
    """``exp`` not passed, ``nbf`` and ``iat`` not in the future (each within ``skew``)."""
    for name in ("exp", "nbf", "iat"):
        value = claims.get(name)
        if value is not None and not is_time(value):
            raise SdJwtInvalid(f"{what}: {name} is not an integer time from 0 to {MAX_TIME}")
    exp, nbf, iat = claims.get("exp"), claims.get("nbf"), claims.get("iat")
    if exp is not None and now > exp + skew:
        raise SdJwtExpired(f"{what} expired at {exp}")
    if nbf is not None and now + skew < nbf:
        raise SdJwtInvalid(f"{what} is not valid before {nbf}")
    if iat is not None and now + skew < iat:
        raise SdJwtInvalid(f"{what} is issued in the future")


def is_time(value: object) -> bool:
    """A NumericDate opgate can compare and convert: an integer of seconds, 0..MAX_TIME."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TIME


class SdJwtExpired(SdJwtInvalid):
    """The SD-JWT (or a token of its chain) is past its ``exp``."""


def confirmation_key(claims: dict[str, Any]) -> dict[str, Any] | None:
    """The public JWK of ``cnf.jwk`` (RFC 7800), if the claims carry one."""
    cnf = claims.get("cnf")
    if cnf is None:
        return None
    if not isinstance(cnf, dict) or not isinstance(cnf.get("jwk"), dict):
        raise SdJwtInvalid("cnf does not hold a jwk")
    jwk: dict[str, Any] = cnf["jwk"]
    if any(k in jwk for k in ("d", "p", "q", "dp", "dq", "qi", "k")):
        raise SdJwtInvalid("cnf.jwk holds private key material")
    return jwk
