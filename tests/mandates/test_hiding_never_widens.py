"""Hiding never widens: for each kind of valid presentation (a person's closed Payment
Mandate, with and without a key binding; an open one with the agent's closed one under it,
bound by ``sd_hash`` or by ``issuer_jwt_hash``; Checkout Mandates, closed and open, beside a
payment; a receipt presented back), hypothesis derives presentations that withhold, reorder,
duplicate or trim its parts. Each must be refused, or decide exactly what the full one decides.

Minting is tests/support/mandates.py's (written from RFC 9901 and AP2, not from the verifier);
the deciding is opgate's own code, called here as the API calls it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from joserfc.jwk import ECKey

from proxy.mandates.ap2 import MandateRefusal, terms_of
from proxy.mandates.chain import Expectation, TrustedKey, verify_presentation
from proxy.mandates.checkout import checkout_of
from proxy.mandates.receipts import ReceiptInvalid, read_receipt, receipt_claims, sign_receipt
from proxy.mandates.sdjwt import SdJwtInvalid
from tests.support.mandates import (
    Signer,
    checkout_jwt,
    closed_checkout,
    closed_checkout_content,
    closed_payment,
    compact,
    digest,
    key_binding,
    open_checkout,
    open_mandate,
    person_claims,
    present_under,
)

AUDIENCE = "opgate.test"
PERSON = Signer("surface-2026")
AGENT = Signer("agent-key")
MERCHANT = Signer("merchant-key")
TRUSTED = {PERSON.kid: TrustedKey("surface", PERSON.public_jwk)}
EXAMPLES = 150
# examples each property ran, by test and kind: printed at the end of a run with -s
RAN: dict[str, int] = {}


def _ran(name: str, count: int) -> None:
    """Record how many examples a property ran; fewer than a third of the asked-for means the
    strategy found too little to vary (the property would prove little)."""
    RAN[name] = count
    print(f"hypothesis examples: {name}: {count}")  # the run's record, shown with -s
    assert count >= EXAMPLES // 3, (name, count)


CAP = {"type": "payment.amount_range", "currency": "USD", "min": 0, "max": 3000}
PAYEES = {
    "type": "payment.allowed_payees",
    "allowed": [
        {"id": "acct_merchant", "name": "Merchant Choice", "website": "https://m.example"},
        {"id": "acct_other", "name": "Other", "website": "https://o.example"},
    ],
}
WINDOW = {"type": "payment.execution_date", "not_before": "2026-01-01", "not_after": "2099-12-31"}
RECURRENCE = {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 2}
BUDGET = {"type": "payment.budget", "max": 5000, "currency": "USD"}
SHOE = {
    "type": "checkout.line_items",
    "items": [{"id": "shoe", "acceptable_items": [{"id": "sku_shoe"}], "quantity": 1}],
}
MERCHANTS = {"type": "checkout.allowed_merchants", "allowed": [{"id": "acct_merchant"}]}


def decide(payment: str, checkout: str | None = None) -> tuple[Any, ...]:
    """What opgate decides of a presentation, as the API decides it (nonce and store aside):
    the refusal's kind, or the terms an operation is made from."""
    expect = Expectation(AUDIENCE, int(time.time()))
    today = datetime.now(UTC).date()
    try:
        verified = verify_presentation(payment, TRUSTED, expect)
        binding = None
        if checkout is not None:
            checkout_binding = checkout_of(verify_presentation(checkout, TRUSTED, expect))
            if isinstance(checkout_binding, MandateRefusal):
                return ("refused", checkout_binding.code)
            binding = checkout_binding
    except SdJwtInvalid as exc:
        return ("refused", type(exc).__name__)
    terms = terms_of(verified, today, binding)
    if isinstance(terms, MandateRefusal):
        return ("refused", terms.code)
    # everything the operation is made from; AP2's receipt reference hashes the presentation
    # as sent (disclosure order included) and names no approval
    return (
        "accepted",
        terms.closed_jwt,
        terms.payee_id,
        terms.amount,
        terms.currency,
        terms.transaction_id,
        terms.instrument_id,
        terms.subject,
        terms.expires_at,
        terms.open_use,
    )


