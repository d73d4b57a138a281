"""AP2 v0.2 Payment Mandates read as an approval: the closed mandate's payee, amount and
currency, and, for an open mandate, every constraint evaluated against the agent's closed one.
Pure: the verified claims in, terms or a refusal out.

Field names are AP2's (``docs/ap2/payment_mandate.md``, ``code/sdk/schemas/ap2/*.json``):
``vct`` ``mandate.payment.1`` (closed) and ``mandate.payment.open.1`` (open); closed content
``transaction_id``, ``payee`` {``id``, ``name``, ``website``}, ``payment_amount`` {``amount``
in minor units, ``currency``}, ``payment_instrument``, ``execution_date``; open content
``constraints`` and ``cnf``.

Where AP2 leaves a reading open, opgate takes the stricter one and says so:
- ``payment.budget``'s ``max`` is a JSON ``number`` in the schema while every other AP2 amount
  is integer minor units: an integer is read as minor units (the smaller amount), a fraction
  is refused.
- An open mandate with no ``payment.agent_recurrence`` authorises one closed mandate ("MUST
  NOT present any subsequent open Payment ... Mandates without receiving a rejection receipt").
- Constraints opgate cannot evaluate at an egress boundary (``payment.allowed_pisps``; a
  recurrence ``frequency`` other than ``ON_DEMAND``) fail, as AP2 requires of unknown ones
  ("MUST be treated as failing").

The checkout a payment pays (``checkout``: a verified Checkout Mandate, when the agent
presents one) binds it: the closed ``transaction_id`` must be the checkout's ``checkout_hash``,
and ``payment.reference``'s ``conditional_transaction_id`` the hash of the open Checkout
Mandate it was made under (no checkout presented: the constraint fails).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Any

from proxy.mandates.chain import VerifiedMandate
from proxy.mandates.sdjwt import b64url_digest
from proxy.policy.currencies import exponent

PAYMENT = "mandate.payment.1"
PAYMENT_OPEN = "mandate.payment.open.1"
# Claims of an open mandate that describe the mandate itself, not the payment it allows
_ABOUT_THE_MANDATE = {"vct", "constraints", "cnf", "iss", "sub", "iat", "exp", "nbf", "jti"}
_CURRENCY = re.compile(r"^[A-Z]{3}$")
# AP2 constraints an egress boundary cannot evaluate, and why
_NOT_EVALUATED = {
    "payment.allowed_pisps": "opgate does not know which PISP facilitates the payment",
}


class MandateCode(StrEnum):
    INVALID = "mandate_invalid"
    MISMATCH = "mandate_mismatch"
    CONSTRAINT_FAILED = "mandate_constraint_failed"


@dataclass(frozen=True, slots=True)
class MandateRefusal:
    code: MandateCode
    detail: str
    field: str | None = None  # mandate_mismatch: the field that differs
    constraint: str | None = None  # mandate_constraint_failed: the constraint's type


@dataclass(frozen=True, slots=True)
class CheckoutBinding:
    """What a verified Checkout Mandate binds a payment to (``proxy.mandates.checkout``)."""

    checkout_hash: str  # base64url SHA-256 of the merchant's checkout_jwt
    # the open Checkout Mandate as presented, hashed as sd_hash is (AP2 payment.reference's
    # conditional_transaction_id); None for a person's closed checkout
    open_reference: str | None


@dataclass(frozen=True, slots=True)
class OpenMandateUse:
    """What a closed mandate under an open one may still use, checked atomically at creation:
    the open mandate's identity, how many closed mandates it allows, and its budget."""

    open_reference: str
    max_occurrences: int
    budget_max: int | None  # minor units of the closed mandate's currency

    def allows(self, occurrences: int, spent: int, amount: int | None) -> bool:
        """Whether one more use of ``amount`` is within the open mandate, after
        ``occurrences`` uses that spent ``spent`` (counted under its lock: the store's
        ``OpenMandateLimits``). Pure."""
        over_budget = self.budget_max is not None and spent + (amount or 0) > self.budget_max
        return occurrences < self.max_occurrences and not over_budget


