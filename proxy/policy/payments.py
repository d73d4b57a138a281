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
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from proxy.policy.budgets import window_seconds

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


class X402Limits(_Strict):
    budgets: list[X402Budget] = Field(default_factory=list)
    rate_limits: list[X402RateLimit] = Field(default_factory=list)

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


NO_LIMITS = X402Limits()
__all__ = [
    "NO_LIMITS",
    "OverLimit",
    "PaymentLimitKey",
    "Payments",
    "PaymentsPolicy",
    "Spent",
    "X402Budget",
    "X402Limits",
    "X402RateLimit",
    "is_payments_document",
    "limits_for",
    "over_limit",
]
