"""Turning an approval into an operation row (proxy/operations/approvals.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from proxy.operations.approvals import OperationRequest, plan_operation, same_approval
from proxy.policy.load import load_policy_dir, parse_policy_text
from proxy.policy.set import PolicySet
from proxy.store.store import NewOperation
from tests.support.paths import POLICIES

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
STRIPE = load_policy_dir(POLICIES)

JSON_POLICY = """
version: 1
provider: jpay
route_prefix: /jpay
upstream: https://jpay.example
rules:
  - name: transfer.create
    method: POST
    path: /v1/transfers
    body: json
    amount: /amount
    currency: /currency
    params: [/destination, /instant]
"""


def json_policy() -> PolicySet:
    provider, problems = parse_policy_text(JSON_POLICY, "jpay.yaml")
    assert problems == []
    assert provider is not None
    return PolicySet((provider,), version="test")


def refund(**overrides: Any) -> OperationRequest:
    """A valid full-amount approval of a 500 refund on ch_1, with overrides."""
    fields: dict[str, Any] = {
        "tenant": "acme",
        "agent_id": "agent-1",
        "provider": "stripe",
        "action": "refund.create",
        "amount": 500,
        "params": {"charge": "ch_1"},
        "approval_ref": "ticket-1",
        "approved_by": "alice",
        "ttl_seconds": 600,
    }
    fields.update(overrides)
    return OperationRequest.model_validate(fields)


def test_valid_refund_is_planned() -> None:
    """A valid refund approval becomes a row with the rendered path and generated ids."""
    planned = plan_operation(refund(), STRIPE, NOW)
    assert isinstance(planned, NewOperation)
    assert planned.provider == "stripe"
    assert planned.action == "refund.create"
    assert planned.method == "POST"
    assert planned.path == "/v1/refunds"
    assert planned.amount == 500
    assert planned.currency is None
    assert planned.params == {"charge": "ch_1"}
    assert planned.expires_at == NOW + timedelta(seconds=600)
    assert planned.operation_id.startswith("op_")
    assert planned.idempotency_key.startswith("opk_")
    again = plan_operation(refund(), STRIPE, NOW)
    assert isinstance(again, NewOperation)
    assert (again.operation_id, again.idempotency_key) != (
        planned.operation_id,
        planned.idempotency_key,
    )


def test_given_ids_and_expiry_are_kept() -> None:
    """A caller's operation id, idempotency key and expires_at are used as given."""
    expires = NOW + timedelta(hours=2)
    planned = plan_operation(
        refund(
            operation_id="op_mine", idempotency_key="key-1", ttl_seconds=None, expires_at=expires
        ),
        STRIPE,
        NOW,
    )
    assert isinstance(planned, NewOperation)
    assert (planned.operation_id, planned.idempotency_key, planned.expires_at) == (
        "op_mine",
        "key-1",
        expires,
    )


def test_path_params_render_and_currency_is_lowercased() -> None:
    """Path parameters render into the path; the currency is stored lowercase."""
    capture = plan_operation(
        refund(action="charge.capture", path_params={"charge": "ch_1"}, params={}),
        STRIPE,
        NOW,
    )
    assert isinstance(capture, NewOperation)
    assert capture.path == "/v1/charges/ch_1/capture"
    charge = plan_operation(
        refund(action="charge.create", currency="USD", params={"customer": "cus_1"}), STRIPE, NOW
    )
    assert isinstance(charge, NewOperation)
    assert charge.currency == "usd"


def test_full_refund_needs_no_amount() -> None:
    """An approval without an amount on an amount rule is allowed (e.g. a full refund)."""
    assert isinstance(plan_operation(refund(amount=None), STRIPE, NOW), NewOperation)


def test_json_rules_take_typed_params() -> None:
    """A JSON rule's approved parameters may be booleans and numbers, not only text."""
    request = refund(
        provider="jpay",
        action="transfer.create",
        currency="eur",
        params={"/destination": "acct_1", "/instant": True},
    )
    planned = plan_operation(request, json_policy(), NOW)
    assert isinstance(planned, NewOperation)
    assert planned.params == {"/destination": "acct_1", "/instant": True}


