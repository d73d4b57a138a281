"""AP2 mandates read as terms: closed values, open-to-closed unchanged values, constraints."""

from __future__ import annotations

import time
from datetime import date
from typing import Any

import pytest

from proxy.mandates.ap2 import (
    MandateCode,
    MandateRefusal,
    MandateTerms,
    OpenMandateUse,
    terms_of,
)
from proxy.mandates.chain import Expectation, TrustedKey, verify_presentation
from proxy.mandates.sdjwt import SdJwtInvalid
from tests.support.mandates import (
    Signer,
    closed_mandate,
    closed_payment,
    key_binding,
    open_mandate,
    present_under,
)

AUD = "opgate.test"
TODAY = date.today()


@pytest.fixture
def person() -> Signer:
    return Signer("surface-1")


@pytest.fixture
def agent() -> Signer:
    return Signer("agent-1")


def terms(presentation: str, person: Signer) -> MandateTerms | MandateRefusal:
    trusted = {person.kid: TrustedKey("surface", person.public_jwk)}
    verified = verify_presentation(presentation, trusted, Expectation(AUD, int(time.time())))
    return terms_of(verified, TODAY)


def under(person: Signer, agent: Signer, constraints: list[dict[str, Any]], **closed: Any) -> str:
    open_token = open_mandate(person, agent, constraints)
    return present_under(open_token, agent, closed_payment(**closed), aud=AUD)


def test_a_closed_mandate_gives_its_terms(person: Signer) -> None:
    """Payee, amount in minor units, currency and subject come from the person's mandate."""
    got = terms(closed_mandate(person, amount=1099, currency="JPY"), person)
    assert isinstance(got, MandateTerms)
    assert (got.payee_id, got.amount, got.currency, got.subject) == (
        "acct_merchant",
        1099,
        "JPY",
        "alice",
    )
    assert got.open_use is None


@pytest.mark.parametrize(
    ("scenario", "fields"),
    [
        ("lower-case currency", {"currency": "usd"}),
        ("unknown currency", {"currency": "XYZ"}),
        ("zero amount", {"amount": 0}),
        ("amount as text", {"amount": "2500"}),
        ("amount as a float", {"amount": 25.0}),
    ],
)
def test_an_ambiguous_closed_amount_is_invalid(
    person: Signer, scenario: str, fields: dict[str, Any]
) -> None:
    """Amounts are integer minor units of an ISO 4217 code in capitals; nothing is coerced."""
    got = terms(closed_mandate(person, **fields), person)
    assert isinstance(got, MandateRefusal)
    assert got.code is MandateCode.INVALID


def test_an_open_mandate_alone_authorises_nothing(person: Signer, agent: Signer) -> None:
    """An open mandate without the agent's closed one under it is refused, even key-bound."""
    open_token = open_mandate(person, agent, [])
    with pytest.raises(SdJwtInvalid, match="key binding"):
        terms(open_token, person)
    got = terms(open_token + key_binding(agent, open_token, aud=AUD), person)
    assert isinstance(got, MandateRefusal)
    assert "closed mandate" in got.detail


def test_within_every_constraint_the_closed_terms_hold(person: Signer, agent: Signer) -> None:
    """Amount range, payees, instruments, dates, budget and recurrence all pass: terms result."""
    payee = closed_payment()["payee"]
    instrument = closed_payment()["payment_instrument"]
    constraints = [
        {"type": "payment.amount_range", "min": 100, "max": 5000, "currency": "USD"},
        {"type": "payment.allowed_payees", "allowed": [payee]},
        {"type": "payment.allowed_payment_instruments", "allowed": [instrument]},
        {"type": "payment.execution_date", "not_after": "2999-01-01"},
        {"type": "payment.budget", "max": 10000, "currency": "USD"},
        {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 4},
    ]
    got = terms(under(person, agent, constraints), person)
    assert isinstance(got, MandateTerms), got
    assert got.open_use is not None
    assert (got.open_use.max_occurrences, got.open_use.budget_max) == (4, 10000)


def test_an_open_mandate_without_recurrence_allows_one(person: Signer, agent: Signer) -> None:
    """No agent_recurrence: the open mandate authorises one closed mandate."""
    got = terms(under(person, agent, []), person)
    assert isinstance(got, MandateTerms)
    assert got.open_use is not None
    assert got.open_use.max_occurrences == 1


@pytest.mark.parametrize(
    ("scenario", "constraint", "closed"),
    [
        ("one unit over", {"type": "payment.amount_range", "max": 2499, "currency": "USD"}, {}),
        ("currency case", {"type": "payment.amount_range", "max": 9999, "currency": "usd"}, {}),
        ("other payee", {"type": "payment.allowed_payees", "allowed": [{"id": "x"}]}, {}),
        ("late", {"type": "payment.execution_date", "not_after": "2000-01-01"}, {}),
        ("budget in major", {"type": "payment.budget", "max": 100.5, "currency": "USD"}, {}),
        ("monthly", {"type": "payment.agent_recurrence", "frequency": "MONTHLY"}, {}),
        ("reference", {"type": "payment.reference", "conditional_transaction_id": "x"}, {}),
        ("unknown", {"type": "com.example.loyalty", "tier": "gold"}, {}),
    ],
)
def test_a_failing_or_unknown_constraint_names_itself(
    person: Signer, agent: Signer, scenario: str, constraint: dict[str, Any], closed: Any
) -> None:
    """Each failing constraint, and every unknown one (AP2: MUST fail), is named."""
    got = terms(under(person, agent, [constraint], **closed), person)
    assert isinstance(got, MandateRefusal)
    assert got.code is MandateCode.CONSTRAINT_FAILED
    named = constraint["type"] if constraint["type"].startswith("payment.") else "unknown"
    assert got.constraint == named


def test_the_closed_mandate_keeps_what_the_open_one_fixed(person: Signer, agent: Signer) -> None:
    """A payee fixed in the open mandate cannot change in the agent's closed one."""
    fixed = {"payee": {"id": "acct_merchant", "name": "Merchant Choice"}}
    open_token = open_mandate(person, agent, [], **fixed)
    chain = present_under(open_token, agent, closed_payment(payee_id="acct_other"), aud=AUD)
    got = terms(chain, person)
    assert isinstance(got, MandateRefusal)
    assert got.code is MandateCode.MISMATCH
    assert got.field == "payee"


def test_an_open_mandate_allows_a_use_within_its_count_and_its_budget() -> None:
    """One more use is allowed while fewer than max_occurrences were made and the budget
    (when it has one) holds the new amount too; the bounds are exact."""
    use = OpenMandateUse("open", max_occurrences=3, budget_max=1000)
    assert use.allows(2, 900, 100)
    assert not use.allows(3, 0, 0)
    assert not use.allows(2, 901, 100)
    assert use.allows(0, 1000, None)  # no amount: nothing added
    assert OpenMandateUse("open", max_occurrences=1, budget_max=None).allows(0, 10**12, 10**12)
