"""What a policy can say beyond Stripe, decided by the pipeline's own intake and checks (through
explain): an idempotency key in the body, decimal amounts in their currency's exponent, list
and ``*`` parameters, and ``free`` patterns over JSON tokens."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.authoring.cases import CASE_TIME, CaseOperation
from proxy.authoring.explain import EXPLAIN_AGENT, SampleRequest, explain
from proxy.gate.decision import Deny, Forward
from proxy.gate.reasons import Reason
from proxy.policy.load import build_policy_set
from proxy.policy.set import PolicySet
from proxy.store.operation import Operation

POLICY = """
version: 1
provider: jsonpay
route_prefix: /jsonpay
upstream: https://jsonpay.example
currency_case: upper
idempotency:
  header: null
  body_field: /idempotency_key
  max_length: 45
metadata_injection: {kind: json_pointer, pointer: /reference_id}
rules:
  - name: payment.create
    method: POST
    path: /v2/payments
    body: json
    amount: /amount_money/amount
    currency: /amount_money/currency
    params: [/source_id, /tags, "/items/*/sku"]
    free: [/note, "/metadata/*", "/items/*/note"]
  - name: order.create
    method: POST
    path: /v2/orders
    body: json
    amount: /purchase_units/0/amount/value
    amount_format: decimal
    currency: /purchase_units/0/amount/currency_code