@dataclass(frozen=True, slots=True)
class MandateTerms:
    """The approval a verified mandate gives: one payment, to one payee."""

    reference: str  # AP2's receipt reference of the final mandate
    closed_jwt: str  # the final token's issuer-signed JWT: the mandate's identity
    issuer: str
    subject: str  # who approved: the person (sub of the trusted issuer's mandate)
    payee_id: str
    amount: int  # minor units
    currency: str
    transaction_id: str
    expires_at: int | None
    open_use: OpenMandateUse | None
    instrument_id: str | None = None  # payment_instrument.id, when the mandate names one


def terms_of(
    mandate: VerifiedMandate, today: date, checkout: CheckoutBinding | None = None
) -> MandateTerms | MandateRefusal:
    """The terms of a closed mandate, or of an agent's closed mandate within its open one,
    bound to ``checkout`` when the agent presented one."""
    vct = mandate.root.get("vct")
    if mandate.closed is None:
        if vct == PAYMENT_OPEN:
            return MandateRefusal(
                MandateCode.INVALID, "an open mandate needs the agent's closed mandate under it"
            )
        if vct != PAYMENT:
            return MandateRefusal(MandateCode.INVALID, f"vct is not {PAYMENT}")
        return _closed_terms(mandate, mandate.root, None, checkout)
    if vct != PAYMENT_OPEN:
        return MandateRefusal(
            MandateCode.INVALID, f"the delegating mandate's vct is not {PAYMENT_OPEN}"
        )
    closed = mandate.closed
    if closed.get("vct") != PAYMENT:
        return MandateRefusal(MandateCode.INVALID, f"the agent's mandate's vct is not {PAYMENT}")
    changed = unchanged(mandate.root, closed)
    if changed is not None:
        return changed
    use = _evaluate_constraints(
        mandate.root, closed, today, b64url_digest(mandate.root_jwt), checkout
    )
    if isinstance(use, MandateRefusal):
        return use
    return _closed_terms(mandate, closed, use, checkout)


def _closed_terms(
    mandate: VerifiedMandate,
    content: dict[str, Any],
    use: OpenMandateUse | None,
    checkout: CheckoutBinding | None,
) -> MandateTerms | MandateRefusal:
    payee, amount = content.get("payee"), content.get("payment_amount")
    transaction_id = content.get("transaction_id")
    if not isinstance(payee, dict) or not isinstance(payee.get("id"), str) or not payee["id"]:
        return MandateRefusal(MandateCode.INVALID, "payee.id is missing")
    if not isinstance(amount, dict) or set(amount) != {"amount", "currency"}:
        return MandateRefusal(MandateCode.INVALID, "payment_amount is not {amount, currency}")
    minor, currency = amount["amount"], amount["currency"]
    if not isinstance(minor, int) or isinstance(minor, bool) or not 0 < minor <= 2**53 - 1:
        return MandateRefusal(
            MandateCode.INVALID, "payment_amount.amount is not a positive integer"
        )
    if (
        not isinstance(currency, str)
        or not _CURRENCY.fullmatch(currency)
        or exponent(currency) is None
    ):
        return MandateRefusal(
            MandateCode.INVALID, "payment_amount.currency is not an ISO 4217 code in capitals"
        )
    if not isinstance(transaction_id, str) or not transaction_id:
        return MandateRefusal(MandateCode.INVALID, "transaction_id is missing")
    if checkout is not None and transaction_id != checkout.checkout_hash:
        return MandateRefusal(
            MandateCode.MISMATCH,
            "transaction_id is not the checkout_hash of the Checkout Mandate presented",
            field="transaction_id",
        )
    if not isinstance(content.get("payment_instrument"), dict):
        return MandateRefusal(MandateCode.INVALID, "payment_instrument is missing")
    subject = mandate.root.get("sub")
    if not isinstance(subject, str) or not subject:
        return MandateRefusal(MandateCode.INVALID, "the person's mandate names no subject (sub)")
    instrument_id = content["payment_instrument"].get("id")
    exps = [e for e in (mandate.root.get("exp"), content.get("exp")) if isinstance(e, int)]
    return MandateTerms(
        reference=mandate.reference,
        closed_jwt=mandate.closed_jwt,
        issuer=mandate.issuer,
        subject=subject,
        payee_id=payee["id"],
        amount=minor,
        currency=currency,
        transaction_id=transaction_id,
        expires_at=min(exps) if exps else None,
        open_use=use,
        instrument_id=instrument_id if isinstance(instrument_id, str) and instrument_id else None,
    )


