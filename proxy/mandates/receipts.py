"""opgate's signed answers to a mandate (AP2's Mandate Receipt and Payment Receipt): an ES256 JWS
under opgate's own key, whose public half opgate publishes as a JWKS. Pure: the key is given.

Claims. AP2's Mandate Receipt (``agent_authorization.md``, "Action Authorization"): ``iss``
(opgate as the verifier), ``iat``, ``result`` (``success`` | ``error``), ``reference`` (the
received mandate hashed as ``sd_hash`` is), ``error`` and ``error_description`` for an error.
opgate's own: ``opgate_code`` (an error's code), ``operation_id`` and ``operation_status``.
Once the operation settled, AP2's Payment Receipt (``payment_receipt.json``): ``status``
(``Success``: confirmed; ``Error``: failed), ``payment_id`` (the provider's object id, else the
operation id), ``psp_confirmation_id`` (the provider's object id, on ``Success``), and on
``Error`` ``error`` and ``error_description``. AP2's ``network_confirmation_id`` is not given:
the provider's answer does not tell opgate the network's confirmation.

A receipt is also presented back (``read_receipt``): by a replacement agent, to learn where the
operation it names stands; only opgate's own signature under its own key is accepted.
"""

from __future__ import annotations

import json
from typing import Any

from joserfc import jws
from joserfc.jwk import ECKey

from proxy.transparency.jws import JwsInvalid, strict_json, verify

# opgate's refusal codes as AP2's four errors
AP2_ERRORS = {
    "mandate_invalid": "invalid_credential",
    "mandate_expired": "invalid_credential",
    "mandate_issuer_unknown": "invalid_credential",
    "mandate_revoked": "invalid_credential",
    "mandate_nonce_unknown": "invalid_credential",
    "mandate_nonce_used": "invalid_credential",
    "mandate_constraint_failed": "unresolved_constraint",
    "mandate_mismatch": "invalid_mandate",
    "mandate_exhausted": "invalid_mandate",
    "mandates_not_supported": "mandates_not_supported",
}


def key_id(key: ECKey) -> str:
    """The key's RFC 7638 thumbprint: the ``kid`` receipts name and the JWKS lists."""
    return str(key.thumbprint())


def public_jwks(key: ECKey) -> dict[str, Any]:
    public = dict(key.as_dict(private=False))
    return {"keys": [{**public, "kid": key_id(key), "alg": "ES256", "use": "sig"}]}


def sign_receipt(key: ECKey, claims: dict[str, Any]) -> str:
    header = {"alg": "ES256", "typ": "JWT", "kid": key_id(key)}
    return jws.serialize_compact(header, json.dumps(claims, sort_keys=True).encode(), key)


def receipt_claims(
    *,
    issuer: str,
    now: int,
    reference: str | None,
    refusal: tuple[str, str] | None = None,
    operation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A receipt's claims: an error (``refusal``: opgate's code and sentence), or success with
    the operation (its id, status and, once known, the provider's object id)."""
    claims: dict[str, Any] = {"iss": issuer, "iat": now}
    if reference is not None:
        claims["reference"] = reference
    if refusal is not None:
        code, sentence = refusal
        claims.update(result="error", error=AP2_ERRORS.get(code, "invalid_mandate"))
        claims.update(error_description=sentence, opgate_code=code)
        return claims
    claims["result"] = "success"
    if operation is not None:
        claims["operation_id"] = operation["operation_id"]
        claims["operation_status"] = operation["status"]
        claims.update(payment_receipt(operation))
    return claims


# the operation statuses that settle a payment, as AP2's Payment Receipt status
_SETTLED = {"confirmed": "Success", "failed": "Error"}


def payment_receipt(operation: dict[str, Any]) -> dict[str, Any]:
    """AP2's Payment Receipt claims of a settled operation (none before it settles)."""
    status = _SETTLED.get(operation["status"])
    if status is None:
        return {}
    answer = operation.get("provider_response") or {}
    object_id = answer.get("object_id") or None
    payment_id = object_id or operation["operation_id"]
    claims: dict[str, Any] = {"status": status, "payment_id": payment_id}
    if status == "Success":
        if object_id:
            claims["psp_confirmation_id"] = object_id
    else:
        claims["error"] = "payment_failed"
        claims["error_description"] = "the operation failed: the provider made no payment"
    return claims


class ReceiptInvalid(ValueError):
    """Not a receipt opgate signed under its key (or not one naming an operation)."""


def read_receipt(key: ECKey, issuer: str, receipt: str) -> dict[str, Any]:
    """The claims of a receipt opgate signed with ``key`` as ``issuer``; else ReceiptInvalid.
    Only ES256 and opgate's own ``kid``: a receipt is trusted for what opgate itself said.
    Verified by opgate's one JWS verifier (proxy/transparency/jws.py), as mandates are."""
    try:
        verified = verify(receipt, key.as_dict(private=False))
        claims = strict_json(verified.payload, "the receipt")
    except JwsInvalid as exc:
        raise ReceiptInvalid("not a receipt signed with opgate's key") from exc
    if verified.header.get("kid") != key_id(key) or not isinstance(claims, dict):
        raise ReceiptInvalid("not a receipt signed with opgate's key")
    if claims.get("iss") != issuer:
        raise ReceiptInvalid("a receipt of another verifier")
    if claims.get("result") != "success" or not isinstance(claims.get("operation_id"), str):
        raise ReceiptInvalid("the receipt names no operation (an error receipt)")
    return claims
