"""The operations API: approvals are created, read and revoked by the application only."""

from __future__ import annotations

from typing import Any

from tests.support.opgate import AGENT_TOKEN, Opgate, admin_headers

APPROVAL: dict[str, Any] = {
    "tenant": "t1",
    "provider": "fault",
    "action": "refund.create",
    "amount": 500,
    "currency": "USD",
    "params": {"charge": "ch_1"},
    "approval_ref": "ticket-7",
    "approved_by": "alice@example.com",
    "ttl_seconds": 600,
}


async def post(gate: Opgate, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations",
        json=body,
        headers=admin_headers() if headers is None else headers,
    ) as response:
        return response.status, await response.json(content_type=None)


async def test_create_returns_the_row_with_a_generated_key(fault_gate: Opgate) -> None:
    """A valid approval is stored as created, with a generated key and a normalised currency."""
    status, row = await post(fault_gate, APPROVAL)
    assert status == 201
    assert row["status"] == "created"
    assert row["operation_id"].startswith("op_")
    assert row["idempotency_key"].startswith("opk_")
    assert row["currency"] == "usd"
    assert row["target"] == {"method": "POST", "path": "/v1/refunds", "path_params": {}}
    assert row["approval"]["ref"] == "ticket-7"


async def test_agents_cannot_use_the_operations_api(fault_gate: Opgate) -> None:
    """An agent token (or none) is not an admin token: 401 and nothing is created."""
    for headers in ({"Authorization": f"Bearer {AGENT_TOKEN}"}, {}):
        status, body = await post(
            fault_gate, {**APPROVAL, "operation_id": "op_agent_made"}, headers
        )
        assert (status, body["code"]) == (401, "admin_unauthenticated")
    async with fault_gate.http.get(
        f"{fault_gate.ops_url}/v1/operations/op_agent_made", headers=admin_headers()
    ) as response:
        assert response.status == 404


async def test_repeated_create_is_idempotent_and_a_different_one_conflicts(
    fault_gate: Opgate,
) -> None:
    """The same operation_id with the same approval returns the row; with another, 409."""
    first = await post(fault_gate, {**APPROVAL, "operation_id": "op_fixed_1"})
    again = await post(fault_gate, {**APPROVAL, "operation_id": "op_fixed_1"})
    assert (first[0], again[0]) == (201, 200)
    assert again[1]["idempotency_key"] == first[1]["idempotency_key"]
    changed = await post(fault_gate, {**APPROVAL, "operation_id": "op_fixed_1", "amount": 900})
    assert (changed[0], changed[1]["code"]) == (409, "operation_exists")


async def test_a_given_key_is_kept_and_cannot_be_reused(fault_gate: Opgate) -> None:
    """The application may supply the provider key; two operations cannot share it."""
    status, row = await post(fault_gate, {**APPROVAL, "idempotency_key": "order-42-refund"})
    assert (status, row["idempotency_key"]) == (201, "order-42-refund")
    status, body = await post(fault_gate, {**APPROVAL, "idempotency_key": "order-42-refund"})
    assert (status, body["code"]) == (409, "idempotency_key_in_use")


INVALID = [
    ({"amount": -1}, 400, "invalid_request"),
    ({"unknown_field": 1}, 400, "invalid_request"),
    ({"ttl_seconds": None}, 400, "invalid_request"),
    ({"provider": "nope"}, 422, "approval_not_sendable"),
    ({"action": "read"}, 422, "approval_not_sendable"),
    ({"params": {"destination": "acct_1"}}, 422, "approval_not_sendable"),
    ({"params": {"charge": 7}}, 422, "approval_not_sendable"),
    (
        {"action": "refund.cancel", "amount": None, "currency": None, "params": {}},
        422,
        "approval_not_sendable",
    ),
]


async def test_invalid_approvals_are_refused(fault_gate: Opgate) -> None:
    """Approvals that could never be sent as one well-formed request are refused with a code."""
    for change, status, code in INVALID:
        got, body = await post(fault_gate, {**APPROVAL, **change})
        assert (got, body["code"]) == (status, code), change
        assert body["detail"]


async def test_revoke_keeps_the_status_and_records_the_reason(fault_gate: Opgate) -> None:
    """Revoking marks the approval withdrawn (once), never changes status, and is an event."""
    _, row = await post(fault_gate, APPROVAL)
    url = f"{fault_gate.ops_url}/v1/operations/{row['operation_id']}/revoke"
    for _ in range(2):
        async with fault_gate.http.post(
            url, json={"reason": "fraud review"}, headers=admin_headers()
        ) as response:
            assert response.status == 200
            revoked = await response.json()
    assert revoked["status"] == "created"
    assert revoked["approval"]["revoked_reason"] == "fraud review"
    events = (await fault_gate.operation(row["operation_id"]))["events"]
    assert [e["event"] for e in events] == ["created", "revoked"]
    async with fault_gate.http.post(
        f"{fault_gate.ops_url}/v1/operations/op_none/revoke",
        json={"reason": "x"},
        headers=admin_headers(),
    ) as response:
        assert response.status == 404


async def test_health_and_readiness_need_no_token(fault_gate: Opgate) -> None:
    """Load balancers probe without credentials; readiness names the policy version."""
    async with fault_gate.http.get(f"{fault_gate.ops_url}/healthz") as response:
        assert response.status == 200
    async with fault_gate.http.get(f"{fault_gate.ops_url}/readyz") as response:
        body = await response.json()
        assert (response.status, body["status"]) == (200, "ready")
        assert body["policy_version"] == fault_gate.running.gateway.policy.version