def approved_params(
    terms: MandateTerms,
    carried: Mapping[str, str],
    params: Mapping[str, Any],
    absent: Sequence[str] = (),
) -> dict[str, Any] | MandateRefusal:
    """The params of the operation a mandate approves: the agent's ``params`` with the
    mandate's payee, instrument and reference in the parameters that carry them on the call
    (``carried``: the policy rule's ``mandate``, what -> parameter), and none of ``absent``
    (parameters that would pay another payee). The agent may repeat a value, never choose
    another one."""
    for param in absent:
        if param in params:
            return MandateRefusal(
                MandateCode.MISMATCH,
                f"the call's {param} would pay another payee than the mandate's",
                field="payee",
            )
    values = {
        "payee": terms.payee_id,
        "payment_instrument": terms.instrument_id,
        "reference": terms.transaction_id,
    }
    approved = dict(params)
    for what, param in carried.items():
        value = values[what]
        if value is None:
            return MandateRefusal(
                MandateCode.INVALID, f"{what}.id is missing: the call carries it in {param}"
            )
        if param in approved and approved[param] != value:
            return MandateRefusal(
                MandateCode.MISMATCH,
                f"the call's {param} is not the mandate's {what}",
                field=what,
            )
        approved[param] = value
    return approved


def x402_approved_params(
    terms: MandateTerms, params: Mapping[str, Any], atomic: int | None
) -> dict[str, Any] | MandateRefusal:
    """The params of the x402 operation a mandate approves (policy ``X402_TERMS``): the agent's
    ``params`` (the resource, asset and network it names; the rule's own lists hold them at
    the payment) with the mandate's payee as ``x402_pay_to`` and its amount, ``atomic`` units
    of the asset through the payments file's peg (None: it does not convert exactly, or the
    asset has no peg to the mandate's currency), as ``x402_max_amount``. The agent may repeat
    either, never choose another value."""
    if atomic is None:
        return MandateRefusal(
            MandateCode.MISMATCH,
            f"the mandate's {terms.amount} ({terms.currency} minor units) is not a whole number "
            "of atomic units of an asset pegged to its currency in the payments file",
            field="payment_amount",
        )
    approved = dict(params)
    for param, what, value in (
        ("x402_pay_to", "payee", terms.payee_id),
        ("x402_max_amount", "payment_amount", str(atomic)),
    ):
        if param in approved and approved[param] != value:
            return MandateRefusal(
                MandateCode.MISMATCH, f"the call's {param} is not the mandate's {what}", field=what
            )
        approved[param] = value
    return approved


def unchanged(open_content: dict[str, Any], closed: dict[str, Any]) -> MandateRefusal | None:
    """AP2: "verify the closed Mandate Content has these values unchanged"."""
    for name, value in open_content.items():
        if name in _ABOUT_THE_MANDATE:
            continue
        if closed.get(name) != value:
            return MandateRefusal(
                MandateCode.MISMATCH,
                f"the closed mandate changes {name}, which the open mandate fixes",
                field=name,
            )
    return None


def failed(kind: str, detail: str) -> MandateRefusal:
    """A constraint of ``kind`` fails (named; an unknown type is named ``unknown``)."""
    return MandateRefusal(MandateCode.CONSTRAINT_FAILED, detail, constraint=kind)


