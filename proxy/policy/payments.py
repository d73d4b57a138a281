"""Limits on x402 payments across every provider and payee, as the policy set declares them once,
and the pure lookups and judgement on them. No IO: the store sums what was paid, under each
limit's lock, in the transaction that keeps a payment (proxy/store/x402.py).

One file of the policy directory holds them (no ``provider:``; at most one such file)::

    version: 1
    payments:
      x402:
        budgets:    # in the asset's atomic units (USDC: 6 decimals; 5000000 is 5 USDC)
          - {scope: tenant, network: "eip155:8453",
             asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", limit: 5000000, window: 24h}
        rate_limits:
          - {scope: agent, max_payments: 20, window: 1h}

A budget caps what the payments of one tenant (``scope: tenant``) or of one agent of a tenant
(``scope: agent``: the operation's approved ``agent_id``) pay in one asset on one network over a
rolling window, whatever the payee and whatever the provider; a rate limit caps how many
payments they make, in any asset. What counts: every payment kept for an operation (signed by
opgate, or the agent's own bound to it) in the window and not released (proven unpaid by the
token: proxy/recovery/x402_state.py); a payment kept may have settled. An operation's payment
counts once: sending it again counts nothing.

A peg names the currency an asset is worth, one to one (``pegs: [{network, asset, currency,
decimals}]``: USDC on Base is USD with 6 decimals): an AP2 open mandate's budget is in minor
units of a currency, x402 payments in the asset's atomic units, and the payments kept under an
open mandate are summed against its budget through the pegs, exactly (``mandate_over_budget``).
A payment in an asset without a peg to the mandate's currency is refused: it cannot be counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from proxy.policy.budgets import window_seconds
from proxy.policy.currencies import exponent

_MAX_UINT256 = 2**256 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PaymentScope(StrEnum):
    TENANT = "tenant"
    AGENT = "agent"


class _Windowed(_Strict):
    scope: PaymentScope
    window: Annotated[str, Field(examples=["24h", "30m", "7d"])]

    @field_validator("window")
    @classmethod
    def _parsed_window(cls, window: str) -> str:
        window_seconds(window)
        return window

    @property
    def window_seconds(self) -> int:
        return window_seconds(self.window)


class X402Budget(_Windowed):
    """What one tenant's (or agent's) payments may pay in ``asset`` on ``network`` per
    ``window``, in the asset's atomic units, across every payee."""

    network: Annotated[str, Field(pattern=r"^eip155:[1-9][0-9]{0,17}$")]
    asset: Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$")]
    limit: Annotated[int, Field(strict=True, gt=0, le=_MAX_UINT256)]


class X402RateLimit(_Windowed):
    """How many payments one tenant (or agent) may make per ``window``, in any asset."""

    max_payments: Annotated[int, Field(strict=True, ge=1, le=1_000_000)]


class X402Peg(_Strict):
    """``asset`` on ``network`` is worth one ``currency`` (an ISO 4217 code opgate knows the
    exponent of) per 10^``decimals`` atomic units: how a payment is counted against an AP2 open
    mandate's budget, which is in the currency's minor units."""

    network: Annotated[str, Field(pattern=r"^eip155:[1-9][0-9]{0,17}$")]
    asset: Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$")]
    currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$", examples=["USD"])]
    decimals: Annotated[int, Field(strict=True, ge=0, le=36)]

    @field_validator("currency")
    @classmethod
    def _known_currency(cls, currency: str) -> str:
        if exponent(currency) is None:
            raise ValueError(f"{currency} is not an ISO 4217 currency opgate knows the exponent of")
        return currency

    def value(self, atomic: int) -> Fraction:
        """``atomic`` units of the asset in units of the currency, exactly."""
        return Fraction(atomic, 10**self.decimals)


class X402Limits(_Strict):
    budgets: list[X402Budget] = Field(default_factory=list)
    rate_limits: list[X402RateLimit] = Field(default_factory=list)
    pegs: list[X402Peg] = Field(default_factory=list)

    def peg(self, network: str, asset: str) -> X402Peg | None:
        """The peg of ``asset`` on ``network`` (any case of its hex digits), if one is set."""
        for peg in self.pegs:
            if peg.network == network and peg.asset.lower() == asset.lower():
                return peg
        return None

    @model_validator(mode="after")
    def _one_limit_per_key(self) -> X402Limits:
        seen: set[tuple[str, ...]] = set()
        for b in self.budgets:
            key = (b.scope.value, b.network, b.asset.lower(), str(b.window_seconds))
            if key in seen:
                raise ValueError(
                    f"two budgets of scope {b.scope.value}, network {b.network}, asset {b.asset} "
                    f"and window {b.window}: keep one limit"
                )
            seen.add(key)
        for r in self.rate_limits:
            key = ("rate", r.scope.value, "", str(r.window_seconds))
            if key in seen:
                raise ValueError(
                    f"two rate limits of scope {r.scope.value} and window {r.window}: keep one"
                )
            seen.add(key)
        for p in self.pegs:
            key = ("peg", p.network, p.asset.lower(), "")
            if key in seen:
                raise ValueError(f"two pegs of asset {p.asset} on network {p.network}: keep one")
            seen.add(key)
        return self


