"""The set's limits on x402 payments (proxy/policy/payments.py): one payments file, parsed
strictly with every bad key reported as file:line:col, and the pure lookups and judgement."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.policy.lint import Severity, lint_policy_texts
from proxy.policy.load import PolicyLoadError, load_policy_dir
from proxy.policy.payments import (
    PaymentScope,
    Spent,
    X402Budget,
    X402Limits,
    X402Peg,
    X402RateLimit,
    limits_for,
    mandate_over_budget,
    over_limit,
    to_atomic,
)

PROVIDER = """\
version: 1
provider: pay
route_prefix: /pay
upstream: https://pay.example
rules:
  - name: report.buy
    method: GET
    path: /report
    body: none
"""
USDC = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
BASE = "eip155:8453"
PAYMENTS = f"""\
version: 1
payments:
  x402:
    budgets:
      - {{scope: tenant, network: "{BASE}", asset: "{USDC}", limit: 5000000, window: 24h}}
      - {{scope: agent, network: "{BASE}", asset: "{USDC}", limit: 1000000, window: 1h}}
    rate_limits:
      - {{scope: agent, max_payments: 20, window: 1h}}
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_the_payments_file_gives_the_set_its_x402_limits(tmp_path: Path) -> None:
    """A file with ``payments:`` and no ``provider:`` is the set's limits, not a provider."""
    write(tmp_path, "pay.yaml", PROVIDER)
    write(tmp_path, "payments.yaml", PAYMENTS)
    policy = load_policy_dir(tmp_path)
    assert [p.provider for p in policy.providers] == ["pay"]
    limits = policy.x402_limits
    assert [(b.scope, b.limit, b.window) for b in limits.budgets] == [
        (PaymentScope.TENANT, 5_000_000, "24h"),
        (PaymentScope.AGENT, 1_000_000, "1h"),
    ]
    assert [(r.scope, r.max_payments) for r in limits.rate_limits] == [(PaymentScope.AGENT, 20)]


def test_a_set_without_a_payments_file_has_no_x402_limits(tmp_path: Path) -> None:
    """No payments file: no limits (the shipped policies have none)."""
    write(tmp_path, "pay.yaml", PROVIDER)
    assert load_policy_dir(tmp_path).x402_limits == X402Limits()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            f'{{scope: tenant, network: "{BASE}", asset: "{USDC}", limit: 1.5, window: 24h}}',
            "payments.x402.budgets.0.limit: Input should be a valid integer",
        ),
        (
            f'{{scope: tenant, network: "{BASE}", asset: "{USDC}", limit: "100", window: 24h}}',
            "payments.x402.budgets.0.limit: Input should be a valid integer",
        ),
        (
            f'{{scope: tenant, network: "{BASE}", asset: "{USDC}", limit: 0, window: 24h}}',
            "payments.x402.budgets.0.limit: Input should be greater than 0",
        ),
        (
            f'{{scope: tenant, network: "{BASE}", asset: "{USDC}", limit: {2**256}, window: 1h}}',
            "payments.x402.budgets.0.limit: Input should be less than or equal to",
        ),
        (
            f'{{scope: provider, network: "{BASE}", asset: "{USDC}", limit: 1, window: 1h}}',
            "payments.x402.budgets.0.scope: Input should be 'tenant' or 'agent'",
        ),
        (
            f'{{scope: tenant, network: "base", asset: "{USDC}", limit: 1, window: 1h}}',
            "payments.x402.budgets.0.network: String should match pattern",
        ),
        (
            f'{{scope: tenant, network: "{BASE}", asset: "usdc", limit: 1, window: 1h}}',
            "payments.x402.budgets.0.asset: String should match pattern",
        ),
        (
            f'{{scope: tenant, network: "{BASE}", asset: "{USDC}", limit: 1, window: 1.5h}}',
            "payments.x402.budgets.0.window: Value error, window '1.5h' is not a whole",
        ),
        (
            f'{{scope: tenant, network: "{BASE}", limit: 1, window: 1h}}',
            "payments.x402.budgets.0.asset: Field required",
        ),
        (
            f'{{scope: tenant, network: "{BASE}", asset: "{USDC}", limit: 1, window: 1h, '
            "currency: usd}",
            "payments.x402.budgets.0.currency: Extra inputs are not permitted",
        ),
    ],
    ids=[
        "a fractional limit",
        "a limit as text",
        "a zero limit",
        "a limit beyond uint256",
        "a provider scope",
        "a network not CAIP-2",
        "an asset not an address",
        "a fractional window",
        "no asset",
        "an unknown key",
    ],
)
def test_a_bad_budget_is_refused_with_its_place(tmp_path: Path, line: str, expected: str) -> None:
    """Each bad budget key is refused, naming file, line and column; nothing loads."""
    write(tmp_path, "pay.yaml", PROVIDER)
    text = f"version: 1\npayments:\n  x402:\n    budgets:\n      - {line}\n"
    path = write(tmp_path, "payments.yaml", text)
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    [problem] = [str(p) for p in info.value.problems]
    assert problem.startswith(f"{path}:5:"), problem
    assert expected in problem


