"""Proposals end to end through real opgate, real PostgreSQL and the fault provider: an agent
proposes the exact request it intends, a human approves or declines it, and only an approved
proposal's exact request is ever let through."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest_asyncio
from standardwebhooks.webhooks import Webhook
from structlog.testing import capture_logs

from proxy.gate.identity import token_digest
from proxy.observe.auditlog.verify import verify
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    SECOND_AGENT_TOKEN,
    WEBHOOK_SECRET,
    Opgate,
    StartOpgate,
    admin_headers,
    fault_policy,
)
from tests.support.proposals import APPROVER_TOKEN, OWNER_TOKEN, PROPOSAL, approver_headers, decide

# the escalation webhooks' receiver, a real aiohttp app (a fixture, used by its name here)
from tests.support.webhooks import Receiver
from tests.support.webhooks import receiver as webhook_receiver  # noqa: F401


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> AsyncIterator[Opgate]:
    """opgate before the fault provider, four eyes on, agent-a owned by the approver otto."""
    policy = fault_policy(deduplicates=False).replace("rules:\n", "four_eyes: true\nrules:\n", 1)
    (policy_dir / "fault.yaml").write_text(policy)
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url},
        agents=[
            {
                "id": "agent-a",
                "tenant": "t1",
                "token_sha256": token_digest(AGENT_TOKEN),
                "owner": "otto",
            },
            {"id": "agent-c", "tenant": "t1", "token_sha256": token_digest(SECOND_AGENT_TOKEN)},
            {"id": "agent-b", "tenant": "t2", "token_sha256": token_digest(OTHER_TENANT_TOKEN)},
        ],
        approvers=[
            {"name": "olga", "token_sha256": token_digest(APPROVER_TOKEN)},
            {"name": "otto", "token_sha256": token_digest(OWNER_TOKEN)},
        ],
    ) as running:
        yield running


async def propose(
    gate: Opgate, token: str = AGENT_TOKEN, **fields: Any
) -> tuple[int, dict[str, Any]]:
    body = json.dumps({**PROPOSAL, **fields}).encode()
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=body, token=token, content_type="application/json"
    )
    return status, json.loads(raw)


async def read(gate: Opgate, proposal_id: str, token: str = AGENT_TOKEN) -> tuple[int, Any]:
    status, _, raw = await gate.send(
        f"/_opgate/v1/proposals/{proposal_id}",
        method="GET",
        data=None,
        content_type=None,
        token=token,
    )
    return status, json.loads(raw)


async def send_exactly(gate: Opgate, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = "&".join(f"{k}={v}" for k, v in request["form"].items())
    status, _, raw = await gate.send(request["path"], data=body, headers=request["headers"])
    return status, json.loads(raw)


async def test_approved_proposal_becomes_the_operation_unchanged_and_is_sendable(
    gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Proposed -> pending (wait, with the exact request) -> approved: the operation holds the
    proposal's fields unchanged, the approver and the proposal id, and that request goes
    through once."""
    status, proposed = await propose(gate)
    assert status == 201, proposed
    assert (proposed["status"], proposed["next_action"]) == ("pending", "wait")
    request = proposed["request"]
    assert request["form"] == {"amount": "500", "currency": "usd", "charge": "ch_1"}
    proposal_id = proposed["proposal"]["proposal_id"]
    operation_id = proposed["proposal"]["operation_id"]
    assert request["headers"]["X-Operation-Id"] == operation_id
    # nothing is sendable while pending: no operation exists yet
    status, refused = await send_exactly(gate, request)
    assert (status, refused["code"]) == (404, "operation_unknown")

    status, approved = await decide(gate, proposal_id, "approve", note="checked order 1042")
    assert status == 201, approved
    op = approved["operation"]
    assert op["operation_id"] == operation_id
    assert (op["tenant"], op["agent_id"], op["provider"], op["action"]) == (
        "t1",
        "agent-a",
        "fault",
        "refund.create",
    )
    assert (op["amount"], op["currency"], op["params"]) == (500, "usd", {"charge": "ch_1"})
    assert op["idempotency_key"] == request["headers"]["Idempotency-Key"]
    assert op["approval"]["ref"] == proposal_id
    assert op["approval"]["approved_by"] == "olga"
    events = (await gate.operation(operation_id))["events"]
    assert events[0]["event"] == "created"
    assert events[0]["actor"] == "human:olga (approver)"
    assert events[0]["detail"]["proposal_id"] == proposal_id

    status, view = await read(gate, proposal_id)
    assert (status, view["status"], view["next_action"]) == (200, "approved", "send")
    assert view["operation_id"] == operation_id
    assert view["request"] == request  # the very request shown when it was proposed
    status, _ = await send_exactly(gate, request)
    assert status == 200
    assert len(fault_provider.effects) == 1
    status, view = await read(gate, proposal_id)
    assert view["next_action"] == "proceed"