PROBLEMS: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "unknown provider",
        {"provider": "no-such-provider"},
        ["no provider 'no-such-provider' in the loaded policy"],
    ),
    (
        "unknown action",
        {"action": "refund.delete"},
        ["provider stripe has no rule 'refund.delete'"],
    ),
    (
        "rule without operations",
        {"action": "read", "amount": None, "params": {}, "path_params": {"resource": "charges"}},
        ["rule read does not take operations"],
    ),
    (
        "missing path parameter",
        {"action": "charge.capture", "params": {}},
        [
            "path /v1/charges/{charge}/capture needs parameters ['charge']; "
            "missing ['charge'], unexpected []"
        ],
    ),
    (
        "unexpected path parameter",
        {"path_params": {"charge": "ch_1"}},
        ["path /v1/refunds needs parameters []; missing [], unexpected ['charge']"],
    ),
    (
        "non-canonical path parameter",
        {"action": "charge.capture", "params": {}, "path_params": {"charge": "../refunds"}},
        ["path parameter charge='../refunds' is not canonical"],
    ),
    (
        "dot-dot path parameter",
        {"action": "charge.capture", "params": {}, "path_params": {"charge": ".."}},
        ["path parameter charge='..' is not canonical"],
    ),
    (
        "amount on a rule without one",
        {"action": "payment_intent.cancel", "params": {}, "path_params": {"intent": "pi_1"}},
        ["rule payment_intent.cancel reads no amount"],
    ),
    (
        "currency on a rule without one",
        {"currency": "usd"},
        ["rule refund.create reads no currency"],
    ),
    (
        "amount without its currency",
        {"action": "charge.create", "params": {}},
        ["an amount needs its currency"],
    ),
    (
        "parameter the rule does not compare",
        {"params": {"charge": "ch_1", "destination": "acct_evil"}},
        ["rule refund.create compares no parameters ['destination']"],
    ),
    (
        "non-text form parameter",
        {"params": {"charge": "ch_1", "reverse_transfer": True}},
        ["form parameters are text; ['reverse_transfer'] are not strings"],
    ),
    (
        "an object where a form takes text",
        {"params": {"charge": {"id": "ch_1"}}},
        ["form parameters are text; ['charge'] are not strings"],
    ),
    (
        "already expired",
        {"ttl_seconds": None, "expires_at": NOW},
        ["the approval has already expired"],
    ),
    (
        "every problem at once",
        {
            "currency": "usd",
            "params": {"x": 1},
            "path_params": {"p": "v"},
            "ttl_seconds": None,
            "expires_at": NOW - timedelta(seconds=1),
        },
        [
            "path /v1/refunds needs parameters []; missing [], unexpected ['p']",
            "rule refund.create reads no currency",
            "rule refund.create compares no parameters ['x']",
            "form parameters are text; ['x'] are not strings",
            "the approval has already expired",
        ],
    ),
]


@pytest.mark.parametrize(
    ("overrides", "expected"), [pytest.param(*case[1:], id=case[0]) for case in PROBLEMS]
)
def test_plan_operation_lists_every_problem(overrides: dict[str, Any], expected: list[str]) -> None:
    """An approval that could not be sent as it stands is refused with every reason."""
    assert plan_operation(refund(**overrides), STRIPE, NOW) == expected


INVALID_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("both expiries", {"expires_at": NOW.isoformat()}),
    ("no expiry", {"ttl_seconds": None}),
    ("naive expires_at", {"ttl_seconds": None, "expires_at": "2030-01-01T12:00:00"}),
    ("ttl zero", {"ttl_seconds": 0}),
    ("ttl over 30 days", {"ttl_seconds": 30 * 86400 + 1}),
    ("unknown field", {"amout": 5}),
    ("empty tenant", {"tenant": ""}),
    ("empty approval ref", {"approval_ref": ""}),
    ("operation id with a space", {"operation_id": "op 1"}),
    ("operation id with a slash", {"operation_id": "op/1"}),
    ("operation id too long", {"operation_id": "o" * 129}),
    ("idempotency key empty", {"idempotency_key": ""}),
    ("idempotency key with a space", {"idempotency_key": "a b"}),
    ("idempotency key non-ASCII", {"idempotency_key": "cl\u00e9"}),
    ("idempotency key too long", {"idempotency_key": "k" * 256}),
    ("negative amount", {"amount": -1}),
    ("amount beyond 2**53 - 1", {"amount": 2**53}),
    ("amount as a string", {"amount": "500"}),
    ("amount as a boolean", {"amount": True}),
    ("amount as a float", {"amount": 500.0}),
    ("two-letter currency", {"currency": "us"}),
    ("numeric currency", {"currency": "840"}),
    ("non-text path parameter", {"path_params": {"charge": 1}}),
    ("ttl as a boolean", {"ttl_seconds": True}),
    ("ttl as a string", {"ttl_seconds": "600"}),
]


