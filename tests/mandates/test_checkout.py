"""AP2 Checkout Mandates read as the checkout a payment is bound to: the checkout hash, the
payment's transaction_id and payment.reference, and the open checkout's constraints."""

from __future__ import annotations

import time
from datetime import date
from typing import Any

import pytest

from proxy.mandates.ap2 import CheckoutBinding, MandateCode, MandateRefusal, MandateTerms, terms_of
from proxy.mandates.chain import Expectation, TrustedKey, verify_presentation
from proxy.mandates.checkout import checkout_of
from tests.support.mandates import (
    Signer,
    checkout_jwt,
    closed_checkout,
    closed_checkout_content,
    closed_mandate,
    closed_payment,
    digest,
    open_checkout,
    open_mandate,
    present_under,
)

AUD = "opgate.test"
PERSON = Signer("surface-1")
AGENT = Signer("agent-1")
MERCHANT = Signer("merchant-1")


def verified(presentation: str) -> Any:
    trusted = {PERSON.kid: TrustedKey("surface", PERSON.public_jwk)}
    return verify_presentation(presentation, trusted, Expectation(AUD, int(time.time())))


def checkout(presentation: str) -> CheckoutBinding | MandateRefusal:
    return checkout_of(verified(presentation))


def test_a_closed_checkout_binds_the_payment_by_its_hash() -> None:
    """The person's closed Checkout Mandate gives its checkout_hash; a payment whose
    transaction_id is that hash holds, one naming another checkout is mandate_mismatch on
    transaction_id."""
    jwt = checkout_jwt(MERCHANT)
    bound = checkout(closed_checkout(PERSON, jwt))
    assert bound == CheckoutBinding(checkout_hash=digest(jwt), open_reference=None)
    payment = verified(closed_mandate(PERSON, transaction_id=digest(jwt)))
    assert isinstance(terms_of(payment, date.today(), bound), MandateTerms)
    other = verified(closed_mandate(PERSON, transaction_id=digest(checkout_jwt(MERCHANT))))
    refused = terms_of(other, date.today(), bound)
    assert isinstance(refused, MandateRefusal)
    assert (refused.code, refused.field) == (MandateCode.MISMATCH, "transaction_id")


def test_a_checkout_hash_must_be_its_checkout_jwts() -> None:
    """A checkout_hash that is not the hash of the checkout_jwt beside it is mandate_mismatch
    naming checkout_hash; a payment mandate presented as the checkout is invalid."""
    jwt = checkout_jwt(MERCHANT)
    forged = checkout(closed_checkout(PERSON, jwt, checkout_hash=digest("another checkout")))
    assert isinstance(forged, MandateRefusal)
    assert (forged.code, forged.field) == (MandateCode.MISMATCH, "checkout_hash")
    wrong = checkout(closed_mandate(PERSON))
    assert isinstance(wrong, MandateRefusal)
    assert wrong.code is MandateCode.INVALID


# AP2's own example (checkout_mandate.md, "Line Items"): one shoe of two styles, one sock
SHOE_AND_SOCK = {
    "type": "checkout.line_items",
    "items": [
        {
            "id": "id-shoe-choices",
            "acceptable_items": [
                {"id": "BAB1234", "title": "Red Style"},
                {"id": "FAF1234", "title": "Blue Style"},
            ],
            "quantity": 1,
        },
        {
            "id": "id-sock-choices",
            "acceptable_items": [{"id": "QRT1234", "title": "The Best Socks"}],
            "quantity": 1,
        },
    ],
}