@dataclass(frozen=True)
class Token:
    """One SD-JWT of a presentation, split: the JWT, its disclosures, its key binding."""

    jwt: str
    disclosures: tuple[str, ...]
    kb: str

    @classmethod
    def split(cls, text: str) -> Token:
        jwt, *disclosures, kb = text.split("~")
        return cls(jwt, tuple(disclosures), kb)

    def join(self) -> str:
        return compact(self.jwt, list(self.disclosures), self.kb)


def parts(presentation: str) -> list[Token]:
    """The tokens of a presentation (AP2's chain ``<open>~~<closed>~`` is two)."""
    if "~~" in presentation:
        first, second = presentation.split("~~")
        return [Token.split(first + "~"), Token.split(second)]
    return [Token.split(presentation)]


def joined(tokens: list[Token]) -> str:
    texts = [token.join() for token in tokens]
    return texts[0] if len(texts) == 1 else texts[0].removesuffix("~") + "~~" + texts[1]


@st.composite
def hidden(draw: st.DrawFn, presentation: str) -> str:
    """``presentation`` with, per token, its disclosures withheld, reordered or duplicated, and
    maybe one part trimmed or the key binding dropped."""
    tokens = parts(presentation)
    changed = []
    for token in tokens:
        # each disclosure kept or withheld, the kept ones maybe reordered, one maybe doubled
        kept = [d for d in token.disclosures if draw(st.booleans())]
        disclosures = draw(st.permutations(kept)) if kept and draw(st.booleans()) else kept
        if kept and draw(st.integers(0, 3)) == 0:
            disclosures = [*disclosures, draw(st.sampled_from(kept))]
        disclosures = tuple(disclosures)
        kb = "" if token.kb and draw(st.booleans()) else token.kb
        changed.append(Token(token.jwt, disclosures, kb))
    if draw(st.booleans()):
        which = draw(st.integers(0, len(changed) - 1))
        token = changed[which]
        fields = [token.jwt, *token.disclosures, token.kb]
        at = draw(st.integers(0, len(fields) - 1))
        cut = draw(st.integers(1, 8))
        fields[at] = fields[at][:-cut] if len(fields[at]) > cut else fields[at]
        changed[which] = Token(fields[0], tuple(fields[1:-1]), fields[-1])
    return joined(changed)


def _closed_payment_token(**fields: Any) -> str:
    claims = person_claims(closed_payment(**fields))
    jwt, disclosures = PERSON.sd_jwt(claims, disclose=("payee", "payment_instrument", "exp"))
    return compact(jwt, disclosures)


def _key_bound_payment() -> str:
    holder = Signer("holder")
    claims = person_claims(closed_payment(cnf={"jwk": holder.public_jwk}))
    jwt, disclosures = PERSON.sd_jwt(claims, disclose=("payee", "payment_amount"))
    token = compact(jwt, disclosures)
    return token + key_binding(holder, token, aud=AUDIENCE)


def _open_payment(binding: str, amount: int = 2000) -> str:
    constraints = [CAP, PAYEES, WINDOW, RECURRENCE, BUDGET]
    open_token = open_mandate(PERSON, AGENT, constraints, elements=True)
    return present_under(
        open_token,
        AGENT,
        closed_payment(amount=amount, execution_date="2026-06-01"),
        aud=AUDIENCE,
        binding=binding,
    )


# each kind, and whether the full presentation is accepted: a refused one (over the cap) must
# stay refused however it is shown
PAYMENTS = {
    "closed": (lambda: _closed_payment_token(), "accepted"),
    "closed, key-bound": (_key_bound_payment, "accepted"),
    "open, sd_hash": (lambda: _open_payment("sd_hash"), "accepted"),
    "open, issuer_jwt_hash": (lambda: _open_payment("issuer_jwt_hash"), "accepted"),
    "open over the cap, issuer_jwt_hash": (
        lambda: _open_payment("issuer_jwt_hash", amount=999_999),
        "refused",
    ),
}


@pytest.mark.parametrize("kind", sorted(PAYMENTS))
def test_a_payment_mandate_shown_in_part_decides_nothing_more(kind: str) -> None:
    """Withholding, reordering, duplicating or trimming parts of a valid Payment Mandate
    presentation is refused or decides exactly what the full one decides."""
    mint, outcome = PAYMENTS[kind]
    full_presentation = mint()
    full = decide(full_presentation)
    assert full[0] == outcome, full
    # the splitting and joining the variants are made by changes nothing by itself
    assert joined(parts(full_presentation)) == full_presentation

    ran: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(hidden(full_presentation))
    def check(variant: str) -> None:
        ran.append(variant)
        decided = decide(variant)
        assert decided[0] == "refused" or decided == full, (variant, decided)

    check()
    _ran(f"payment, {kind}", len(ran))