@pytest.mark.parametrize(
    "raw_param", [pytest.param(v, id=v) for v in ("NaN", "Infinity", "-Infinity", "1e400")]
)
def test_non_finite_params_are_refused(raw_param: str) -> None:
    """A NaN or infinite approved parameter is refused: no body carrying it could be sent."""
    text = (
        '{"tenant": "acme", "provider": "stripe", "action": "refund.create", '
        '"approval_ref": "t", "approved_by": "a", "ttl_seconds": 600, '
        f'"params": {{"x": {raw_param}}}}}'
    )
    with pytest.raises(ValidationError):
        OperationRequest.model_validate_json(text)


@pytest.mark.parametrize("overrides", [pytest.param(c[1], id=c[0]) for c in INVALID_REQUESTS])
def test_operation_request_validation(overrides: dict[str, Any]) -> None:
    """Malformed create requests are refused by the model, as JSON the API receives."""
    fields: dict[str, Any] = {
        "tenant": "acme",
        "provider": "stripe",
        "action": "refund.create",
        "approval_ref": "ticket-1",
        "approved_by": "alice",
        "ttl_seconds": 600,
        **overrides,
    }
    with pytest.raises(ValidationError):
        OperationRequest.model_validate_json(json.dumps(fields))


def test_operation_request_keeps_param_types() -> None:
    """Approved parameters keep their JSON types: true stays a bool, 1 stays an int."""
    request = refund(params={"a": True, "b": 1, "c": 1.5, "d": "1"})
    assert [type(v) for v in request.params.values()] == [bool, int, float, str]


def test_largest_amount_is_accepted() -> None:
    """The largest safe integer is a valid amount."""
    assert refund(amount=2**53 - 1).amount == 2**53 - 1


def test_same_approval() -> None:
    """A repeated create is the same approval iff what it asks for matches the stored row."""
    planned = plan_operation(refund(operation_id="op_1"), STRIPE, NOW)
    assert isinstance(planned, NewOperation)
    assert same_approval(planned, planned)
    assert same_approval(planned, replace(planned, approved_by="b", idempotency_key="k2"))
    assert not same_approval(planned, replace(planned, amount=600))
    assert not same_approval(planned, replace(planned, params={"charge": "ch_2"}))
    assert not same_approval(planned, replace(planned, approval_ref="ticket-2"))
    assert not same_approval(planned, replace(planned, path="/v1/other"))


def test_an_approval_no_request_under_the_body_limit_can_carry_is_refused() -> None:
    """The smallest body carrying the approved fields must fit the provider's request limit."""
    limit = STRIPE.providers[0].limits.max_request_body_bytes
    problems = plan_operation(refund(params={"charge": "c" * limit}), STRIPE, NOW)
    assert isinstance(problems, list)
    assert any(f"limit of {limit} bytes" in problem for problem in problems), problems


def test_an_approval_at_the_body_limit_is_planned() -> None:
    """Fields whose smallest body is exactly the limit fit (charge=... plus amount=500&)."""
    limit = STRIPE.providers[0].limits.max_request_body_bytes
    room = limit - len("amount=500&charge=")
    assert isinstance(
        plan_operation(refund(params={"charge": "c" * room}), STRIPE, NOW), NewOperation
    )
    assert isinstance(
        plan_operation(refund(params={"charge": "c" * (room + 1)}), STRIPE, NOW), list
    )


@pytest.mark.parametrize(
    ("lifetime", "sendable"),
    [
        pytest.param({"ttl_seconds": 86_400}, True, id="ttl of exactly 24 h"),
        pytest.param({"ttl_seconds": 86_401}, False, id="ttl over 24 h"),
        pytest.param(
            {"ttl_seconds": None, "expires_at": NOW + timedelta(hours=24, seconds=1)},
            False,
            id="expires_at over 24 h",
        ),
    ],
)
def test_an_approval_may_not_outlive_the_providers_key_retention(
    lifetime: dict[str, Any], sendable: bool
) -> None:
    """Stripe deduplicates on a key it keeps 24 h (retention_seconds): an approval that stands
    longer could be re-sent after the key is pruned, so it is refused."""
    planned = plan_operation(refund(**lifetime), STRIPE, NOW)
    if sendable:
        assert isinstance(planned, NewOperation)
    else:
        assert planned == [
            "the approval stands 86401 s, longer than stripe keeps an idempotency key "
            "(86400 s): a re-send after that would not be deduplicated"
        ]


def test_no_retention_bound_where_the_provider_declares_none() -> None:
    """A provider without retention_seconds (or that does not deduplicate) takes any lifetime
    the model allows."""
    request = refund(
        provider="jpay",
        action="transfer.create",
        currency="eur",
        params={"/destination": "acct_1"},
        ttl_seconds=30 * 86400,
    )
    assert isinstance(plan_operation(request, json_policy(), NOW), NewOperation)