def test_every_problem_of_the_payments_file_is_reported_and_one_file_holds_them(
    tmp_path: Path,
) -> None:
    """A bad rate limit, a duplicate budget and a second payments file: all reported at once."""
    write(tmp_path, "pay.yaml", PROVIDER)
    first = write(tmp_path, "a-payments.yaml", PAYMENTS)
    budget = f'{{scope: tenant, network: "{BASE}", asset: "{USDC.lower()}", limit: 1, window: 1d}}'
    second = write(
        tmp_path,
        "b-payments.yaml",
        f"version: 1\npayments:\n  x402:\n    budgets:\n      - {budget}\n      - {budget}\n",
    )
    bad = write(
        tmp_path,
        "c-payments.yaml",
        "version: 1\npayments:\n  x402:\n    rate_limits:\n"
        "      - {scope: agent, max_payments: 0, window: 1h}\n"
        "      - {scope: tenant, max_payments: 2, window: 1h, per: payee}\n",
    )
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    messages = [str(p) for p in info.value.problems]
    assert messages[0].startswith(f"{second}:4:5: payments.x402: Value error, two budgets")
    assert messages[1:3] == [
        f"{bad}:5:38: payments.x402.rate_limits.0.max_payments: Input should be greater than or "
        "equal to 1",
        f"{bad}:6:54: payments.x402.rate_limits.1.per: Extra inputs are not permitted",
    ]
    assert messages[3:] == [
        f"{second}:1:1: the payment limits are declared once (also in {first})",
        f"{bad}:1:1: the payment limits are declared once (also in {first})",
    ]


def test_lint_reads_the_payments_file_as_such(tmp_path: Path) -> None:
    """``policy check`` reports a bad payments file's problems, and a good one raises none."""
    good = lint_policy_texts([(tmp_path / "pay.yaml", PROVIDER), (tmp_path / "p.yaml", PAYMENTS)])
    assert [f for f in good if f.severity is Severity.ERROR] == []
    bad = lint_policy_texts([(tmp_path / "p.yaml", PAYMENTS.replace("20", "-1"))])
    assert [(f.line, f.severity) for f in bad] == [(8, Severity.ERROR)]


def _limits() -> X402Limits:
    return X402Limits(
        budgets=[
            X402Budget(scope=PaymentScope.TENANT, network=BASE, asset=USDC, limit=300, window="1d"),
            X402Budget(scope=PaymentScope.AGENT, network=BASE, asset=USDC, limit=200, window="1h"),
            X402Budget(
                scope=PaymentScope.TENANT, network="eip155:1", asset=USDC, limit=1, window="1h"
            ),
        ],
        rate_limits=[X402RateLimit(scope=PaymentScope.TENANT, max_payments=3, window="1h")],
    )


def test_a_payment_counts_against_the_limits_of_its_network_and_asset_in_lock_order() -> None:
    """The budgets of the payment's network and asset (any spelling of the address) and every
    rate limit apply; keys are in lock order and spell tenant and agent apart."""
    keys = limits_for(_limits(), tenant="t1", agent_id="a1", network=BASE, asset=USDC.lower())
    assert not isinstance(keys, str)
    assert sorted(k.describe()["kind"] for k in keys) == ["x402_budget"] * 2 + ["x402_rate_limit"]
    assert [k.lock_name for k in keys] == sorted(k.lock_name for k in keys)
    assert {k.agent_id for k in keys if k.budget and k.budget.scope is PaymentScope.AGENT} == {"a1"}
    assert len({k.lock_name for k in keys}) == 3
    other = limits_for(_limits(), tenant="t1a", agent_id="1", network=BASE, asset=USDC)
    assert not isinstance(other, str)
    assert not {k.lock_name for k in keys} & {k.lock_name for k in other}


def test_an_agent_limit_cannot_count_an_operation_approved_for_no_agent() -> None:
    """Fail closed: "approved for any agent" cannot be counted per agent."""
    why = limits_for(_limits(), tenant="t1", agent_id=None, network=BASE, asset=USDC)
    assert why == "a per-agent x402 budget applies: the operation's approval needs its agent_id"


