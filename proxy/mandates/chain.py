"""A mandate as an agent presents it, verified to its claims: one SD-JWT a trusted issuer signed
(a closed mandate, the person present), or AP2's delegation chain ``<open>~~<closed>~`` where
the person's open mandate names the agent's key in ``cnf`` and the agent signs the closed one
with it (a KB-SD-JWT hop bound to the open mandate by ``sd_hash`` or ``issuer_jwt_hash``).
Pure: keys, audience and time are given.

Delegation past one hop (agent to agent) is outside AP2 v0.2 and refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.mandates.sdjwt import (
    SdJwt,
    SdJwtInvalid,
    b64url_digest,
    check_times,
    confirmation_key,
    reveal,
    split,
    unverified_header,
    verify_jws,
)

CHAIN_SEPARATOR = "~~"
# RFC 9901's key binding JWT, and AP2's terminal KB-SD-JWT hop (with the SDK's older spelling)
KB_JWT_TYP = "kb+jwt"
HOP_TYPES = ("kb+sd-jwt", "kb-sd-jwt")
MAX_PRESENTATION = 64 * 1024
MAX_NONCE = 256  # opgate's own are 43 characters; anything far longer is not one of them
# The claims of mandate content a decision reads by name (ap2.py, checkout.py), by vct. Only
# for naming a withheld one in a refusal: sdjwt.reveal refuses ANY undisclosed digest, named
# or not (docs/mandates.md, "Not shown is never not there").
# (the ones a well-formed mandate always has first, so that the first one not shown is the
# likeliest withheld)
_ABOUT = ("vct", "sub", "cnf", "exp")
_PAYMENT = ("payee", "payment_amount", "payment_instrument", "transaction_id")
_CHECKOUT = ("checkout_jwt", "checkout_hash")
READ_BY_NAME: dict[str, tuple[str, ...]] = {
    "mandate.payment.1": (*_PAYMENT, *_ABOUT, "execution_date", "nbf"),
    # an open mandate may fix any claim of the closed one (AP2: "MAY optionally include any
    # property from the closed Payment Mandate"), which unchanged then compares
    "mandate.payment.open.1": ("constraints", *_ABOUT, *_PAYMENT, "execution_date", "nbf"),
    "mandate.checkout.1": (*_CHECKOUT, *_ABOUT, "nbf"),
    "mandate.checkout.open.1": ("constraints", *_ABOUT, *_CHECKOUT, "nbf"),
}
# where mandate content sits: at the top, or in AP2 SDK tokens in delegate_payload[0]
_CONTENT_PATHS = ("", "delegate_payload[0]")


def _read_by_name(path: str, claims: dict[str, Any]) -> tuple[str, ...]:
    if path not in _CONTENT_PATHS:
        return ()
    vct = claims.get("vct")
    return READ_BY_NAME.get(vct, _ABOUT) if isinstance(vct, str) else _ABOUT


# Names a withheld claim's path may show besides those (AP2's nested ones): never the
# presentation's own text
_WORDS = frozenset(
    {"delegate_payload", "allowed", "items", "acceptable_items", "id", "amount", "currency"}
).union(*READ_BY_NAME.values())


class IssuerUnknown(SdJwtInvalid):
    """The first token is signed under a ``kid`` no trusted issuer holds."""


@dataclass(frozen=True, slots=True)
class TrustedKey:
    issuer: str  # the name settings give the issuer
    jwk: dict[str, Any]


@dataclass(frozen=True, slots=True)
class VerifiedMandate:
    """What a verified presentation says: the person's mandate, and the agent's closed one
    under it when the mandate is open."""

    issuer: str
    root: dict[str, Any]  # the claims the trusted issuer signed (disclosed ones revealed)
    closed: dict[str, Any] | None  # the agent's closed mandate content, for an open root
    root_jwt: str  # the trusted issuer's signed JWT: the person's mandate's identity
    closed_jwt: str  # the issuer-signed JWT of the final token: the mandate's identity
    reference: str  # AP2's receipt reference: the final SD-JWT hashed as sd_hash is
    # the nonce the key binding (a KB-JWT, or the agent's closed mandate) answered; None when
    # nothing is key-bound. Whether opgate issued it is the caller's to check (it is stored).
    nonce: str | None
    # the person's mandate as presented, hashed as sd_hash is: for an open Checkout Mandate,
    # the hash a Payment Mandate's payment.reference names (AP2 conditional_transaction_id)
    root_reference: str

    @property
    def final(self) -> dict[str, Any]:
        """The closed mandate content the operation is made from."""
        return self.closed if self.closed is not None else self.root


@dataclass(frozen=True, slots=True)
class Expectation:
    audience: str  # opgate's own name as a verifier: the KB's ``aud``
    now: int
    skew_seconds: int = 60
    max_key_binding_age_seconds: int = 300


@dataclass(frozen=True, slots=True)
class PresentedParts:
    """What a presentation names before anything of it is verified: enough to keep a refused
    one with its identity (the digests are the issuer-signed JWTs', as ``VerifiedMandate``'s),
    never enough to trust it."""

    root_jwt: str
    closed_jwt: str
    reference: str  # AP2's receipt reference, as ``VerifiedMandate.reference``
    kid: str | None  # the key the root names in its header, if it names one


def presented_parts(presentation: str) -> PresentedParts | None:
    """The parts of a presentation that splits as one (None: it does not, or is too large)."""
    try:
        root_token, hop = _tokens(presentation)
    except SdJwtInvalid:
        return None
    try:
        kid = unverified_header(root_token.issuer_jwt).get("kid")
    except SdJwtInvalid:
        kid = None  # still the same bytes, kept under their digest
    final = root_token if hop is None else hop
    return PresentedParts(
        root_jwt=root_token.issuer_jwt,
        closed_jwt=final.issuer_jwt,
        reference=b64url_digest(final.without_key_binding),
        kid=kid if isinstance(kid, str) else None,
    )


def _tokens(presentation: str) -> tuple[SdJwt, SdJwt | None]:
    """The person's token and, in a chain, the agent's closed one under it (split, unverified)."""
    if len(presentation) > MAX_PRESENTATION or not presentation.isascii():
        raise SdJwtInvalid("the presentation is too large or not ASCII")
    segments = presentation.split(CHAIN_SEPARATOR)
    if len(segments) > 2:
        raise SdJwtInvalid("delegation past one agent is not accepted (AP2 v0.2 defines none)")
    root_token = split(segments[0] + ("~" if len(segments) == 2 else ""))
    return root_token, (split(segments[1]) if len(segments) == 2 else None)


def verify_presentation(
    presentation: str, trusted: Mapping[str, TrustedKey], expect: Expectation
) -> VerifiedMandate:
    """The verified mandate, or ``SdJwtInvalid`` (``IssuerUnknown``, ``SdJwtExpired``) naming
    the failed step. ``trusted`` maps a ``kid`` to the key of an issuer settings name."""
    root_token, hop = _tokens(presentation)
    issuer, root, nonce = _verify_root(root_token, trusted, expect, last=hop is None)
    root_reference = b64url_digest(root_token.without_key_binding)
    if hop is None:
        return VerifiedMandate(
            issuer=issuer,
            root=root,
            closed=None,
            root_jwt=root_token.issuer_jwt,
            closed_jwt=root_token.issuer_jwt,
            reference=root_reference,
            nonce=nonce,
            root_reference=root_reference,
        )
    if hop.key_binding_jwt is not None:
        raise SdJwtInvalid("the agent's closed mandate carries a separate key binding JWT")
    agent_key = confirmation_key(root)
    if agent_key is None:
        raise SdJwtInvalid("the open mandate names no agent key (cnf) to sign under it")
    closed, nonce = _verify_hop(hop, root_token, agent_key, expect)
    return VerifiedMandate(
        issuer=issuer,
        root=root,
        closed=closed,
        root_jwt=root_token.issuer_jwt,
        closed_jwt=hop.issuer_jwt,
        reference=b64url_digest(hop.without_key_binding),
        nonce=nonce,
        root_reference=root_reference,
    )


def _verify_root(
    token: SdJwt, trusted: Mapping[str, TrustedKey], expect: Expectation, *, last: bool
) -> tuple[str, dict[str, Any], str | None]:
    """The issuer's name, the mandate content, and the nonce of its KB-JWT if it has one."""
    kid = unverified_header(token.issuer_jwt).get("kid")
    key = trusted.get(kid) if isinstance(kid, str) else None
    if key is None:
        raise IssuerUnknown("no trusted issuer of this tenant holds the key the mandate names")
    _header, payload = verify_jws(token.issuer_jwt, key.jwk)
    claims = reveal(payload, token.disclosures, _read_by_name, _WORDS)
    check_times(claims, expect.now, expect.skew_seconds, "the mandate")
    content = _effective(claims)
    check_times(content, expect.now, expect.skew_seconds, "the mandate content")
    holder_key = confirmation_key(content)
    nonce = None
    if last and holder_key is not None:
        # the person bound this mandate to a holder's key: only that holder may present it
        if token.key_binding_jwt is None:
            raise SdJwtInvalid("the mandate is bound to a key and carries no key binding JWT")
        nonce = _verify_key_binding(token, holder_key, expect)
    elif token.key_binding_jwt is not None and not last:
        raise SdJwtInvalid("an open mandate in a chain carries a key binding JWT")
    return key.issuer, content, nonce


