"""Spend budgets at claim time: which budgets an operation counts against, whether the sums
leave room for it (pure), and the claim made under the budgets' locks.

The claim is the authority: ``Store.claim_within_budgets`` takes each budget's advisory lock in
the claim's transaction, sums what the budget has spent (the operation itself left out, so a
re-send never counts twice), and claims only if ``BudgetClaim.admits`` those sums, so claims on
several opgate processes can never spend more than a budget together. What a sum counts is one
SQL condition shared with open mandates (``opgate_spends``, migration 0024): every claimed
operation that may have left, a revoked one included; only a failed one, or one revoked before
anything of it was sent, is left out. Everything else that
shows a remaining budget (an approval refused early, ``GET /v1/budgets``, ``/metrics``) reads
the same sums without the lock: advice, never a decision. The policy set's x402 limits
(proxy/policy/payments.py) are judged where a payment is kept (proxy/gate/x402_pay.py); their
standing is shown here beside the budgets (``x402_standings``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from proxy.gate.decision import Deny
from proxy.gate.reasons import Reason
from proxy.policy.amounts import human_amount
from proxy.policy.budgets import (
    BudgetKey,
    BudgetMode,
    BudgetScope,
    budget_problems,
    budgets_for,
)
from proxy.policy.model import Mode, Provider, Rule
from proxy.policy.payments import PaymentLimitKey, PaymentScope, X402Limits
from proxy.policy.set import PolicySet
from proxy.store.operation import Operation
from proxy.store.store import BudgetSum, Store
from proxy.store.x402 import PaymentLimitSum, X402Payments


@dataclass(frozen=True)
class Standing:
    """One budget, what it has spent in its window, and what is left of it."""

    key: BudgetKey
    spent: int

    @property
    def remaining(self) -> int:
        return max(0, self.key.budget.limit - self.spent)

    def to_public(self) -> dict[str, Any]:
        return {**self.key.describe(), "spent": self.spent, "remaining": self.remaining}


def budget_sum(key: BudgetKey) -> BudgetSum:
    return BudgetSum(
        lock_name=key.lock_name,
        provider=key.provider,
        currency=key.budget.currency,
        tenant=key.tenant,
        agent_id=key.agent_id,
        window_seconds=key.budget.window_seconds,
    )


def exceeded(keys: list[BudgetKey], spent: list[int], amount: int) -> Deny | None:
    """The refusal when ``amount`` more would take any of ``keys`` over its limit (the one
    with the least left is named), else None. Pure."""
    over = [
        Standing(key, used)
        for key, used in zip(keys, spent, strict=True)
        if used + amount > key.budget.limit
    ]
    if not over:
        return None
    tightest = min(over, key=lambda s: s.remaining)
    budget = tightest.key.budget

    def shown(minor_units: int) -> str:
        return human_amount(minor_units, budget.currency)

    return Deny(
        Reason.BUDGET_EXCEEDED,
        f"{shown(amount)} would exceed the {budget.scope.value} budget of "
        f"{shown(budget.limit)} per {budget.window}: {shown(tightest.remaining)} remaining",
        extra={"budget": {**tightest.to_public(), "amount": amount}},
    )


@dataclass(frozen=True)
class BudgetClaim:
    """The budgets one claim is made under, and how their sums are judged."""

    keys: list[BudgetKey]
    amount: int
    enforced: list[bool]  # per key: False in shadow mode (the budget's or the rule's)
    # shadow mode: why the operation could not have been counted (budget_claim)
    uncounted: Deny | None = None

    def judge(self, spent: list[int]) -> tuple[Deny | None, Deny | None]:
        """(refusal, would_deny): what the enforced budgets refuse, and what the reported
        ones (or any, in shadow mode) would have refused."""
        if self.uncounted is not None:
            return None, self.uncounted
        enforced = [(k, s) for k, s, e in zip(self.keys, spent, self.enforced, strict=True) if e]
        refusal = exceeded([k for k, _ in enforced], [s for _, s in enforced], self.amount)
        return refusal, None if refusal else exceeded(self.keys, spent, self.amount)

    def admits(self, spent: list[int]) -> bool:
        return self.judge(spent)[0] is None


def budget_claim(provider: Provider, rule: Rule, op: Operation) -> BudgetClaim | Deny | None:
    """The budgets ``op`` is claimed under; None when none applies (the plain, unlocked claim);
    a Deny when the operation could not be counted against a budget that applies (an approval
    made before the budget was declared: fail closed)."""
    if not provider.budgets or rule.amount is None:
        return None
    shadow = provider.mode_for(rule) is Mode.REPORT
    uncountable = budget_problems(
        provider.budgets,
        reads_amount=True,
        amount=op.amount,
        currency=op.currency,
        agent_id=op.agent_id,
    )
    if uncountable:
        refusal = Deny(Reason.BUDGET_EXCEEDED, "; ".join(uncountable))
        return BudgetClaim([], 0, [], uncounted=refusal) if shadow else refusal
    assert op.amount is not None
    keys = budgets_for(
        provider.provider,
        provider.budgets,
        tenant=op.tenant,
        agent_id=op.agent_id,
        currency=op.currency,
    )
    if not keys:
        return None
    enforced = [not shadow and k.budget.mode is BudgetMode.ENFORCE for k in keys]
    return BudgetClaim(keys, op.amount, enforced)


async def standings(store: Store, keys: list[BudgetKey]) -> list[Standing]:
    """Each budget's spending now (advisory: read without the lock)."""
    spent = await store.budget_spent([budget_sum(k) for k in keys])
    return [Standing(k, s) for k, s in zip(keys, spent, strict=True)]