@pytest.mark.parametrize(
    ("spent", "amount", "broken"),
    [
        ([Spent(0, 0), Spent(100, 1), Spent(100, 1)], 100, None),
        ([Spent(0, 0), Spent(100, 1), Spent(100, 1)], 101, "x402_budget"),
        ([Spent(0, 0), Spent(250, 1), Spent(0, 0)], 100, "x402_budget"),
        ([Spent(0, 3), Spent(0, 0), Spent(0, 0)], 1, "x402_rate_limit"),
    ],
    ids=["exactly to the limit", "one unit over", "the tenant's day spent", "the rate spent"],
)
def test_over_limit_names_the_limit_one_more_payment_breaks(
    spent: list[Spent], amount: int, broken: str | None
) -> None:
    """Admitted up to each limit inclusive (spent: the rate limit's, the tenant's budget's, the
    agent's budget's); the first broken one is named."""
    keys = limits_for(_limits(), tenant="t1", agent_id="a1", network=BASE, asset=USDC)
    assert not isinstance(keys, str)
    rate_first = [k for k in keys if k.rate_limit] + [k for k in keys if k.budget]
    over = over_limit(rate_first, spent, amount)
    assert (None if over is None else over.key.describe()["kind"]) == broken


PEG = X402Peg(network=BASE, asset=USDC, currency="USD", decimals=6)


@pytest.mark.parametrize(
    ("peg", "minor", "currency", "atomic"),
    [
        ("usdc", 1, "USD", 10_000),  # one cent is 10000 atomic units
        ("usdc", 2500, "usd", 25_000_000),
        ("usdc", 1, "EUR", None),  # pegged to another currency
        ("usdc", 1, "XXX", None),  # no exponent known
        ("two decimals", 3, "KWD", None),  # 0.003 KWD in a 2-decimal asset: not whole
        ("two decimals", 30, "KWD", 3),
    ],
    ids=["a cent", "lower case", "another currency", "unknown", "not whole", "whole"],
)
def test_a_mandates_amount_converts_to_atomic_units_exactly_or_not_at_all(
    peg: str, minor: int, currency: str, atomic: int | None
) -> None:
    """A currency's minor units become the pegged asset's atomic units only when the result is
    whole and the peg is to that currency: never rounded."""
    pegged = PEG if peg == "usdc" else X402Peg(network=BASE, asset=USDC, currency="KWD", decimals=2)
    assert to_atomic(pegged, minor, currency) == atomic


def test_payments_under_an_open_mandate_are_summed_exactly_through_the_pegs() -> None:
    """A budget of 5 cents: 4 cents paid across assets and a cent of operations approved with
    an amount leave no room for one more atomic unit; an asset without a peg to USD cannot be
    counted, whatever its amount (fail closed); no budget, nothing to judge."""
    other = "0x" + "12" * 20
    limits = X402Limits(pegs=[PEG, X402Peg(network=BASE, asset=other, currency="USD", decimals=18)])
    paid = [(BASE, USDC.lower(), 30_000), (BASE, other, 10**16)]  # 3 cents + 1 cent
    judge = {"budget_max": 5, "currency": "USD", "paid": paid, "network": BASE, "asset": USDC}
    assert mandate_over_budget(limits, **judge, spent=1, amount=0) is None
    over = mandate_over_budget(limits, **judge, spent=1, amount=1)
    assert over is not None
    assert over.to_public() == {"currency": "USD", "budget_max": "5", "paid": "5"}
    assert mandate_over_budget(limits, **judge, amount=10_000) is None
    unpegged = {**judge, "asset": "0x" + "99" * 20}
    refused = mandate_over_budget(limits, **unpegged, amount=0)
    assert refused is not None
    assert "no peg" in refused.detail
    assert mandate_over_budget(limits, **{**unpegged, "budget_max": None}, amount=1) is None


def test_two_pegs_of_one_asset_are_refused(tmp_path: Path) -> None:
    """An asset worth two currencies could be counted in either: one peg per asset."""
    write(tmp_path, "pay.yaml", PROVIDER)
    peg = f'{{network: "{BASE}", asset: "{USDC}", currency: USD, decimals: 6}}'
    text = f"version: 1\npayments:\n  x402:\n    pegs:\n      - {peg}\n      - {peg}\n"
    write(tmp_path, "payments.yaml", text)
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    assert "two pegs" in str(info.value.problems[0])
