"""Approvals for providers beyond Stripe (proxy/operations/approvals.py): the provider's key
limits, decimal amounts that need a known exponent, list and `*` parameters, and the smallest
body counting a key that travels in it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from proxy.operations.approvals import OperationRequest, plan_operation
from proxy.policy.load import parse_policy_text
from proxy.policy.set import PolicySet
from proxy.store.store import NewOperation

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

POLICY = """
version: 1
provider: kpay
route_prefix: /kpay
upstream: https://kpay.example
idempotency:
  header: Idempotency-Key
  body_field: /idempotency_key
  max_length: 40
  characters: "A-Za-z0-9_-"
limits: {max_request_body_bytes: 200}
rules:
  - name: order.create
    method: POST
    path: /v1/orders
    body: json
    amount: /amount/value
    amount_format: decimal
    currency: /amount/currency
    params: [/items, "/lines/*/sku"]
"""


def policy() -> PolicySet:
    provider, problems = parse_policy_text(POLICY, "kpay.yaml")
    assert problems == [], problems
    assert provider is not None
    return PolicySet((provider,), version="test")


def order(**overrides: Any) -> OperationRequest:
    fields: dict[str, Any] = {
        "tenant": "acme",
        "provider": "kpay",
        "action": "order.create",
        "amount": 1099,
        "currency": "usd",
        "approval_ref": "t-1",
        "approved_by": "alice",
        "ttl_seconds": 600,
    }
    fields.update(overrides)
    return OperationRequest.model_validate(fields)


def test_a_generated_key_fits_the_providers_limits() -> None:
    """The key opgate generates passes the provider's declared length and characters."""
    planned = plan_operation(order(), policy(), NOW)
    assert isinstance(planned, NewOperation), planned
    assert len(planned.idempotency_key) <= 40


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("k" * 41, "the idempotency key is 41 characters, the provider takes at most 40"),
        ("key:with:colons", "the idempotency key holds characters outside [A-Za-z0-9_-]"),
    ],
)
def test_a_key_the_provider_would_refuse_is_not_sendable(key: str, problem: str) -> None:
    """A given key over the provider's limits is refused at approval, not by the provider."""
    assert plan_operation(order(idempotency_key=key), policy(), NOW) == [
        f"{problem} (kpay's limit)"
    ]


def test_a_decimal_amount_needs_a_currency_with_a_known_exponent() -> None:
    """An approval in a currency opgate knows no ISO 4217 exponent for cannot be spelt."""
    assert plan_operation(order(currency="xyz"), policy(), NOW) == [
        "rule order.create spells the amount as a decimal, and opgate knows no ISO 4217 "
        "exponent for currency 'xyz'"
    ]


def test_lists_and_star_parameters_are_approved() -> None:
    """A JSON rule takes a list parameter whole, and a `*` parameter as one value per element."""
    params = {"/items": [{"sku": "a", "qty": 1}], "/lines/*/sku": ["a", "b"]}
    planned = plan_operation(order(params=params), policy(), NOW)
    assert isinstance(planned, NewOperation), planned
    assert planned.params == params


def test_a_star_parameter_takes_a_list() -> None:
    """`/lines/*/sku` approved as a single value cannot be sent: one value per element."""
    assert plan_operation(order(params={"/lines/*/sku": "a"}), policy(), NOW) == [
        "parameter /lines/*/sku takes 1 nested list(s), one value per element"
    ]


def test_the_key_in_the_body_counts_towards_the_smallest_body() -> None:
    """The smallest body carries the key and the decimal amount: over 200 bytes, unsendable."""
    long_sku = ["s" * 60, "t" * 60]
    problems = plan_operation(order(params={"/lines/*/sku": long_sku}), policy(), NOW)
    assert isinstance(problems, list)
    [problem] = problems
    assert problem.startswith("the smallest request body carrying this approval is ")
    assert problem.endswith("over kpay's limit of 200 bytes")