async def test_a_declined_proposal_is_never_sendable(
    gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Declined: the agent is told new_approval_required, its request is refused with a code
    and reaches no provider, and it cannot be approved afterwards (409)."""
    _, proposed = await propose(gate)
    proposal_id = proposed["proposal"]["proposal_id"]
    status, declined = await decide(gate, proposal_id, "decline", note="not a duplicate")
    assert (status, declined["status"]) == (200, "declined")
    status, view = await read(gate, proposal_id)
    assert (view["status"], view["next_action"]) == ("declined", "new_approval_required")
    assert "request" not in view
    status, refused = await send_exactly(gate, proposed["request"])
    assert (status, refused["code"]) == (404, "operation_unknown")
    assert fault_provider.requests == []
    status, again = await decide(gate, proposal_id, "approve")
    assert (status, again["code"]) == (409, "proposal_not_pending")


async def withdraw(gate: Opgate, proposal_id: str, token: str = AGENT_TOKEN) -> tuple[int, Any]:
    status, _, raw = await gate.send(
        f"/_opgate/v1/proposals/{proposal_id}/withdraw", token=token, content_type=None
    )
    return status, json.loads(raw)


async def test_the_agent_withdraws_its_pending_proposal_and_only_that(
    gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A pending proposal withdrawn by its agent reads withdrawn (new_approval_required), its
    request is never sendable, an approval after it is refused 409 saying so, and its event is
    on record; a second withdrawal or one of a declined proposal is 409
    proposal_not_withdrawable, and another agent's is told unknown."""
    _, proposed = await propose(gate)
    proposal_id = proposed["proposal"]["proposal_id"]
    status, theirs = await withdraw(gate, proposal_id, SECOND_AGENT_TOKEN)
    assert (status, theirs["code"]) == (404, "proposal_unknown")
    status, withdrawn = await withdraw(gate, proposal_id)
    assert status == 200, withdrawn
    assert (withdrawn["status"], withdrawn["next_action"]) == ("withdrawn", "new_approval_required")
    assert withdrawn["proposal"]["decided_by"] == "agent-a"
    status, view = await read(gate, proposal_id)
    assert (view["status"], view["next_action"]) == ("withdrawn", "new_approval_required")
    status, refused = await send_exactly(gate, proposed["request"])
    assert (status, refused["code"]) == (404, "operation_unknown")
    status, again = await decide(gate, proposal_id, "approve")
    assert (status, again["code"]) == (409, "proposal_not_pending")
    assert "withdrawn by its agent" in again["detail"]
    status, twice = await withdraw(gate, proposal_id)
    assert (status, twice["code"]) == (409, "proposal_not_withdrawable")
    assert "withdrawn" in twice["detail"]
    _, other = await propose(gate)
    await decide(gate, other["proposal"]["proposal_id"], "decline")
    status, decided = await withdraw(gate, other["proposal"]["proposal_id"])
    assert (status, decided["code"]) == (409, "proposal_not_withdrawable")
    assert "declined" in decided["detail"]
    async with gate.http.get(
        f"{gate.ops_url}/v1/proposals/{proposal_id}", headers=admin_headers()
    ) as response:
        events = (await response.json())["events"]
    assert [(e["event"], e["to_status"], e["actor"]) for e in events][-1] == (
        "withdrawn",
        "withdrawn",
        "agent-a",
    )
    assert fault_provider.requests == []


async def test_an_expired_proposal_is_neither_approvable_nor_sendable(
    gate: Opgate, fault_provider: FaultProvider, database_url: str
) -> None:
    """A pending proposal past its expiry reads as expired, new_approval_required; approving or
    declining it is 409 and its request is refused before any provider sees it."""
    _, proposed = await propose(gate)
    proposal_id = proposed["proposal"]["proposal_id"]
    conn = await asyncpg.connect(database_url)
    try:  # time passes: its expiry moves into the past
        await conn.execute(
            "UPDATE proposals SET expires_at = now() - interval '1 second' WHERE proposal_id = $1",
            proposal_id,
        )
    finally:
        await conn.close()
    status, view = await read(gate, proposal_id)
    assert (view["status"], view["next_action"]) == ("expired", "new_approval_required")
    for verdict in ("approve", "decline"):
        status, refused = await decide(gate, proposal_id, verdict)
        assert (status, refused["code"]) == (409, "proposal_not_pending")
    status, refused = await send_exactly(gate, proposed["request"])
    assert (status, refused["code"]) == (404, "operation_unknown")
    assert fault_provider.requests == []


async def test_four_eyes_refuses_the_agents_owner_and_audits_it(gate: Opgate) -> None:
    """With four_eyes, otto (agent-a's owner) is refused 403 four_eyes_refused, the refusal is
    on the proposal's record, and another approver can still approve it."""
    _, proposed = await propose(gate)
    proposal_id = proposed["proposal"]["proposal_id"]
    status, refused = await decide(gate, proposal_id, "approve", token=OWNER_TOKEN)
    assert (status, refused["code"]) == (403, "four_eyes_refused")
    async with gate.http.get(
        f"{gate.ops_url}/v1/proposals/{proposal_id}", headers=admin_headers()
    ) as response:
        detail = await response.json()
    assert detail["status"] == "pending"
    assert [e["event"] for e in detail["events"]] == ["proposed", "approval_refused"]
    assert detail["events"][1]["actor"] == "human:otto (approver)"
    status, _ = await decide(gate, proposal_id, "approve")
    assert status == 201


async def test_another_tenant_reads_the_proposal_as_unknown(gate: Opgate) -> None:
    """Another tenant's agent gets exactly the answer for a proposal id that does not exist."""
    _, proposed = await propose(gate)
    proposal_id = proposed["proposal"]["proposal_id"]
    theirs = await read(gate, proposal_id, token=OTHER_TENANT_TOKEN)
    absent = await read(gate, "prop_does_not_exist", token=OTHER_TENANT_TOKEN)
    assert theirs[0] == absent[0] == 404
    assert theirs[1]["code"] == absent[1]["code"] == "proposal_unknown"
    assert theirs[1].keys() == absent[1].keys()


async def test_two_concurrent_approvals_create_exactly_one_operation(
    gate: Opgate, database_url: str
) -> None:
    """Ten approvals of one proposal raced at once: one 201, the others 409, one operation."""
    _, proposed = await propose(gate)
    proposal_id = proposed["proposal"]["proposal_id"]
    answers = await asyncio.gather(
        *(
            decide(gate, proposal_id, "approve", token=token)
            for token in [APPROVER_TOKEN, ADMIN_TOKEN] * 5
        )
    )
    statuses = sorted(status for status, _ in answers)
    assert statuses == [201] + [409] * 9
    assert {body["code"] for status, body in answers if status == 409} == {"proposal_not_pending"}
    conn = await asyncpg.connect(database_url)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM operations WHERE approval_ref = $1", proposal_id
        )
    finally:
        await conn.close()
    assert count == 1