def _evaluate_constraints(
    open_content: dict[str, Any],
    closed: dict[str, Any],
    today: date,
    open_reference: str,
    checkout: CheckoutBinding | None,
) -> OpenMandateUse | MandateRefusal:
    constraints = open_content.get("constraints", [])
    if not isinstance(constraints, list):
        return MandateRefusal(MandateCode.INVALID, "constraints is not an array")
    amount = closed.get("payment_amount")
    if not isinstance(amount, dict):
        return MandateRefusal(MandateCode.INVALID, "payment_amount is missing")
    minor, currency = amount.get("amount"), amount.get("currency")
    max_occurrences, budget_max = 1, None
    for constraint in constraints:
        kind = constraint.get("type") if isinstance(constraint, dict) else None
        if not isinstance(kind, str):
            return MandateRefusal(MandateCode.INVALID, "a constraint has no type")
        if kind in _NOT_EVALUATED:
            return failed(kind, _NOT_EVALUATED[kind])
        if kind == "payment.amount_range":
            low, high = constraint.get("min", 0), constraint.get("max")
            if not _integers(low, high) or constraint.get("currency") != currency:
                return failed(kind, "the range's currency or bounds do not read as minor units")
            if not (isinstance(minor, int) and low <= minor <= high):
                return failed(kind, f"the amount is outside {low}..{high} {currency}")
        elif kind == "payment.allowed_payees":
            if not _listed(closed.get("payee"), constraint.get("allowed")):
                return failed(kind, "the payee is not one the person allowed")
        elif kind == "payment.allowed_payment_instruments":
            if not _listed(closed.get("payment_instrument"), constraint.get("allowed")):
                return failed(kind, "the payment instrument is not one the person allowed")
        elif kind == "payment.execution_date":
            if not _within_dates(closed.get("execution_date"), constraint, today):
                return failed(kind, "the execution date is outside the allowed window")
        elif kind == "payment.budget":
            high = constraint.get("max")
            if not _integers(high) or constraint.get("currency") != currency:
                return failed(kind, "the budget's max or currency do not read as minor units")
            budget_max = high
        elif kind == "payment.reference":
            # AP2: the checkout "MUST contain an open Checkout Mandate with a matching hash in
            # its delegate chain"; only a presented checkout can show it
            reference = constraint.get("conditional_transaction_id")
            if checkout is None or checkout.open_reference is None:
                return failed(kind, "no open Checkout Mandate was presented with the payment")
            if not isinstance(reference, str) or reference != checkout.open_reference:
                return failed(kind, "the checkout was not made under the open checkout named")
        elif kind == "payment.agent_recurrence":
            occurrences = constraint.get("max_occurrences")
            if constraint.get("frequency") != "ON_DEMAND" or not _integers(occurrences):
                return failed(kind, "only ON_DEMAND with max_occurrences is evaluated")
            max_occurrences = occurrences
        else:
            # named "unknown": the type is the mandate's text, never echoed back
            return failed("unknown", "a constraint opgate cannot evaluate (AP2: it fails)")
    return OpenMandateUse(
        open_reference=open_reference,
        max_occurrences=max_occurrences,
        budget_max=budget_max,
    )


def _integers(*values: object) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def _listed(value: object, allowed: object) -> bool:
    return isinstance(allowed, list) and value is not None and any(value == a for a in allowed)


def _within_dates(execution: object, constraint: dict[str, Any], today: date) -> bool:
    try:
        day = today if execution is None else _day(execution)
        low, high = constraint.get("not_before"), constraint.get("not_after")
        return (low is None or _day(low) <= day) and (high is None or day <= _day(high))
    except ValueError:
        return False


def _day(value: object) -> date:
    """The UTC day of an ISO 8601 date or date-time; its year is checked (2..9998) before the
    conversion to UTC, which a date at either end of datetime's range overflows."""
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError("not a date")
    if "T" not in value:
        return date.fromisoformat(value)
    moment = datetime.fromisoformat(value)
    if not 1 < moment.year < 9999:
        raise ValueError("a date outside the years opgate converts")
    return moment.astimezone(UTC).date()
