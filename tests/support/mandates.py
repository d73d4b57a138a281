"""Real AP2 Payment Mandates minted by the tests: a trusted surface (the person's issuer) signs
SD-JWTs with its own P-256 key, an agent signs its closed mandate under an open one with the key
the open mandate names in ``cnf``. Written from RFC 9901 and AP2 v0.2, not from opgate's
verifier, so that the two can disagree."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from joserfc import jws
from joserfc.jwk import ECKey


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def digest(text: str) -> str:
    return b64url(hashlib.sha256(text.encode("ascii")).digest())


# The order of P-256's base point (SEC 2 section 2.4.2): an ECDSA signature (R, S) and (R, n - S)
# both verify, so every ES256 token has a second valid text (its twin)
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def _with_s(jwt: str, high: bool | None) -> str:
    """``jwt`` with its signature's S flipped (``high`` None), or made high or low."""
    head, payload, signature = jwt.split(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    r, s = raw[:32], int.from_bytes(raw[32:], "big")
    flipped = P256_ORDER - s
    if high is not None and (s > P256_ORDER // 2) == high:  # already as asked
        flipped = s
    return f"{head}.{payload}.{b64url(r + flipped.to_bytes(32, 'big'))}"


def twin(token: str) -> str:
    """``token`` (an SD-JWT, ``<jwt>~...``) with its issuer-signed JWT's signature (R, n - S):
    the same claims signed by the same key, a different text anyone holding it can make."""
    jwt, rest = token.split("~", 1)
    return f"{_with_s(jwt, None)}~{rest}"


def high_s(token: str) -> str:
    """``token`` spelled with its issuer-signed JWT's S above n/2 (itself or its twin)."""
    jwt, rest = token.split("~", 1)
    return f"{_with_s(jwt, True)}~{rest}"


def identity(jwt: str) -> str:
    """A mandate's identity as opgate keys it: the digest of its issuer-signed JWT spelled with
    the low S; a JWT whose signature is not 64 bytes has one text, whose digest it is."""
    signature = jwt.split(".")[-1]
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    return digest(_with_s(jwt, False)) if len(raw) == 64 else digest(jwt)


def disclosure(name: str | None, value: Any) -> str:
    salt = b64url(secrets.token_bytes(16))
    parts = [salt, value] if name is None else [salt, name, value]
    return b64url(json.dumps(parts).encode("utf-8"))


def sign(key: ECKey, header: dict[str, Any], claims: dict[str, Any]) -> str:
    return jws.serialize_compact({"alg": "ES256", **header}, json.dumps(claims).encode(), key)


@dataclass
class Signer:
    """A key that signs mandates (the person's trusted surface) or closed mandates (an agent)."""

    kid: str
    key: ECKey = field(default_factory=lambda: ECKey.generate_key("P-256"))

    @property
    def public_jwk(self) -> dict[str, Any]:
        return dict(self.key.as_dict(private=False))

    @property
    def jwks(self) -> dict[str, Any]:
        return {"keys": [{**self.public_jwk, "kid": self.kid, "alg": "ES256", "use": "sig"}]}

    def sd_jwt(
        self,
        claims: dict[str, Any],
        *,
        disclose: tuple[str, ...] = (),
        header: dict[str, Any] | None = None,
    ) -> tuple[str, list[str]]:
        """The issuer-signed JWT with the claims named in ``disclose`` made selectively
        disclosable, and their disclosures."""
        payload = {k: v for k, v in claims.items() if k not in disclose}
        disclosures = [disclosure(name, claims[name]) for name in disclose]
        if disclosures:
            payload["_sd"] = sorted(digest(d) for d in disclosures)
            payload["_sd_alg"] = "sha-256"
        jwt = sign(self.key, {"kid": self.kid, "typ": "dc+sd-jwt", **(header or {})}, payload)
        return jwt, disclosures


def compact(jwt: str, disclosures: list[str], kb_jwt: str = "") -> str:
    return "".join(f"{p}~" for p in (jwt, *disclosures)) + kb_jwt


def closed_payment(
    *,
    amount: int = 2500,
    currency: str = "USD",
    payee_id: str = "acct_merchant",
    transaction_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "vct": "mandate.payment.1",
        "transaction_id": transaction_id or b64url(secrets.token_bytes(32)),
        "payee": {"id": payee_id, "name": "Merchant Choice", "website": "https://m.example"},
        "payment_amount": {"amount": amount, "currency": currency},
        "payment_instrument": {"id": "pm_card", "type": "card", "description": "visa 4242"},
        **extra,
    }


def person_claims(content: dict[str, Any], *, sub: str = "alice", ttl: int = 900) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": "https://surface.example", "sub": sub, "iat": now, "exp": now + ttl, **content}


def closed_mandate(person: Signer, **fields: Any) -> str:
    """A closed Payment Mandate the person signed (human present), payee disclosed."""
    jwt, disclosures = person.sd_jwt(person_claims(closed_payment(**fields)), disclose=("payee",))
    return compact(jwt, disclosures)


def open_mandate(
    person: Signer,
    agent: Signer,
    constraints: list[dict[str, Any]],
    *,
    elements: bool = False,
    disclose: tuple[str, ...] = ("constraints",),
    **fixed: Any,
) -> str:
    """An open Payment Mandate naming the agent's key; the claims named in ``disclose``
    selectively disclosed (``constraints`` by default), and with ``elements`` each constraint
    an array element of its own (``{"...": digest}``, RFC 9901 section 4.2.2)."""
    listed: list[Any] = list(constraints)
    element_disclosures: list[str] = []
    if elements:
        element_disclosures = [disclosure(None, c) for c in constraints]
        listed = [{"...": digest(d)} for d in element_disclosures]
    claims = person_claims(
        {
            "vct": "mandate.payment.open.1",
            "constraints": listed,
            "cnf": {"jwk": agent.public_jwk},
            **fixed,
        }
    )
    jwt, disclosures = person.sd_jwt(claims, disclose=disclose)
    return compact(jwt, [*disclosures, *element_disclosures])


def withhold(token: str, *indexes: int) -> str:
    """``token`` (``<jwt>~<d>~...~``, no key binding) presented without its disclosures at
    ``indexes`` (0: the first disclosure): what a holder may do to any SD-JWT."""
    jwt, *disclosures, last = token.split("~")
    assert last == "", "withhold a token without its key binding"
    kept = [d for i, d in enumerate(disclosures) if i not in indexes]
    return compact(jwt, kept)


def present_under(
    open_token: str,
    agent: Signer,
    content: dict[str, Any],
    *,
    aud: str,
    nonce: str | None = None,
    iat: int | None = None,
    binding: str = "sd_hash",
    typ: str = "kb+sd-jwt",
) -> str:
    """The agent's closed mandate under ``open_token``, joined as AP2's ``<open>~~<closed>~``."""
    bound = open_token if binding == "sd_hash" else open_token.split("~", 1)[0]
    claims = {
        "iat": iat if iat is not None else int(time.time()),
        "aud": aud,
        "nonce": nonce or b64url(secrets.token_bytes(12)),
        binding: digest(bound),
        "delegate_payload": [content],
    }
    jwt = sign(agent.key, {"typ": typ}, claims)
    return f"{open_token.removesuffix('~')}~~{jwt}~"


def key_binding(
    holder: Signer, sd_jwt: str, *, aud: str, nonce: str = "n-1", iat: int | None = None
) -> str:
    """RFC 9901's KB-JWT over a presentation ``sd_jwt`` (ending in ``~``)."""
    claims = {
        "iat": iat if iat is not None else int(time.time()),
        "aud": aud,
        "nonce": nonce,
        "sd_hash": digest(sd_jwt),
    }
    return sign(holder.key, {"typ": "kb+jwt"}, claims)


def checkout_jwt(
    merchant: Signer,
    *,
    line_items: Sequence[tuple[str, int]] = (("sku_shoe", 1),),
    merchant_id: str = "acct_merchant",
    total: int = 2500,
) -> str:
    """A merchant-signed UCP Checkout (AP2's ``checkout_jwt``): ``line_items`` as (item id,
    quantity), ``totals`` in minor units."""
    payload = {
        "id": "chk_" + b64url(secrets.token_bytes(8)),
        "merchant": {"id": merchant_id, "name": "Merchant Choice", "website": "https://m.example"},
        "line_items": [
            {"id": f"li_{i}", "item": {"id": item, "title": item}, "quantity": quantity}
            for i, (item, quantity) in enumerate(line_items)
        ],
        "status": "ready_for_complete",
        "currency": "USD",
        "totals": [{"type": "total", "amount": total}],
        "links": [],
    }
    return sign(merchant.key, {"kid": merchant.kid, "typ": "JWT"}, payload)


def closed_checkout_content(jwt: str, **extra: Any) -> dict[str, Any]:
    """AP2's closed Checkout Mandate content: the checkout JWT and its hash."""
    return {"vct": "mandate.checkout.1", "checkout_jwt": jwt, "checkout_hash": digest(jwt), **extra}


def closed_checkout(person: Signer, jwt: str, **extra: Any) -> str:
    """A closed Checkout Mandate the person signed (human present), checkout_jwt disclosed."""
    claims = person_claims(closed_checkout_content(jwt, **extra))
    token, disclosures = person.sd_jwt(claims, disclose=("checkout_jwt",))
    return compact(token, disclosures)


def open_checkout(
    person: Signer, agent: Signer, constraints: list[dict[str, Any]], *, elements: bool = False
) -> str:
    """An open Checkout Mandate naming the agent's key; its constraints disclosed, and with
    ``elements`` each constraint an array element of its own."""
    listed: list[Any] = list(constraints)
    element_disclosures: list[str] = []
    if elements:
        element_disclosures = [disclosure(None, c) for c in constraints]
        listed = [{"...": digest(d)} for d in element_disclosures]
    claims = person_claims(
        {
            "vct": "mandate.checkout.open.1",
            "constraints": listed,
            "cnf": {"jwk": agent.public_jwk},
        }
    )
    token, disclosures = person.sd_jwt(claims, disclose=("constraints",))
    return compact(token, [*disclosures, *element_disclosures])