async def test_malformed_and_unsendable_proposals_are_refused_with_codes(gate: Opgate) -> None:
    """A body that is no proposal is 400 proposal_invalid, a tenant in the body too (it is the
    token's), a proposal no request could carry is 422 approval_not_sendable: each audited."""
    status, body = await propose(gate, tenant="t2")
    assert (status, body["code"]) == (400, "proposal_invalid")
    status, body = await propose(gate, reason="")
    assert (status, body["code"]) == (400, "proposal_invalid")
    status, body = await propose(gate, amount="500")
    assert (status, body["code"]) == (400, "proposal_invalid")
    status, body = await propose(gate, params={"charge": "ch_1", "nope": "x"})
    assert (status, body["code"]) == (422, "approval_not_sendable")
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=b'{"a": 1, "a": 2}', content_type="application/json"
    )
    assert (status, json.loads(raw)["code"]) == (400, "proposal_invalid")
    status, _, raw = await gate.send("/_opgate/v1/proposals", data=json.dumps(PROPOSAL), token=None)
    assert (status, json.loads(raw)["code"]) == (401, "agent_unauthenticated")


async def test_a_nul_anywhere_in_a_proposal_is_refused_and_audited(gate: Opgate) -> None:
    """PostgreSQL stores a NUL neither in text nor in jsonb: a proposal holding one, in its
    reason, a parameter's value or a parameter's name, is 400 proposal_invalid with its audit
    record, never a 500 from the store."""
    cases = [
        {"reason": "refund\x00 it"},
        {"params": {"charge": "ch_\x001"}},
        {"params": {"charge": "ch_1", "\x00": "x"}},
    ]
    with capture_logs() as logs:
        answers = [await propose(gate, **fields) for fields in cases]
    assert [(status, body["code"]) for status, body in answers] == [(400, "proposal_invalid")] * 3
    records = [e for e in logs if e["event"] == "request"]
    assert [(r["decision"], r["reason"]) for r in records] == [("deny", "proposal_invalid")] * 3