class Payments(_Strict):
    x402: X402Limits = Field(default_factory=X402Limits)


class PaymentsPolicy(_Strict):
    """The policy file that holds the set's payment limits (``payments:``, no ``provider:``)."""

    version: Literal[1]
    payments: Payments


def is_payments_document(data: object) -> bool:
    """Whether a policy file's parsed YAML is the payments file rather than a provider's."""
    return isinstance(data, dict) and "payments" in data and "provider" not in data


@dataclass(frozen=True)
class PaymentLimitKey:
    """One limit as it applies to one payment: which kept payments it sums over, and the lock
    payments under it take turns on. ``budget`` or ``rate_limit``, exactly one."""

    tenant: str
    agent_id: str | None  # None: every agent of the tenant
    window_seconds: int
    budget: X402Budget | None = None
    rate_limit: X402RateLimit | None = None

    @property
    def network(self) -> str | None:
        return self.budget.network if self.budget else None

    @property
    def asset(self) -> str | None:
        return self.budget.asset.lower() if self.budget else None

    @property
    def window(self) -> str:
        limit = self.budget if self.budget is not None else self.rate_limit
        assert limit is not None
        return limit.window

    @property
    def limit(self) -> int:
        if self.budget is not None:
            return self.budget.limit
        assert self.rate_limit is not None
        return self.rate_limit.max_payments

    @property
    def lock_name(self) -> str:
        """Payments under one limit's key (its scope's tenant and agent, and for a budget its
        network and asset; windows aside) take turns on this lock. Parts are length-prefixed,
        so no two keys spell alike."""
        kind = "budget" if self.budget is not None else "rate"
        parts = [kind, self.tenant, self.agent_id or "", self.network or "", self.asset or ""]
        return "x402:" + "".join(f"{len(p)}:{p};" for p in parts)

    def describe(self) -> dict[str, object]:
        limit = self.budget if self.budget is not None else self.rate_limit
        assert limit is not None
        shown: dict[str, object] = {
            "kind": "x402_budget" if self.budget is not None else "x402_rate_limit",
            "scope": limit.scope.value,
            "tenant": self.tenant,
            "agent_id": self.agent_id,
            "window": self.window,
        }
        if self.budget is not None:
            shown |= {
                "network": self.budget.network,
                "asset": self.budget.asset,
                "limit": str(self.budget.limit),
            }
        else:
            shown["max_payments"] = self.limit
        return shown


def limits_for(
    limits: X402Limits, *, tenant: str, agent_id: str | None, network: str, asset: str
) -> list[PaymentLimitKey] | str:
    """The limits a payment of ``tenant``'s operation (approved for ``agent_id``) in ``asset``
    on ``network`` counts against, in lock order; or why it cannot be counted (an agent limit
    on an operation approved for no named agent: fail closed)."""
    keys: list[PaymentLimitKey] = []
    for budget in limits.budgets:
        if budget.network != network or budget.asset.lower() != asset.lower():
            continue
        if budget.scope is PaymentScope.AGENT and agent_id is None:
            return "a per-agent x402 budget applies: the operation's approval needs its agent_id"
        agent = agent_id if budget.scope is PaymentScope.AGENT else None
        keys.append(PaymentLimitKey(tenant, agent, budget.window_seconds, budget=budget))
    for rate in limits.rate_limits:
        if rate.scope is PaymentScope.AGENT and agent_id is None:
            return (
                "a per-agent x402 rate limit applies: the operation's approval needs its agent_id"
            )
        agent = agent_id if rate.scope is PaymentScope.AGENT else None
        keys.append(PaymentLimitKey(tenant, agent, rate.window_seconds, rate_limit=rate))
    return sorted(keys, key=lambda k: (k.lock_name, k.window_seconds))


@dataclass(frozen=True)
class Spent:
    """What one limit's key has paid in its window: the amounts' sum and how many payments."""

    amount: int
    payments: int


@dataclass(frozen=True)
class OverLimit:
    """The limit one more payment of ``amount`` would break, and what its key had spent."""

    key: PaymentLimitKey
    spent: Spent
    amount: int

    def detail(self) -> str:
        window = self.key.window
        who = f"agent {self.key.agent_id}" if self.key.agent_id else f"tenant {self.key.tenant}"
        if self.key.budget is not None:
            left = max(0, self.key.limit - self.spent.amount)
            return (
                f"paying {self.amount} would exceed the x402 budget of {who} of {self.key.limit} "
                f"(atomic units of {self.key.budget.asset} on {self.key.budget.network}) per "
                f"{window}: {left} remaining"
            )
        return (
            f"one more payment would exceed the x402 rate limit of {who} of {self.key.limit} "
            f"payments per {window}: {self.spent.payments} made"
        )

    def to_public(self) -> dict[str, object]:
        shown = {**self.key.describe(), "spent": str(self.spent.amount)}
        shown |= {"payments": self.spent.payments, "amount": str(self.amount)}
        return shown


