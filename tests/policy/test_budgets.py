"""Budget and rate-limit policy keys (proxy/policy/budgets.py): strict parsing, exact scopes,
and every bad key reported as file:line:col."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.policy.budgets import Budget, BudgetScope, budget_problems, budgets_for, window_seconds
from proxy.policy.lint import Severity, lint_policy_texts
from proxy.policy.load import parse_policy_text

HEAD = """\
version: 1
provider: pay
route_prefix: /pay
upstream: https://pay.example
"""
RULES = """\
rules:
  - name: refund.create
    method: POST
    path: /v1/refunds
    amount: amount
    currency: currency
"""


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45s", 45), ("30m", 1800), ("24h", 86400), ("7d", 604800), ("366d", 366 * 86400)],
    ids=["seconds", "minutes", "hours", "days", "a leap year"],
)
def test_a_window_is_a_whole_number_of_one_unit(text: str, seconds: int) -> None:
    """Windows parse to the seconds they spell."""
    assert window_seconds(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["0s", "1.5h", "24 h", "24H", "h", "24", "1h30m", "-1h", "367d", "024h", "+1h"],
    ids=[
        "zero",
        "a fraction",
        "a space",
        "upper case",
        "no number",
        "no unit",
        "two units",
        "negative",
        "over a year",
        "a leading zero",
        "a sign",
    ],
)
def test_a_window_is_parsed_strictly(text: str) -> None:
    """Anything but digits and one lower-case unit is refused, not guessed at."""
    with pytest.raises(ValueError, match="window"):
        window_seconds(text)


def test_bad_budget_keys_are_each_reported_with_their_line() -> None:
    """An unknown currency, a limit that is not a positive integer, a bad window, an unknown
    scope or mode and an unknown key: each one error at its own line."""
    text = (
        HEAD
        + (
            "budgets:\n"
            "  - {scope: tenant, currency: xyz, limit: 5, window: 24h}\n"
            "  - {scope: tenant, currency: usd, limit: 0, window: 24h}\n"
            "  - {scope: tenant, currency: usd, limit: 10.5, window: 24h}\n"
            "  - {scope: tenant, currency: usd, limit: 5, window: 1.5h}\n"
            "  - {scope: galaxy, currency: usd, limit: 5, window: 24h}\n"
            "  - {scope: agent, currency: usd, limit: 5, window: 24h, mode: loud}\n"
            "  - {scope: agent, currency: usd, limit: 5, window: 1h, cap: 3}\n"
            "  - {scope: agent, currency: USD, limit: 5, window: 2h}\n"
        )
        + RULES
    )
    provider, problems = parse_policy_text(text, "pay.yaml")
    assert provider is None
    found = sorted((p.line, str(p)) for p in problems)
    assert [line for line, _ in found] == [6, 7, 8, 9, 10, 11, 12, 13]
    messages = [message for _, message in found]
    assert "'xyz' is not an ISO 4217 currency" in messages[0]
    assert "greater than 0" in messages[1]
    assert "budgets.2.limit" in messages[2]
    assert "window '1.5h'" in messages[3]
    assert "budgets.4.scope" in messages[4]
    assert "budgets.5.mode" in messages[5]
    assert "budgets.6.cap" in messages[6]
    assert "budgets.7.currency" in messages[7]
    assert all(m.startswith("pay.yaml:") for m in messages)


def test_two_budgets_of_one_scope_currency_and_window_are_refused() -> None:
    """The same scope, currency and window twice would be one budget with two limits."""
    text = (
        HEAD
        + (
            "budgets:\n"
            "  - {scope: tenant, currency: usd, limit: 5, window: 24h}\n"
            "  - {scope: tenant, currency: usd, limit: 9, window: 1d}\n"
        )
        + RULES
    )
    provider, problems = parse_policy_text(text, "pay.yaml")
    assert provider is None
    assert ["keep one limit" in str(p) for p in problems] == [True]


def test_rate_limits_parse_and_refuse_nonsense() -> None:
    """Rates are positive, bursts and in-flight caps whole and positive, keys known."""
    good = (
        HEAD
        + (
            "rate_limits:\n"
            "  per_agent: {requests_per_second: 2.5, burst: 5, in_flight: 3}\n"
            "  per_tenant: {requests_per_second: 20}\n"
        )
        + RULES
    )
    provider, problems = parse_policy_text(good, "pay.yaml")
    assert problems == []
    assert provider is not None
    assert provider.rate_limits.per_agent is not None
    assert provider.rate_limits.per_agent.bucket_size == 5
    assert provider.rate_limits.per_tenant is not None
    assert provider.rate_limits.per_tenant.bucket_size == 20
    bad = (
        HEAD
        + ("rate_limits:\n  per_agent: {requests_per_second: 0, in_flight: 0}\n  per_galaxy: {}\n")
        + RULES
    )
    provider, problems = parse_policy_text(bad, "pay.yaml")
    assert provider is None
    assert sorted(p.line for p in problems) == [6, 6, 7]


def budget(scope: str, currency: str = "usd", window: str = "24h") -> Budget:
    return Budget.model_validate(
        {"scope": scope, "currency": currency, "limit": 100, "window": window}
    )


def test_an_operation_counts_against_the_budgets_of_its_currency_and_scope() -> None:
    """Provider budgets span tenants, tenant budgets name the tenant, agent budgets the agent
    (only when the operation names one); other currencies are not counted."""
    declared = [budget("provider"), budget("tenant"), budget("agent"), budget("tenant", "eur")]
    keys = budgets_for("pay", declared, tenant="t1", agent_id="a1", currency="USD")
    assert sorted((k.budget.scope.value, k.tenant, k.agent_id) for k in keys) == [
        ("agent", "t1", "a1"),
        ("provider", None, None),
        ("tenant", "t1", None),
    ]
    assert [k.lock_name for k in keys] == sorted(k.lock_name for k in keys)
    any_agent = budgets_for("pay", declared, tenant="t1", agent_id=None, currency="usd")
    assert BudgetScope.AGENT not in {k.budget.scope for k in any_agent}
    assert budgets_for("pay", declared, tenant="t1", agent_id="a1", currency=None) == []


def test_lock_names_cannot_be_spelt_alike_by_two_keys() -> None:
    """A tenant id holding the separator cannot make two budget keys share a lock name."""
    [one] = budgets_for("pay", [budget("agent")], tenant="t1;a", agent_id="b", currency="usd")
    [two] = budgets_for("pay", [budget("agent")], tenant="t1", agent_id="a;b", currency="usd")
    assert one.lock_name != two.lock_name


def test_windows_of_one_key_share_its_lock() -> None:
    """A 1h and a 24h budget of the same scope and currency take the same lock, so a claim on
    one waits for claims on the other (they sum over the same operations)."""
    keys = budgets_for(
        "pay", [budget("tenant", window="1h"), budget("tenant")], tenant="t", agent_id=None,
        currency="usd",
    )  # fmt: skip
    assert len({k.lock_name for k in keys}) == 1


def test_an_approval_that_could_not_be_counted_is_named() -> None:
    """On a budgeted provider, an amount rule's approval needs its amount and currency, and,
    with an agent budget, its agent; rules that read no amount move no money."""
    declared = [budget("agent")]
    assert budget_problems(
        declared, reads_amount=True, amount=None, currency=None, agent_id=None
    ) == [
        "the provider has spend budgets: the approval needs its amount",
        "the provider has spend budgets: the approval needs its currency",
        "the provider has a per-agent budget: the approval needs its agent_id",
    ]
    assert (
        budget_problems(declared, reads_amount=False, amount=None, currency=None, agent_id=None)
        == []
    )
    assert budget_problems([], reads_amount=True, amount=None, currency=None, agent_id=None) == []


def test_policy_check_warns_of_budgets_that_count_nothing() -> None:
    """Budgets on a provider whose rules read no amount are a warning at the budgets key."""
    text = (
        HEAD
        + "budgets: [{scope: tenant, currency: usd, limit: 5, window: 24h}]\n"
        + ("rules:\n  - {name: read, method: GET, path: /v1/x, operation: none, body: none}\n")
    )
    [finding] = lint_policy_texts([(Path("pay.yaml"), text)])
    assert (finding.severity, finding.line) == (Severity.WARNING, 5)
    assert "count nothing" in finding.message
    counted = HEAD + "budgets: [{scope: tenant, currency: usd, limit: 5, window: 24h}]\n" + RULES
    assert lint_policy_texts([(Path("pay.yaml"), counted)]) == []