async def remaining_budget(
    store: Store,
    policy: PolicySet,
    provider: str,
    tenant: str,
    agent_id: str | None,
    currency: str | None,
    amount: int,
) -> Deny | list[Standing]:
    """For an approval or a proposal of ``amount``: the refusal (budget_exceeded, with the
    remaining budget) if the budgets that apply have no room for it now, else their standing
    (empty when none applies). Advisory and not atomic: the claim decides."""
    declared = policy.provider_named(provider)
    if declared is None or currency is None:
        return []
    keys = budgets_for(
        declared.provider, declared.budgets, tenant=tenant, agent_id=agent_id, currency=currency
    )
    now = await standings(store, keys)
    if declared.mode is Mode.REPORT:  # shadow mode refuses nothing, here either
        return now
    enforced = [k for k in keys if k.budget.mode is BudgetMode.ENFORCE]
    spent_enforced = [s.spent for s in now if s.key.budget.mode is BudgetMode.ENFORCE]
    refusal = exceeded(enforced, spent_enforced, amount)
    return refusal if refusal is not None else now


async def budget_standings(
    store: Store,
    providers: list[Provider],
    *,
    tenant: str | None = None,
    agent_id: str | None = None,
) -> list[Standing]:
    """What is left of each budget of ``providers`` (advisory). A provider budget has one
    standing; a tenant or agent budget one per key that spent anything in its window, or only
    the key asked for (``tenant``, with ``agent_id`` for agent budgets), spent or not."""
    found: list[Standing] = []
    for provider in providers:
        for budget in provider.budgets:
            scope = budget.scope
            if scope is BudgetScope.PROVIDER or (
                tenant is not None and (scope is BudgetScope.TENANT or agent_id is not None)
            ):
                key = BudgetKey(
                    provider.provider,
                    budget,
                    None if scope is BudgetScope.PROVIDER else tenant,
                    agent_id if scope is BudgetScope.AGENT else None,
                )
                found.extend(await standings(store, [key]))
                continue
            by_key = await store.budget_spent_by_key(
                provider.provider,
                budget.currency,
                budget.window_seconds,
                tenant=True,
                agent=scope is BudgetScope.AGENT,
            )
            found.extend(
                Standing(BudgetKey(provider.provider, budget, t, a), spent)
                for t, a, spent in by_key
                if tenant is None or t == tenant
            )
    return found


def payment_limit_sum(key: PaymentLimitKey) -> PaymentLimitSum:
    return PaymentLimitSum(
        lock_name=key.lock_name,
        tenant=key.tenant,
        agent_id=key.agent_id,
        network=key.network,
        asset=key.asset,
        window_seconds=key.window_seconds,
    )


@dataclass(frozen=True)
class X402Standing:
    """One x402 limit of one tenant (or agent), what its payments paid in its window (the
    amounts' sum, in the asset's atomic units, and how many), and what is left."""

    key: PaymentLimitKey
    spent: int
    payments: int

    def to_public(self) -> dict[str, Any]:
        used = self.spent if self.key.budget is not None else self.payments
        shown = {**self.key.describe(), "spent": str(self.spent), "payments": self.payments}
        left = max(0, self.key.limit - used)
        return shown | {"remaining": str(left) if self.key.budget is not None else left}


async def x402_standings(
    store: Store, limits: X402Limits, *, tenant: str | None = None, agent_id: str | None = None
) -> list[X402Standing]:
    """What is left of each x402 limit (advisory, read without the locks): for ``tenant`` (and
    ``agent_id``, for agent limits), spent or not; else for every key that paid in the window."""
    payments = X402Payments(store)
    declared: list[tuple[PaymentScope, int, PaymentLimitKey]] = []
    for budget in limits.budgets:
        key = PaymentLimitKey("", None, budget.window_seconds, budget=budget)
        declared.append((budget.scope, budget.window_seconds, key))
    for rate in limits.rate_limits:
        key = PaymentLimitKey("", None, rate.window_seconds, rate_limit=rate)
        declared.append((rate.scope, rate.window_seconds, key))
    found: list[X402Standing] = []
    for scope, window, template in declared:
        per_agent = scope is PaymentScope.AGENT
        if tenant is not None and (not per_agent or agent_id is not None):
            key = replace(template, tenant=tenant, agent_id=agent_id if per_agent else None)
            [(spent, count)] = await payments.limit_spent([payment_limit_sum(key)])
            found.append(X402Standing(key, spent, count))
            continue
        by_key = await payments.limit_spent_by_key(
            template.network, template.asset, window, per_agent=per_agent
        )
        found.extend(
            X402Standing(replace(template, tenant=t, agent_id=a), spent, count)
            for t, a, spent, count in by_key
            if tenant is None or t == tenant
        )
    return found