def _checkouts() -> dict[str, tuple[str, str, str]]:
    """(payment, checkout, outcome): a closed checkout, an open one with the agent's, and an
    open one with the agent's buying what the person did not allow (refused)."""
    jwt = checkout_jwt(MERCHANT)
    hat = checkout_jwt(MERCHANT, line_items=[("sku_hat", 1)])
    closed = closed_checkout(PERSON, jwt)
    paid = _closed_payment_token(transaction_id=digest(jwt))
    open_checkout_token = open_checkout(PERSON, AGENT, [SHOE, MERCHANTS], elements=True)
    agents_checkout = present_under(
        open_checkout_token,
        AGENT,
        closed_checkout_content(jwt),
        aud=AUDIENCE,
        binding="issuer_jwt_hash",
    )
    reference = {
        "type": "payment.reference",
        "conditional_transaction_id": digest(open_checkout_token),
    }
    open_payment = present_under(
        open_mandate(PERSON, AGENT, [reference, CAP], elements=True),
        AGENT,
        closed_payment(transaction_id=digest(jwt)),
        aud=AUDIENCE,
        binding="issuer_jwt_hash",
    )
    hat_checkout = present_under(
        open_checkout_token,
        AGENT,
        closed_checkout_content(hat),
        aud=AUDIENCE,
        binding="issuer_jwt_hash",
    )
    # the person's closed payment: no payment.reference binds the open checkout as presented
    hat_payment = _closed_payment_token(transaction_id=digest(hat))
    return {
        "closed checkout": (paid, closed, "accepted"),
        "open checkout": (open_payment, agents_checkout, "accepted"),
        "open checkout of a hat": (hat_payment, hat_checkout, "refused"),
    }


@pytest.mark.parametrize("kind", ["closed checkout", "open checkout", "open checkout of a hat"])
def test_a_checkout_mandate_shown_in_part_decides_nothing_more(kind: str) -> None:
    """Withholding, reordering, duplicating or trimming parts of the Checkout Mandate beside
    a payment is refused or decides exactly what the full pair decides."""
    payment, checkout, outcome = _checkouts()[kind]
    full = decide(payment, checkout)
    assert full[0] == outcome, full
    assert joined(parts(checkout)) == checkout

    ran: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(hidden(checkout))
    def check(variant: str) -> None:
        ran.append(variant)
        decided = decide(payment, variant)
        assert decided[0] == "refused" or decided == full, (variant, decided)

    check()
    _ran(kind, len(ran))


RECEIPT_KEY = ECKey.generate_key("P-256")


@st.composite
def receipt_variants(draw: st.DrawFn, receipt: str) -> str:
    """The receipt's three parts withheld, reordered, duplicated or trimmed."""
    segments = receipt.split(".")
    picks = draw(st.lists(st.integers(0, 2), min_size=1, max_size=5))
    chosen = [segments[i] for i in picks]
    at = draw(st.integers(0, len(chosen) - 1))
    cut = draw(st.integers(0, 6))
    chosen[at] = chosen[at][: len(chosen[at]) - cut]
    return ".".join(chosen)


def test_a_receipt_presented_back_in_part_names_nothing_else() -> None:
    """A receipt opgate signed, presented back with parts withheld, reordered, duplicated or
    trimmed, is refused or read as exactly what opgate signed."""
    operation = {"operation_id": "ap2_x", "status": "confirmed", "provider_response": None}
    claims = receipt_claims(issuer=AUDIENCE, now=1, reference="r", operation=operation)
    receipt = sign_receipt(RECEIPT_KEY, claims)
    full = read_receipt(RECEIPT_KEY, AUDIENCE, receipt)

    ran: list[str] = []

    @settings(max_examples=EXAMPLES * 2, deadline=None)
    @given(receipt_variants(receipt))
    def check(variant: str) -> None:
        ran.append(variant)
        try:
            read = read_receipt(RECEIPT_KEY, AUDIENCE, variant)
        except ReceiptInvalid:
            return
        assert read == full, variant

    check()
    _ran("receipt presented back", len(ran))