def _verify_key_binding(token: SdJwt, holder_key: dict[str, Any], expect: Expectation) -> str:
    """RFC 9901 section 7.3: typ, signature by the holder's key, aud, nonce, iat, sd_hash."""
    assert token.key_binding_jwt is not None
    header, claims = verify_jws(token.key_binding_jwt, holder_key)
    if header.get("typ") != KB_JWT_TYP:
        raise SdJwtInvalid(f"the key binding JWT's typ is not {KB_JWT_TYP}")
    nonce = _check_binding_claims(claims, expect, "the key binding JWT")
    if claims.get("sd_hash") != b64url_digest(token.without_key_binding):
        raise SdJwtInvalid("the key binding JWT's sd_hash does not match the presentation")
    return nonce


def _verify_hop(
    hop: SdJwt, previous: SdJwt, agent_key: dict[str, Any], expect: Expectation
) -> tuple[dict[str, Any], str]:
    """The agent's closed mandate content and the nonce it answered."""
    header, payload = verify_jws(hop.issuer_jwt, agent_key)
    if header.get("typ") not in HOP_TYPES:
        raise SdJwtInvalid(f"the closed mandate's typ is not one of {', '.join(HOP_TYPES)}")
    claims = reveal(payload, hop.disclosures, _read_by_name, _WORDS)
    nonce = _check_binding_claims(claims, expect, "the closed mandate")
    bindings = [name for name in ("sd_hash", "issuer_jwt_hash") if name in claims]
    if len(bindings) != 1:
        raise SdJwtInvalid("the closed mandate needs exactly one of sd_hash, issuer_jwt_hash")
    expected = b64url_digest(
        previous.without_key_binding if bindings[0] == "sd_hash" else previous.issuer_jwt
    )
    if claims[bindings[0]] != expected:
        raise SdJwtInvalid(f"the closed mandate's {bindings[0]} does not match the open one")
    closed = _effective(claims)
    check_times(closed, expect.now, expect.skew_seconds, "the closed mandate content")
    if "cnf" in closed:
        raise SdJwtInvalid("a closed mandate delegates further (cnf)")
    return closed, nonce