async def test_an_approver_token_opens_proposals_only(gate: Opgate) -> None:
    """An approver's token lists proposals but is not an admin token anywhere else (401)."""
    await propose(gate)
    async with gate.http.get(
        f"{gate.ops_url}/v1/proposals", headers=approver_headers()
    ) as response:
        listed = await response.json()
    assert response.status == 200
    assert listed["proposals"]
    assert {p["status"] for p in listed["proposals"]} == {"pending"}
    async with gate.http.get(
        f"{gate.ops_url}/v1/operations", headers=approver_headers()
    ) as response:
        assert response.status == 401


async def test_approvers_are_notified_of_a_new_proposal_by_a_signed_webhook(
    start_opgate: StartOpgate,
    policy_dir: Path,
    webhook_receiver: Receiver,  # noqa: F811  (the imported fixture, by its name)
) -> None:
    """A new proposal sends a `proposal_pending` notice, signed the Standard Webhooks way (the
    reference library verifies it), carrying the proposal and its exact request."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        background_interval_seconds=0.05, escalation_webhook_url=webhook_receiver.url
    ) as gate:
        _, proposed = await propose(gate)
        await asyncio.wait_for(webhook_receiver.arrived.wait(), 20)
    body, headers = webhook_receiver.received[0]
    verified: dict[str, Any] = Webhook(WEBHOOK_SECRET).verify(body, headers)
    assert verified["event"] == "proposal_pending"
    assert verified["proposal"]["proposal_id"] == proposed["proposal"]["proposal_id"]
    assert verified["request"] == proposed["request"]
    assert headers["webhook-id"] == f"ntf_{verified['notification_id']}"


async def test_every_proposal_request_leaves_exactly_one_audit_record(gate: Opgate) -> None:
    """Each proposal request, accepted, refused or read across tenants, is one request record
    under rule `proposal`, with the code the agent got (the truth, for another tenant's)."""
    with capture_logs() as logs:
        accepted, proposed = await propose(gate)
        malformed, _ = await propose(gate, reason="")
        unsendable, _ = await propose(gate, params={"nope": "x"})
        theirs, _ = await read(gate, proposed["proposal"]["proposal_id"], OTHER_TENANT_TOKEN)
    assert (accepted, malformed, unsendable, theirs) == (201, 400, 422, 404)
    records = [entry for entry in logs if entry["event"] == "request"]
    assert [(r["rule"], r["decision"], r["reason"], r["response_status"]) for r in records] == [
        ("proposal", "allow", None, 201),
        ("proposal", "deny", "proposal_invalid", 400),
        ("proposal", "deny", "approval_not_sendable", 422),
        ("proposal", "deny", "operation_scope_mismatch", 404),
    ]
    assert records[0]["operation_id"] == proposed["proposal"]["operation_id"]
    assert records[3]["tenant"] == "t2"


async def test_proposal_decisions_are_chained_audit_records_that_verify(
    gate: Opgate, database_url: str
) -> None:
    """The proposal, the refused and the accepted approval are records of the proposal's own
    stream, naming the operation; the created transition names the proposal; the whole log
    still verifies."""
    _, proposed = await propose(gate)
    proposal_id = proposed["proposal"]["proposal_id"]
    operation_id = proposed["proposal"]["operation_id"]
    await decide(gate, proposal_id, "approve", token=OWNER_TOKEN)  # refused: four eyes
    await decide(gate, proposal_id, "approve")
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT kind, operation_id, record->>'event' AS event, record->>'actor' AS actor"
            " FROM audit_log WHERE stream = $1 ORDER BY seq",
            f"proposals/{proposal_id}",
        )
        created = await conn.fetchval(
            "SELECT record->'detail'->>'proposal_id' FROM audit_log"
            " WHERE stream = $1 AND record->>'event' = 'created'",
            operation_id,
        )
        report = await verify(
            conn,
            datetime(1970, 1, 1, tzinfo=UTC),
            datetime(9999, 1, 1, tzinfo=UTC),
            key=None,
            whole_log=True,
        )
    finally:
        await conn.close()
    assert [(r["kind"], r["operation_id"], r["event"]) for r in rows] == [
        ("proposal", operation_id, "proposed"),
        ("proposal", operation_id, "approval_refused"),
        ("proposal", operation_id, "approved"),
    ]
    assert [r["actor"] for r in rows] == [
        "agent-a",
        "human:otto (approver)",
        "human:olga (approver)",
    ]
    assert created == proposal_id
    assert report.first_break() is None


