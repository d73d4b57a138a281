"""opgate's receipts: AP2's Payment Receipt claims once an operation settles, and a receipt
presented back trusted only under opgate's own key, as opgate's issuer, naming an operation."""

from __future__ import annotations

from typing import Any

import pytest
from joserfc.jwk import ECKey

from proxy.mandates.receipts import (
    ReceiptInvalid,
    read_receipt,
    receipt_claims,
    sign_receipt,
)

ISSUER = "opgate.test"
KEY = ECKey.generate_key("P-256")


def operation(status: str, object_id: str | None = "re_1") -> dict[str, Any]:
    answer = None if object_id is None else {"object_id": object_id}
    return {"operation_id": "ap2_1", "status": status, "provider_response": answer}


@pytest.mark.parametrize(
    ("scenario", "op", "expected"),
    [
        ("not settled", operation("dispatched"), {}),
        (
            "confirmed",
            operation("confirmed"),
            {"status": "Success", "payment_id": "re_1", "psp_confirmation_id": "re_1"},
        ),
        (
            "failed, nothing made",
            operation("failed", None),
            {"status": "Error", "payment_id": "ap2_1", "error": "payment_failed"},
        ),
    ],
)
def test_a_settled_operation_carries_ap2s_payment_receipt(
    scenario: str, op: dict[str, Any], expected: dict[str, Any]
) -> None:
    """AP2's status, payment_id and psp_confirmation_id appear once the operation settles."""
    claims = receipt_claims(issuer=ISSUER, now=1, reference="ref", operation=op)
    assert (claims["result"], claims["operation_status"]) == ("success", op["status"])
    names = ("status", "payment_id", "psp_confirmation_id", "error")
    assert {n: claims[n] for n in names if n in claims} == expected


def test_a_receipt_opgate_signed_reads_back() -> None:
    """opgate's own success receipt, presented back, gives its claims."""
    claims = receipt_claims(issuer=ISSUER, now=1, reference="ref", operation=operation("confirmed"))
    assert read_receipt(KEY, ISSUER, sign_receipt(KEY, claims)) == claims


@pytest.mark.parametrize(
    "scenario", ["another key", "another issuer", "an error receipt", "not a JWS"]
)
def test_what_opgate_did_not_sign_for_an_operation_is_refused(scenario: str) -> None:
    """A receipt under another key, of another verifier, naming no operation, or no JWS."""
    claims = receipt_claims(issuer=ISSUER, now=1, reference="r", operation=operation("created"))
    receipt = {
        "another key": lambda: sign_receipt(ECKey.generate_key("P-256"), claims),
        "another issuer": lambda: sign_receipt(KEY, {**claims, "iss": "elsewhere"}),
        "an error receipt": lambda: sign_receipt(
            KEY, receipt_claims(issuer=ISSUER, now=1, reference="r", refusal=("x", "y"))
        ),
        "not a JWS": lambda: "a.b",
    }[scenario]()
    with pytest.raises(ReceiptInvalid):
        read_receipt(KEY, ISSUER, receipt)
