"""opgate's signed answers to a mandate (AP2's Mandate Receipt and Payment Receipt): an ES256 JWS
under opgate's own key, whose public half opgate publishes as a JWKS. Pure: the key is given.

Claims (AP2 ``agent_authorization.md``, "Action Authorization", and ``payment_mandate.md``):
``iss`` (opgate as the verifier), ``iat``, ``result`` (``success`` | ``error``), ``reference``
(the received mandate hashed as ``sd_hash`` is), ``error`` and ``error_description`` for an
error; opgate adds ``operation_id``, ``status`` (the operation's) and ``payment_id`` (the
provider's object id) once the provider answered.
"""

from __future__ import annotations

import json
from typing import Any

from joserfc import jws
from joserfc.jwk import ECKey

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
        claims["status"] = operation["status"]
        answer = operation.get("provider_response") or {}
        if answer.get("object_id"):
            claims["payment_id"] = answer["object_id"]
    return claims
