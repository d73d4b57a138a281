"""The pure budget decision at claim (proxy/gate/budgets.py): room, the tightest budget named,
and shadow mode reporting instead of refusing."""

from __future__ import annotations

from proxy.gate.budgets import BudgetClaim, exceeded
from proxy.gate.reasons import Reason
from proxy.policy.budgets import Budget, BudgetKey


def key(scope: str, limit: int, mode: str = "enforce", tenant: str | None = "t1") -> BudgetKey:
    budget = Budget.model_validate(
        {"scope": scope, "currency": "usd", "limit": limit, "window": "24h", "mode": mode}
    )
    return BudgetKey("pay", budget, None if scope == "provider" else tenant, None)


def test_exactly_the_limit_fits_and_one_more_does_not() -> None:
    """spent + amount == limit is allowed; one minor unit more is budget_exceeded."""
    keys = [key("tenant", 1000)]
    assert exceeded(keys, [600], 400) is None
    refusal = exceeded(keys, [601], 400)
    assert refusal is not None
    assert refusal.reason is Reason.BUDGET_EXCEEDED
    assert refusal.extra is not None
    assert refusal.extra["budget"]["remaining"] == 399


def test_the_budget_with_least_left_is_named() -> None:
    """Of two exceeded budgets, the refusal names the one with less remaining."""
    keys = [key("provider", 5000), key("tenant", 1000)]
    refusal = exceeded(keys, [4900, 950], 200)
    assert refusal is not None
    assert refusal.extra is not None
    assert (refusal.extra["budget"]["scope"], refusal.extra["budget"]["remaining"]) == (
        "tenant",
        50,
    )


def test_a_reported_budget_only_would_deny() -> None:
    """A budget in report mode never refuses: it is named as would_deny while an enforced one
    with room admits the claim."""
    claim = BudgetClaim([key("provider", 5000), key("tenant", 100, "report")], 500, [True, False])
    refusal, would_deny = claim.judge([0, 0])
    assert refusal is None
    assert would_deny is not None
    assert would_deny.reason is Reason.BUDGET_EXCEEDED
    assert claim.admits([0, 0])
    assert not claim.admits([4600, 0])
    assert claim.judge([0, 0]) == claim.judge([0, 0])


def test_the_refusal_says_the_amounts_in_the_currency_a_person_reads() -> None:
    """The refusal's sentence spells every amount in its currency's exponent (the product's one
    formatter), never as minor units; the attached budget keeps the minor units."""
    refusal = exceeded([key("tenant", 100000)], [98000], 2500)
    assert refusal is not None
    assert refusal.detail == (
        "25.00 USD would exceed the tenant budget of 1000.00 USD per 24h: 20.00 USD remaining"
    )