"""

POLICIES: PolicySet = build_policy_set([(Path("jsonpay.yaml"), POLICY)], "inline")


def operation(action: str = "payment.create", **fields: Any) -> Operation:
    """The row the store would hold for an approval of ``action`` with ``fields``."""
    case = CaseOperation(action=action, idempotency_key="opk_body_1", **fields)
    row = case.row(POLICIES, EXPLAIN_AGENT.tenant, "jsonpay")
    return dataclasses.replace(row, read_at=CASE_TIME)


def send(
    body: dict[str, Any],
    row: Operation,
    *,
    path: str = "/jsonpay/v2/payments",
    headers: tuple[tuple[str, str], ...] = (),
) -> Forward | Deny:
    sample = SampleRequest(
        "POST",
        path,
        (("Content-Type", "application/json"), *headers),
        json.dumps(body).encode(),
    )
    decision = explain(POLICIES, sample, [row]).decision
    assert isinstance(decision, Forward | Deny)
    return decision


PAYMENT = {
    "idempotency_key": "opk_body_1",
    "source_id": "cnon:card",
    "amount_money": {"amount": 1099, "currency": "USD"},
}
APPROVED = {"amount": 1099, "currency": "usd", "params": {"source_id": "cnon:card"}}


def fix_params(params: dict[str, Any]) -> dict[str, Any]:
    """Rule params are pointers; the test writes them without the leading '/'."""
    return {f"/{name}": value for name, value in params.items()}


def approved(**extra: Any) -> Operation:
    fields = {**APPROVED, **extra}
    fields["params"] = fix_params(fields["params"])
    return operation(**fields)


def test_a_key_in_the_body_names_the_operation() -> None:
    """With `body_field`, the key in the body alone names the approved operation."""
    assert isinstance(send(PAYMENT, approved()), Forward)


def test_a_different_key_in_the_body_is_a_key_mismatch() -> None:
    """A body key that is not the approved one, with the operation named by id, is refused
    idempotency_key_mismatch (not parameter_unexpected)."""
    decision = send(
        {**PAYMENT, "idempotency_key": "opk_other"},
        approved(),
        headers=(("X-Operation-Id", "op_test"),),
    )
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.IDEMPOTENCY_KEY_MISMATCH


def test_a_body_key_alone_that_no_operation_has_is_unknown() -> None:
    """A key naming no row finds no operation: operation_required, as for a header key."""
    decision = send({**PAYMENT, "idempotency_key": "opk_nobody"}, approved())
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.OPERATION_REQUIRED


@pytest.mark.parametrize("key", [7, "", "a b"])
def test_a_body_key_that_is_no_key_is_refused(key: object) -> None:
    """A body key that is not 1-255 printable ASCII characters is body_invalid."""
    decision = send({**PAYMENT, "idempotency_key": key}, approved())
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.BODY_INVALID


ORDER = {
    "purchase_units": [{"amount": {"value": "10.99", "currency_code": "USD"}}],
}


@pytest.mark.parametrize(
    ("value", "currency", "minor_units", "allowed"),
    [
        ("10.99", "USD", 1099, True),
        ("1099", "JPY", 1099, True),
        ("10.990", "KWD", 10990, True),
        ("0.05", "EUR", 5, True),
        ("10.990", "USD", 1099, False),
        ("10.9", "USD", 1090, False),
        ("1.099e1", "USD", 1099, False),
        ("+10.99", "USD", 1099, False),
        ("010.99", "USD", 1099, False),
        ("10.99 ", "USD", 1099, False),
        ("1099.00", "JPY", 1099, False),
        ("10.99", "JPY", 1099, False),
        ("10.99", "KWD", 10990, False),
        (10.99, "USD", 1099, False),
        (1099, "USD", 1099, False),
        ("11.00", "USD", 1099, False),
    ],
)
def test_decimal_amounts_are_accepted_only_in_their_canonical_spelling(
    value: object, currency: str, minor_units: int, allowed: bool
) -> None:
    """A decimal amount passes only as the approved minor units written with the currency's
    ISO 4217 exponent; any other spelling of (nearly) the same number is amount_mismatch."""
    body = {"purchase_units": [{"amount": {"value": value, "currency_code": currency}}]}
    row = operation("order.create", amount=minor_units, currency=currency)
    decision = send(body, row, path="/jsonpay/v2/orders", headers=(("X-Operation-Id", "op_test"),))
    if allowed:
        assert isinstance(decision, Forward), decision
    else:
        assert isinstance(decision, Deny)
        assert decision.reason is Reason.AMOUNT_MISMATCH, decision


def test_a_second_purchase_unit_is_unexpected() -> None:
    """An amount at index 0 does not let a second element through: its fields are unexpected."""
    body = {"purchase_units": [*ORDER["purchase_units"], {"amount": {"value": "1.00"}}]}
    row = operation("order.create", amount=1099, currency="USD")
    decision = send(body, row, path="/jsonpay/v2/orders", headers=(("X-Operation-Id", "op_test"),))
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.PARAMETER_UNEXPECTED


@pytest.mark.parametrize(
    ("sent", "allowed"),
    [
        (["vip", "gift"], True),
        (["gift", "vip"], False),
        (["vip"], False),
        (["vip", "gift", "x"], False),
        ("vip,gift", False),
    ],
)
def test_an_approved_list_is_compared_exactly(sent: object, allowed: bool) -> None:
    """An approved list parameter equals the sent one in order and length, or it is
    parameter_mismatch."""
    row = approved(params={"source_id": "cnon:card", "tags": ["vip", "gift"]})
    decision = send({**PAYMENT, "tags": sent}, row)
    assert isinstance(decision, Forward) is allowed, decision
    if not allowed:
        assert isinstance(decision, Deny)
        assert decision.reason is Reason.PARAMETER_MISMATCH


@pytest.mark.parametrize(
    ("items", "allowed", "reason"),
    [
        ([{"sku": "a"}, {"sku": "b"}], True, None),
        ([{"sku": "a", "note": "n"}, {"sku": "b"}], True, None),
        ([{"sku": "b"}, {"sku": "a"}], False, Reason.PARAMETER_MISMATCH),
        ([{"sku": "a"}], False, Reason.PARAMETER_MISMATCH),
        ([{"sku": "a"}, {"sku": "b"}, {"sku": "c"}], False, Reason.PARAMETER_MISMATCH),
        ([{"sku": "a"}, {"note": "no sku"}], False, Reason.PARAMETER_MISMATCH),
        ([{"sku": "a"}, {"sku": "b", "price": 1}], False, Reason.PARAMETER_UNEXPECTED),
        ({"0": {"sku": "a"}, "1": {"sku": "b"}}, False, Reason.PARAMETER_MISMATCH),
    ],
)
def test_a_star_parameter_matches_every_element(
    items: object, allowed: bool, reason: Reason | None
) -> None:
    """`/items/*/sku` approved as ["a", "b"] means exactly two items with those skus, in order;
    fields of an element that are neither compared nor free are unexpected."""
    row = approved(params={"source_id": "cnon:card", "items/*/sku": ["a", "b"]})
    decision = send({**PAYMENT, "items": items}, row)
    if allowed:
        assert isinstance(decision, Forward), decision
    else:
        assert isinstance(decision, Deny)
        assert decision.reason is reason, decision


@pytest.mark.parametrize(
    ("metadata", "allowed"),
    [({"order": "7"}, True), ({"order": {"nested": "7"}}, False)],
)
def test_a_free_star_stands_for_one_json_token(metadata: object, allowed: bool) -> None:
    """`/metadata/*` lets any key of metadata through, not a field nested below one."""
    decision = send({**PAYMENT, "metadata": metadata}, approved())
    assert isinstance(decision, Forward) is allowed, decision
