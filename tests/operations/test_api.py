"""The operations API: approvals are created, read and revoked by the application only."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from yarl import URL

from tests.support.budgets import REFUND
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import (
    AGENT_TOKEN,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
    admin_headers,
)

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


async def test_concurrent_repeats_of_one_approval_all_get_the_row(fault_gate: Opgate) -> None:
    """Twenty concurrent creates of one approval with one explicit id and key: one 201, the
    rest 200 with the same row, never 409 idempotency_key_in_use (the key's unique index can
    trip before the id's ON CONFLICT does)."""
    body = {**APPROVAL, "operation_id": "op_raced_1", "idempotency_key": "order-43-refund"}
    answers = await asyncio.gather(*(post(fault_gate, body) for _ in range(20)))
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * 19 + [201], [row.get("code") for _, row in answers]
    assert {row["operation_id"] for _, row in answers} == {"op_raced_1"}
    assert {row["idempotency_key"] for _, row in answers} == {"order-43-refund"}


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


async def _revoke(gate: Opgate, operation_id: str) -> tuple[int, str, Any]:
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations/{operation_id}/revoke",
        json={"reason": "changed my mind"},
        headers=admin_headers(),
    ) as response:
        return response.status, response.content_type, await response.json(content_type=None)


async def test_revoking_a_sent_operation_says_it_still_counts_and_a_settled_one_is_refused(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Revoked after its outcome went unknown: the approval is withdrawn (no further attempt),
    and the answer and the event say something may have been sent, so it still counts against
    its budgets. Confirmed: 409 operation_settled, the row left unrevoked."""
    body = "amount=500&currency=usd&charge=ch_1"
    fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
    unknown = await fault_gate.approve()
    await fault_gate.send(REFUND, data=body, headers={"X-Operation-Id": unknown["operation_id"]})
    status, _, revoked = await _revoke(fault_gate, unknown["operation_id"])
    assert (status, revoked["status"]) == (200, "dispatched")
    assert revoked["approval"]["revoked_reason"] == "changed my mind"
    assert revoked["counts_against_budgets"] is True
    events = (await fault_gate.operation(unknown["operation_id"]))["events"]
    assert events[-1]["event"] == "revoked"
    assert events[-1]["detail"]["nothing_sent"] is False

    fault_provider.mode = FaultMode.OK
    confirmed = await fault_gate.approve()
    await fault_gate.send(REFUND, data=body, headers={"X-Operation-Id": confirmed["operation_id"]})
    status, content_type, problem = await _revoke(fault_gate, confirmed["operation_id"])
    assert (status, content_type, problem["code"]) == (
        409,
        "application/problem+json",
        "operation_settled",
    )
    after = await fault_gate.operation(confirmed["operation_id"])
    assert (after["status"], after["approval"]["revoked_at"]) == ("confirmed", None)
    assert after["counts_against_budgets"] is True


async def test_health_and_readiness_need_no_token(fault_gate: Opgate) -> None:
    """Load balancers probe without credentials; readiness names the policy version."""
    async with fault_gate.http.get(f"{fault_gate.ops_url}/healthz") as response:
        assert response.status == 200
    async with fault_gate.http.get(f"{fault_gate.ops_url}/readyz") as response:
        body = await response.json()
        assert (response.status, body["status"]) == (200, "ready")
        assert body["policy_version"] == fault_gate.running.gateway.policy.version


# --- bad input: a 4xx with a code, never a 500 -----------------------------------------------


async def raw_post(gate: Opgate, path: str, body: bytes) -> tuple[int, str, Any]:
    async with gate.http.post(
        f"{gate.ops_url}{path}",
        data=body,
        headers={**admin_headers(), "Content-Type": "application/json"},
    ) as response:
        return (
            response.status,
            response.headers["Content-Type"],
            await response.json(content_type=None),
        )


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("GET", ""), ("POST", "/revoke"), ("POST", "/resolve"), ("POST", "/reconcile")],
)
@pytest.mark.parametrize(
    "raw_id",
    [
        pytest.param("op%00x", id="percent-encoded NUL"),
        pytest.param("op%C3%28", id="percent-encoded invalid UTF-8"),
        pytest.param("op%E2%84%AA", id="percent-encoded non-ASCII"),
    ],
)
async def test_an_invalid_operation_id_in_the_path_is_refused(
    fault_gate: Opgate, method: str, suffix: str, raw_id: str
) -> None:
    """Every /v1/operations/{id} route answers 400 operation_id_invalid for an id that is not
    printable ASCII once strictly decoded (a NUL used to reach the query: 500)."""
    url = URL(f"{fault_gate.ops_url}/v1/operations/{raw_id}{suffix}", encoded=True)
    body = {
        "/revoke": {"reason": "x"},
        "/resolve": {"verdict": "failed", "note": "n", "decided_by": "bob"},
    }.get(suffix)
    async with fault_gate.http.request(method, url, json=body, headers=admin_headers()) as response:
        assert response.status == 400
        assert response.headers["Content-Type"] == "application/problem+json"
        assert (await response.json())["code"] == "operation_id_invalid"


NUL_APPROVALS = [
    pytest.param({"tenant": "t1\u0000"}, id="tenant"),
    pytest.param({"agent_id": "agent\u0000a"}, id="agent_id"),
    pytest.param({"approval_ref": "ticket\u0000"}, id="approval_ref"),
    pytest.param({"approved_by": "\u0000"}, id="approved_by"),
    pytest.param({"params": {"charge": "ch_\u00001"}}, id="params value"),
    pytest.param({"params": {"charge\u0000": "ch_1"}}, id="params key"),
    pytest.param({"path_params": {"x\u0000": "y"}}, id="path_params"),
]


@pytest.mark.parametrize("change", NUL_APPROVALS)
async def test_an_approval_holding_a_nul_is_refused(
    fault_gate: Opgate, change: dict[str, Any]
) -> None:
    """PostgreSQL cannot store a NUL in text or jsonb: an approval holding one anywhere is 400
    invalid_request, not a failed insert (500)."""
    status, body = await post(fault_gate, {**APPROVAL, **change})
    assert (status, body["code"]) == (400, "invalid_request")


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"tenant": "t2", ' + json.dumps(APPROVAL).encode()[1:], id="duplicated key"),
        pytest.param(b'{"params": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", id="30,000 levels"),
        pytest.param(b'{"tenant": "t1\\ud800"}', id="lone surrogate"),
        pytest.param(b"\xff\xfe", id="not UTF-8"),
    ],
)
async def test_approvals_that_do_not_parse_one_way_are_refused(
    fault_gate: Opgate, raw: bytes
) -> None:
    """The approval is parsed as strictly as an agent's body: a duplicated key (last used to
    win), deep nesting or an unkeepable number is 400 invalid_request."""
    status, content_type, body = await raw_post(fault_gate, "/v1/operations", raw)
    assert (status, content_type, body["code"]) == (
        400,
        "application/problem+json",
        "invalid_request",
    )
    listed = await list_all(fault_gate)
    assert listed == []


async def list_all(gate: Opgate) -> list[Any]:
    async with gate.http.get(
        f"{gate.ops_url}/v1/operations?status=all", headers=admin_headers()
    ) as response:
        assert response.status == 200
        operations: list[Any] = (await response.json())["operations"]
        return operations


async def test_revoke_and_resolve_bodies_holding_a_nul_are_refused(fault_gate: Opgate) -> None:
    """A revoke reason or a verdict note holding a NUL is 400 invalid_request (it was 500)."""
    _, row = await post(fault_gate, APPROVAL)
    base = f"/v1/operations/{row['operation_id']}"
    for path, document in (
        (f"{base}/revoke", {"reason": "fraud\u0000"}),
        (f"{base}/resolve", {"verdict": "failed", "note": "n\u0000", "decided_by": "bob"}),
    ):
        status, _, body = await raw_post(fault_gate, path, json.dumps(document).encode())
        assert (status, body["code"]) == (400, "invalid_request"), path
    assert (await fault_gate.operation(row["operation_id"]))["approval"]["revoked_at"] is None


@pytest.mark.parametrize("tenant", ["t1%00", "t1%C3%28"])
async def test_a_tenant_filter_that_is_not_text_is_refused(fault_gate: Opgate, tenant: str) -> None:
    """A listing filtered on a tenant holding a NUL or undecodable bytes is 400, not 500."""
    url = URL(f"{fault_gate.ops_url}/v1/operations?tenant={tenant}", encoded=True)
    async with fault_gate.http.get(url, headers=admin_headers()) as response:
        assert response.status == 400
        assert (await response.json(content_type=None))["code"] == "invalid_request"


async def test_an_approval_too_large_to_send_is_not_sendable(fault_gate: Opgate) -> None:
    """Parameters no request under the provider's body limit (64 KiB) can carry: 422
    approval_not_sendable (it used to be created, and no agent could ever send it)."""
    status, body = await post(fault_gate, {**APPROVAL, "params": {"charge": "c" * 70_000}})
    assert (status, body["code"]) == (422, "approval_not_sendable")
    assert "65536" in body["detail"]
    assert await list_all(fault_gate) == []


STRIPE_REFUND: dict[str, Any] = {
    "tenant": "t1",
    "provider": "stripe",
    "action": "refund.create",
    "amount": 500,
    "params": {"charge": "ch_1"},
    "approval_ref": "ticket-8",
    "approved_by": "alice@example.com",
}


async def test_an_approval_outliving_the_providers_key_retention_is_not_sendable(
    start_opgate: StartOpgate,
) -> None:
    """Stripe keeps an idempotency key 24 h: an approval standing longer could be re-sent after
    the key is gone and charge twice, so it is 422 approval_not_sendable; 24 h is fine."""
    async with start_opgate(policy_dir=SHIPPED_POLICIES) as gate:
        later = (datetime.now(UTC) + timedelta(hours=25)).isoformat()
        for lifetime in ({"ttl_seconds": 86_401}, {"expires_at": later}):
            status, body = await post(gate, {**STRIPE_REFUND, **lifetime})
            assert (status, body["code"]) == (422, "approval_not_sendable"), lifetime
            assert "86400" in body["detail"]
        status, _ = await post(gate, {**STRIPE_REFUND, "ttl_seconds": 86_400})
        assert status == 201


async def test_an_escalation_behind_a_thousand_unsettled_operations_is_listed(
    fault_gate: Opgate,
) -> None:
    """The escalation queue reads the escalated rows themselves: one escalated after 1,000
    older unsettled operations is listed (it fell past the 1,000 unsettled rows once read)."""
    store = fault_gate.running.gateway.store
    columns = (
        "operation_id, tenant, provider, action, method, path, idempotency_key, approval_ref,"
        " approved_by, expires_at, created_at, status, attempts, dispatched_at, escalated_at"
    )
    await store.run(
        lambda conn: conn.execute(
            f"INSERT INTO operations ({columns})"
            " SELECT 'op_bulk_' || n, 't1', 'fault', 'refund.create', 'POST', '/v1/refunds',"
            "        'key-bulk-' || n, 'r', 'a', now() + interval '1 hour',"
            "        now() - interval '1 hour', 'created', 0, NULL, NULL"
            "   FROM generate_series(1, 1000) AS n"
            " UNION ALL"
            " SELECT 'op_escalated_late', 't1', 'fault', 'refund.create', 'POST', '/v1/refunds',"
            "        'key-escalated-late', 'r', 'a', now() + interval '1 hour', now(),"
            "        'dispatched', 1, now(), now()"
        )
    )
    async with fault_gate.http.get(
        f"{fault_gate.ops_url}/v1/escalations", headers=admin_headers()
    ) as response:
        assert response.status == 200
        queue = (await response.json())["escalations"]
    assert [view["operation"]["operation_id"] for view in queue] == ["op_escalated_late"]