def _check_binding_claims(claims: dict[str, Any], expect: Expectation, what: str) -> str:
    """aud, nonce and iat of a key binding checked; the nonce (its origin is the caller's)."""
    if claims.get("aud") != expect.audience:
        raise SdJwtInvalid(f"{what} is for another audience")
    nonce = claims.get("nonce")
    if not isinstance(nonce, str) or not nonce or len(nonce) > MAX_NONCE:
        raise SdJwtInvalid(f"{what} carries no nonce (or one longer than {MAX_NONCE})")
    iat = claims.get("iat")
    if not isinstance(iat, int) or isinstance(iat, bool):
        raise SdJwtInvalid(f"{what} carries no iat")
    if iat > expect.now + expect.skew_seconds:
        raise SdJwtInvalid(f"{what} is issued in the future")
    if iat < expect.now - expect.max_key_binding_age_seconds:
        raise SdJwtInvalid(f"{what} is older than {expect.max_key_binding_age_seconds} s")
    check_times(claims, expect.now, expect.skew_seconds, what)
    return nonce


def _effective(claims: dict[str, Any]) -> dict[str, Any]:
    """AP2 SDK tokens carry the mandate in ``delegate_payload: [content]``; others at the top."""
    if "delegate_payload" not in claims:
        return claims
    items = claims["delegate_payload"]
    if not isinstance(items, list) or len(items) != 1 or not isinstance(items[0], dict):
        raise SdJwtInvalid("delegate_payload does not hold exactly one disclosed mandate")
    content: dict[str, Any] = dict(items[0])
    for name in ("iss", "sub", "iat", "exp", "nbf", "cnf"):
        if name in claims and name not in content:
            content[name] = claims[name]
    return content