async def test_the_pending_proposals_are_a_metric(gate: Opgate) -> None:
    """/metrics counts the proposals waiting for an approver; a decided one no longer counts."""

    async def pending() -> float:
        async with gate.http.get(f"{gate.ops_url}/metrics") as response:
            text = await response.text()
        [line] = [x for x in text.splitlines() if x.startswith("opgate_proposals_pending ")]
        return float(line.split()[1])

    _, first = await propose(gate)
    await propose(gate)
    assert await pending() == 2
    await decide(gate, first["proposal"]["proposal_id"], "decline")
    assert await pending() == 1


async def test_approvals_raced_across_two_opgate_instances_create_one_operation(
    start_opgate: StartOpgate,
    policy_dir: Path,
    database_url: str,
    fault_provider: FaultProvider,
) -> None:
    """Two opgate instances on one database, twenty approvals of one proposal split between
    them and raced: one is created, every other is 409, and one operation row exists."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with (
        start_opgate(upstream_overrides={"fault": fault_provider.url}) as one,
        start_opgate(upstream_overrides={"fault": fault_provider.url}) as two,
    ):
        _, proposed = await propose(one)
        proposal_id = proposed["proposal"]["proposal_id"]
        answers = await asyncio.gather(
            *(decide(gate, proposal_id, "approve", token=ADMIN_TOKEN) for gate in [one, two] * 10)
        )
    assert sorted(status for status, _ in answers) == [201] + [409] * 19
    conn = await asyncpg.connect(database_url)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM operations WHERE approval_ref = $1", proposal_id
        )
    finally:
        await conn.close()
    assert count == 1