def over_limit(keys: list[PaymentLimitKey], spent: list[Spent], amount: int) -> OverLimit | None:
    """The first limit one more payment of ``amount`` would break, else None. Pure."""
    for key, used in zip(keys, spent, strict=True):
        if key.budget is not None and used.amount + amount > key.limit:
            return OverLimit(key, used, amount)
        if key.rate_limit is not None and used.payments + 1 > key.limit:
            return OverLimit(key, used, amount)
    return None


@dataclass(frozen=True)
class MandateOverBudget:
    """Why a payment under an AP2 open mandate is refused: its budget would be passed, or the
    payments cannot be counted against it (an asset without a peg to its currency)."""

    detail: str
    budget_max: int | None  # minor units of currency
    currency: str
    paid: Fraction | None  # in units of currency, before this payment (None: not counted)

    def to_public(self) -> dict[str, object]:
        shown: dict[str, object] = {"currency": self.currency}
        if self.budget_max is not None:
            shown["budget_max"] = str(self.budget_max)
        if self.paid is not None:
            minor = self.paid * 10 ** (exponent(self.currency) or 0)
            shown["paid"] = str(minor) if minor.denominator == 1 else f"{float(minor):.6f}"
        return shown


def mandate_over_budget(
    limits: X402Limits,
    *,
    budget_max: int | None,
    currency: str,
    paid: Sequence[tuple[str, str, int]],
    spent: int = 0,
    network: str,
    asset: str,
    amount: int,
) -> MandateOverBudget | None:
    """Whether one more payment of ``amount`` atomic units of ``asset`` on ``network``, after
    ``paid`` ((network, asset, atomic units) already kept under the open mandate) and ``spent``
    (minor units of ``currency``: its operations approved with an amount), passes the
    open mandate's budget of ``budget_max`` minor units of ``currency`` (None: it has none),
    comparing exact values through the pegs; or cannot be counted (fail closed). Pure."""
    if budget_max is None:
        return None
    places = exponent(currency)
    if places is None:
        return MandateOverBudget(
            f"the open mandate's currency {currency} has no known exponent",
            budget_max,
            currency,
            None,
        )
    total, value = Fraction(spent, 10**places), Fraction(0)
    for net, held, atomic in (*paid, (network, asset, amount)):
        peg = limits.peg(net, held)
        if peg is None or peg.currency != currency.upper():
            return MandateOverBudget(
                f"asset {held} on {net} has no peg to {currency} in the payments file: a payment "
                f"in it cannot be counted against the open mandate's budget",
                budget_max,
                currency,
                None,
            )
        value = peg.value(atomic)  # the last: this payment's
        total += value
    if total <= Fraction(budget_max, 10**places):
        return None
    return MandateOverBudget(
        f"paying {amount} (atomic units of {asset} on {network}) would take the payments under "
        f"the open mandate past its budget of {budget_max} (minor units of {currency})",
        budget_max,
        currency,
        total - value,
    )


def paid_in_minor(
    limits: X402Limits, paid: Sequence[tuple[str, str, int]], currency: str
) -> int | None:
    """What ``paid`` ((network, asset, atomic units)) is worth in minor units of ``currency``
    through the pegs, rounded up (a cap never undercounts); None: an asset has no peg to that
    currency, so it cannot be counted. Pure."""
    places = exponent(currency)
    if places is None:
        return None
    total = Fraction(0)
    for network, asset, atomic in paid:
        peg = limits.peg(network, asset)
        if peg is None or peg.currency != currency.upper():
            return None
        total += peg.value(atomic)
    minor = total * 10**places
    rounded_up: int = -(-minor.numerator // minor.denominator)
    return rounded_up


def to_atomic(peg: X402Peg, minor: int, currency: str) -> int | None:
    """``minor`` units of ``currency`` in the pegged asset's atomic units, when that is a whole
    number (else None: refuse, never round). Pure."""
    places = exponent(currency)
    if places is None or peg.currency != currency.upper():
        return None
    value = Fraction(minor, 10**places) * 10**peg.decimals
    return value.numerator if value.denominator == 1 else None


NO_LIMITS = X402Limits()
__all__ = [
    "NO_LIMITS",
    "MandateOverBudget",
    "OverLimit",
    "PaymentLimitKey",
    "Payments",
    "PaymentsPolicy",
    "Spent",
    "X402Budget",
    "X402Limits",
    "X402Peg",
    "X402RateLimit",
    "is_payments_document",
    "limits_for",
    "mandate_over_budget",
    "over_limit",
    "paid_in_minor",
    "to_atomic",
]
