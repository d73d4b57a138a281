"""Spend budgets and rate limits as a provider's policy declares them, and the pure lookups on
them. No IO: the store sums what was spent, the gate decides with these.

A budget caps the money a provider's operations move in one currency over a rolling window::

    budgets:
      - {scope: tenant, currency: usd, limit: 500000, window: 24h}   # 5,000.00 USD per tenant

Scopes, exactly:

- ``provider``: ONE cap shared by every tenant and agent of the provider (the platform's own
  exposure to it).
- ``tenant``: a cap per tenant; each tenant has all of ``limit``, independently of the others.
- ``agent``: a cap per agent (tenant and agent id: ids are only unique per tenant). Only
  operations approved for one named agent can be counted per agent, so with an agent budget
  an approval must name its agent (``agent_id``).

What counts against a budget: the amounts of the provider's operations in the budget's
currency that are dispatched (in flight, or their outcome unknown: the money may have moved)
or confirmed, whose last attempt was claimed within the window. Created ones have sent
nothing, failed ones had no effect. Only rules that read an amount move money; on them, with
a budget in force, an approval needs both its amount and its currency (a refund of the whole
charge, amount absent, could not be counted). The currency of a call whose body carries none
(a Stripe refund is in its charge's currency) is stated by the approval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy.policy.currencies import EXPONENTS

_WINDOW = re.compile(r"^([1-9][0-9]{0,6})(s|m|h|d)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW_SECONDS = 366 * 86400


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BudgetScope(StrEnum):
    PROVIDER = "provider"
    TENANT = "tenant"
    AGENT = "agent"


class BudgetMode(StrEnum):
    """``report``: a claim over the budget is sent anyway and audited ``would_deny``."""

    ENFORCE = "enforce"
    REPORT = "report"


def window_seconds(text: str) -> int:
    """``"24h"`` -> 86400. A whole number and one unit (s, m, h, d), nothing else: ``1.5h``,
    ``24 h``, ``24H`` and ``0s`` are refused rather than guessed at."""
    match = _WINDOW.fullmatch(text)
    if match is None:
        raise ValueError(f"window {text!r} is not a whole number of s, m, h or d (for example 24h)")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds > MAX_WINDOW_SECONDS:
        raise ValueError(f"window {text!r} is longer than 366 days")
    return seconds


class Budget(_Strict):
    scope: BudgetScope
    currency: Annotated[str, Field(pattern=r"^[a-z]{3}$")]
    # minor units of the currency (500000 USD cents: 5,000.00 USD)
    limit: Annotated[int, Field(strict=True, gt=0, le=2**53 - 1)]
    window: Annotated[str, Field(examples=["24h", "30m", "7d"])]
    mode: BudgetMode = BudgetMode.ENFORCE

    @field_validator("currency")
    @classmethod
    def _known_currency(cls, currency: str) -> str:
        if currency.upper() not in EXPONENTS:
            raise ValueError(f"{currency!r} is not an ISO 4217 currency opgate knows")
        return currency

    @field_validator("window")
    @classmethod
    def _parsed_window(cls, window: str) -> str:
        window_seconds(window)
        return window

    @property
    def window_seconds(self) -> int:
        return window_seconds(self.window)


class RateLimit(_Strict):
    """Requests of one agent (or of all agents of one tenant) on this provider: a token bucket
    of ``burst`` requests refilled at ``requests_per_second``, and/or a cap on requests in
    flight at once."""

    requests_per_second: Annotated[float, Field(gt=0, le=100000)] | None = None
    # the bucket's size: how many requests may come at once after a quiet spell (default: the
    # rate rounded up, at least 1)
    burst: Annotated[int, Field(ge=1, le=1000000)] | None = None
    in_flight: Annotated[int, Field(ge=1, le=100000)] | None = None

    @property
    def bucket_size(self) -> int:
        if self.burst is not None:
            return self.burst
        rate = self.requests_per_second or 1.0
        return max(1, int(-(-rate // 1)))


class RateLimits(_Strict):
    per_agent: RateLimit | None = None
    per_tenant: RateLimit | None = None


def no_duplicate_budgets(budgets: list[Budget]) -> list[Budget]:
    """Two budgets of one scope, currency and window would be one budget with two limits."""
    seen: set[tuple[str, str, int]] = set()
    for budget in budgets:
        key = (budget.scope.value, budget.currency, budget.window_seconds)
        if key in seen:
            raise ValueError(
                f"two budgets of scope {budget.scope.value}, currency {budget.currency} and "
                f"window {budget.window}: keep one limit"
            )
        seen.add(key)
    return budgets


@dataclass(frozen=True)
class BudgetKey:
    """One budget as it applies to one operation: which operations it sums over."""

    provider: str
    budget: Budget
    tenant: str | None  # None: every tenant (scope provider)
    agent_id: str | None  # None: every agent of the tenant (or of the provider)

    @property
    def lock_name(self) -> str:
        """What claims on this budget serialise on: every budget of the same scope key and
        currency (windows aside) shares it. Tenant and agent ids are length-prefixed so no
        two keys spell alike."""
        parts = [self.provider, self.budget.scope.value, self.budget.currency]
        parts += [self.tenant or "", self.agent_id or ""]
        return "budget:" + "".join(f"{len(p)}:{p};" for p in parts)

    def describe(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "scope": self.budget.scope.value,
            "tenant": self.tenant,
            "agent_id": self.agent_id,
            "currency": self.budget.currency,
            "limit": self.budget.limit,
            "window": self.budget.window,
            "mode": self.budget.mode.value,
        }


def budgets_for(
    provider: str,
    budgets: list[Budget],
    *,
    tenant: str,
    agent_id: str | None,
    currency: str | None,
) -> list[BudgetKey]:
    """The budgets an operation of ``tenant`` (for ``agent_id``) in ``currency`` counts
    against, in lock order (sorted by lock name, so two claims never wait on each other in
    opposite orders)."""
    if currency is None:
        return []
    keys: list[BudgetKey] = []
    for budget in budgets:
        if budget.currency != currency.lower():
            continue
        if budget.scope is BudgetScope.PROVIDER:
            keys.append(BudgetKey(provider, budget, None, None))
        elif budget.scope is BudgetScope.TENANT:
            keys.append(BudgetKey(provider, budget, tenant, None))
        elif agent_id is not None:
            keys.append(BudgetKey(provider, budget, tenant, agent_id))
    return sorted(keys, key=lambda k: (k.lock_name, k.budget.window_seconds))


def budget_problems(
    budgets: list[Budget],
    *,
    reads_amount: bool,
    amount: int | None,
    currency: str | None,
    agent_id: str | None,
) -> list[str]:
    """Why an approval on a budgeted provider could not be counted against its budgets."""
    if not budgets or not reads_amount:
        return []
    problems: list[str] = []
    if amount is None:
        problems.append("the provider has spend budgets: the approval needs its amount")
    if currency is None:
        problems.append("the provider has spend budgets: the approval needs its currency")
    if agent_id is None and any(b.scope is BudgetScope.AGENT for b in budgets):
        problems.append("the provider has a per-agent budget: the approval needs its agent_id")
    return problems