@pytest.mark.parametrize(
    ("scenario", "line_items", "met"),
    [
        ("red shoe and socks", [("BAB1234", 1), ("QRT1234", 1)], True),
        ("blue shoe and socks", [("FAF1234", 1), ("QRT1234", 1)], True),
        ("two shoes", [("BAB1234", 1), ("FAF1234", 1)], False),
        ("a red shoe alone", [("BAB1234", 1)], False),
        ("a blue shoe alone", [("FAF1234", 1)], False),
        ("socks alone", [("QRT1234", 1)], False),
        ("one sock too many", [("BAB1234", 1), ("QRT1234", 2)], False),
        ("an item never listed", [("BAB1234", 1), ("QRT1234", 1), ("ZZZ", 1)], False),
    ],
)
def test_line_items_are_met_as_ap2_defines(
    scenario: str, line_items: list[tuple[str, int]], met: bool
) -> None:
    """checkout.line_items: each requirement's quantity of acceptable items and nothing else
    (AP2's maximal flow); the agent's closed checkout under the open one is evaluated."""
    open_token = open_checkout(PERSON, AGENT, [SHOE_AND_SOCK])
    content = closed_checkout_content(checkout_jwt(MERCHANT, line_items=line_items))
    got = checkout(present_under(open_token, AGENT, content, aud=AUD))
    if met:
        assert isinstance(got, CheckoutBinding), got
        assert got.open_reference == digest(open_token)
    else:
        assert isinstance(got, MandateRefusal)
        assert (got.code, got.constraint) == (MandateCode.CONSTRAINT_FAILED, "checkout.line_items")


@pytest.mark.parametrize(
    ("scenario", "constraint", "named"),
    [
        (
            "merchant not allowed",
            {"type": "checkout.allowed_merchants", "allowed": [{"name": "Elsewhere"}]},
            "checkout.allowed_merchants",
        ),
        (
            "no merchant revealed",
            {"type": "checkout.allowed_merchants", "allowed": []},
            "checkout.allowed_merchants",
        ),
        ("unknown", {"type": "com.example.gift_wrap", "wrap": True}, "unknown"),
    ],
)
def test_a_failing_or_unknown_checkout_constraint_names_itself(
    scenario: str, constraint: dict[str, Any], named: str
) -> None:
    """checkout.allowed_merchants fails for a merchant not revealed in allowed; an unknown
    constraint fails (AP2: "MUST be treated as failing")."""
    open_token = open_checkout(PERSON, AGENT, [SHOE_AND_SOCK, constraint])
    jwt = checkout_jwt(MERCHANT, line_items=[("BAB1234", 1), ("QRT1234", 1)])
    got = checkout(present_under(open_token, AGENT, closed_checkout_content(jwt), aud=AUD))
    assert isinstance(got, MandateRefusal)
    assert (got.code, got.constraint) == (MandateCode.CONSTRAINT_FAILED, named)


def test_an_allowed_merchant_passes() -> None:
    """The checkout's merchant matching every field of one revealed allowed entry passes."""
    allowed = {"type": "checkout.allowed_merchants", "allowed": [{"name": "Merchant Choice"}]}
    open_token = open_checkout(PERSON, AGENT, [SHOE_AND_SOCK, allowed])
    jwt = checkout_jwt(MERCHANT, line_items=[("FAF1234", 1), ("QRT1234", 1)])
    got = checkout(present_under(open_token, AGENT, closed_checkout_content(jwt), aud=AUD))
    assert isinstance(got, CheckoutBinding), got


def test_payment_reference_names_the_open_checkout() -> None:
    """payment.reference holds when its conditional_transaction_id is the open Checkout
    Mandate as presented, hashed as sd_hash is; another, or no checkout, fails it."""
    open_checkout_token = open_checkout(PERSON, AGENT, [SHOE_AND_SOCK])
    jwt = checkout_jwt(MERCHANT, line_items=[("BAB1234", 1), ("QRT1234", 1)])
    bound = checkout(
        present_under(open_checkout_token, AGENT, closed_checkout_content(jwt), aud=AUD)
    )
    assert isinstance(bound, CheckoutBinding)

    def payment(reference: str) -> Any:
        constraint = {"type": "payment.reference", "conditional_transaction_id": reference}
        open_payment = open_mandate(PERSON, AGENT, [constraint])
        content = closed_payment(transaction_id=digest(jwt))
        return verified(present_under(open_payment, AGENT, content, aud=AUD))

    assert isinstance(
        terms_of(payment(digest(open_checkout_token)), date.today(), bound), MandateTerms
    )
    for got in (
        terms_of(payment(digest("another open checkout")), date.today(), bound),
        terms_of(payment(digest(open_checkout_token)), date.today(), None),
    ):
        assert isinstance(got, MandateRefusal)
        assert (got.code, got.constraint) == (MandateCode.CONSTRAINT_FAILED, "payment.reference")
