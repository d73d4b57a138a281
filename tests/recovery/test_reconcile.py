"""Reconciliation with the provider, the source of truth about effects: lookups interpreted
(pure), and the whole loop against the fault provider and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import web

from proxy.gate.lookup import Absent, Found, Inconclusive, interpret_lookup, render_lookup
from proxy.policy.model import ReconcileLookup
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.operations import operation
from tests.support.opgate import Opgate, StartOpgate, admin_headers, fault_policy
from tests.support.polling import until

LIST = ReconcileLookup(path="/v1/refunds", query={"charge": "{charge}"}, absence_is_conclusive=True)
GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


def listing(*items: dict[str, Any], has_more: bool = False) -> bytes:
    return json.dumps({"object": "list", "data": list(items), "has_more": has_more}).encode()


INTERPRETATIONS: list[tuple[str, ReconcileLookup, int, bytes, object]] = [
    (
        "found by metadata",
        LIST,
        200,
        listing(
            {"id": "re_1", "metadata": {}}, {"id": "re_2", "metadata": {"operation_id": "op_1"}}
        ),
        Found({"id": "re_2", "metadata": {"operation_id": "op_1"}}),
    ),
    (
        "complete list without it",
        LIST,
        200,
        listing({"id": "re_1", "metadata": {}}),
        Absent(conclusive=True),
    ),
    ("incomplete list without it", LIST, 200, listing(has_more=True), Absent(conclusive=False)),
    (
        "absence not declared conclusive",
        ReconcileLookup(path="/v1/refunds"),
        200,
        listing(),
        Absent(conclusive=False),
    ),
    ("provider error", LIST, 500, b"{}", Inconclusive("the lookup answered 500")),
    ("not JSON", LIST, 200, b"<html>", Inconclusive("the lookup answer is not JSON")),
    (
        "single object found",
        ReconcileLookup(path="/v1/x/{id}", items=None, absence_is_conclusive=True),
        200,
        json.dumps({"id": "x", "metadata": {"operation_id": "op_1"}}).encode(),
        Found({"id": "x", "metadata": {"operation_id": "op_1"}}),
    ),
    (
        "single object 404",
        ReconcileLookup(path="/v1/x/{id}", items=None, absence_is_conclusive=True),
        404,
        b"{}",
        Absent(conclusive=True),
    ),
]


@pytest.mark.parametrize(
    ("scenario", "lookup", "status", "body", "result"),
    INTERPRETATIONS,
    ids=[i[0] for i in INTERPRETATIONS],
)
def test_interpret_lookup(
    scenario: str, lookup: ReconcileLookup, status: int, body: bytes, result: object
) -> None:
    """What a lookup answer proves about the operation's effect."""
    assert interpret_lookup(lookup, status, body, "op_1") == result


def test_render_lookup_uses_approved_values_and_skips_what_the_operation_lacks() -> None:
    """Lookups are built from the approved row only; one naming a missing value is skipped."""
    op = operation(params={"charge": "ch_1&x=y"})
    assert render_lookup(LIST, op) == "/v1/refunds?charge=ch_1%26x%3Dy"
    assert (
        render_lookup(ReconcileLookup(path="/v1/refunds", query={"pi": "{payment_intent}"}), op)
        is None
    )


def op_header(op: dict[str, Any]) -> dict[str, str]:
    return {"X-Operation-Id": op["operation_id"]}


async def recovery(gate: Opgate, operation_id: str) -> dict[str, Any]:
    status, _, body = await gate.send(
        f"/_opgate/v1/operations/{operation_id}", method="GET", data=None, content_type=None
    )
    assert status == 200, body
    payload: dict[str, Any] = json.loads(body)
    return payload


async def test_unknown_outcome_with_an_effect_reconciles_to_confirmed(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """The connection dropped after the provider acted: the agent's recovery read asks the
    provider, finds the effect by its operation id, and is told to proceed."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, grace_seconds=30))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.DROP_AFTER_COMMIT
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502
        fault_provider.mode = FaultMode.OK
        view = await recovery(gate, op["operation_id"])
    assert view["next_action"] == "proceed"
    assert view["operation"]["status"] == "confirmed"
    assert view["operation"]["settled_reason"] == "reconciled"
    assert view["operation"]["provider_response"]["object_id"] == fault_provider.effects[0].id
    lookups = [r for r in fault_provider.requests if r.method == "GET"]
    assert [r.query_string for r in lookups] == ["charge=ch_1"]
    assert lookups[0].headers["Authorization"].startswith("Bearer sk_test_provider")
    assert len(fault_provider.effects) == 1


async def test_unknown_outcome_without_an_effect_settles_as_no_effect_after_the_grace(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """The attempt timed out and nothing happened: absence becomes conclusive only once the
    grace period has passed, then the row is failed/no_effect and a new approval is needed."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, total_timeout=0.3, grace_seconds=0.5)
    )
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.STALL
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 504
        fault_provider.release()
        fault_provider.mode = FaultMode.OK
        first = await recovery(gate, op["operation_id"])
        assert first["next_action"] in ("reconcile", "wait")
        assert first["operation"]["status"] == "dispatched"

        async def settled() -> dict[str, Any] | None:
            view = await recovery(gate, op["operation_id"])
            return (
                view
                if view["next_action"] != "wait" and view["operation"]["status"] != "dispatched"
                else None
            )

        final = await until(settled, "settled", seconds=20)
    assert final["next_action"] == "new_approval_required"
    assert (final["operation"]["status"], final["operation"]["settled_reason"]) == (
        "failed",
        "no_effect",
    )
    assert fault_provider.effects == []


@dataclass
class Webhook:
    url: str
    received: list[dict[str, Any]] = field(default_factory=list)


@pytest_asyncio.fixture(loop_scope="session")
async def webhook() -> AsyncIterator[Webhook]:
    hook = Webhook("")

    async def receive(request: web.Request) -> web.Response:
        hook.received.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/escalations", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    hook.url = f"http://127.0.0.1:{port}/escalations"
    try:
        yield hook
    finally:
        await runner.cleanup()


async def test_failing_lookups_escalate_once_and_a_human_verdict_settles(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    webhook: Webhook,
    database_url: str,
) -> None:
    """A provider whose lookups keep failing: the background loop escalates the operation,
    the webhook hears of it once, and a human's verdict confirms it."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, grace_seconds=0, max_attempts=2)
    )
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url},
        background_interval_seconds=0.05,
        escalation_webhook_url=webhook.url,
    ) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT  # the POST and every lookup: 500
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502

        async def notified() -> bool:
            return len(webhook.received) >= 1

        await until(notified, "notified", seconds=20)
        view = await recovery(gate, op["operation_id"])
        assert view["next_action"] == "escalated"
        assert "inconclusive 2 times" in view["reason"]
        async with gate.http.get(f"{gate.ops_url}/v1/escalations", headers=admin_headers()) as r:
            escalations = (await r.json())["escalations"]
        assert [e["operation"]["operation_id"] for e in escalations] == [op["operation_id"]]
        status, _, body = await gate.send(
            "/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op)
        )
        assert (status, json.loads(body)["code"]) == (409, "operation_escalated")
        async with gate.http.post(
            f"{gate.ops_url}/v1/operations/{op['operation_id']}/resolve",
            json={
                "verdict": "confirmed",
                "object_id": fault_provider.effects[0].id,
                "note": "seen in the provider dashboard",
                "decided_by": "bob",
            },
            headers=admin_headers(),
        ) as response:
            assert response.status == 200, await response.text()
            resolved = await response.json()
    assert resolved["next_action"] == "proceed"
    assert resolved["operation"]["settled_reason"] == "human_verdict"
    assert [n["operation"]["operation_id"] for n in webhook.received] == [op["operation_id"]]
    assert webhook.received[0]["event"] == "operation_escalated"
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT attempts, delivered_at FROM escalation_notifications")
        events = await conn.fetch(
            "SELECT event FROM operation_events WHERE operation_id = $1 ORDER BY event_id",
            op["operation_id"],
        )
    finally:
        await conn.close()
    assert [(r["attempts"], r["delivered_at"] is not None) for r in rows] == [(1, True)]
    assert [e["event"] for e in events] == [
        "created",
        "claimed",
        "unknown",
        "reconcile_inconclusive",
        "escalated",
        "resolved",
    ]
    assert len(fault_provider.effects) == 1


async def test_two_replicas_never_reconcile_the_same_operation_twice(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """Two opgate replicas' background loops race over 20 unknown operations: each operation
    is looked up at the provider exactly once and confirmed."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, grace_seconds=30))
    overrides = {"fault": fault_provider.url}
    async with start_opgate(upstream_overrides=overrides) as sender:
        ops = [await sender.approve(params={"charge": f"ch_{i}"}) for i in range(20)]
        fault_provider.mode = FaultMode.DROP_AFTER_COMMIT
        for i, op in enumerate(ops):
            body = f"amount=500&currency=usd&charge=ch_{i}"
            status, _, _ = await sender.send("/fault/v1/refunds", data=body, headers=op_header(op))
            assert status == 502
        fault_provider.mode = FaultMode.OK
        async with (
            start_opgate(
                upstream_overrides=overrides,
                background_interval_seconds=0.01,
                instance_id="replica-a",
            ),
            start_opgate(
                upstream_overrides=overrides,
                background_interval_seconds=0.01,
                instance_id="replica-b",
            ),
        ):

            async def all_confirmed() -> bool:
                rows = [await sender.operation(op["operation_id"]) for op in ops]
                return all(row["status"] == "confirmed" for row in rows)

            await until(all_confirmed, "all confirmed", seconds=20)
        rows = [await sender.operation(op["operation_id"]) for op in ops]
    lookups = [r.query_string for r in fault_provider.requests if r.method == "GET"]
    assert sorted(lookups) == sorted(f"charge=ch_{i}" for i in range(20))
    actors = {e["actor"] for row in rows for e in row["events"] if e["event"] == "reconciled"}
    assert {actor.rsplit(":", 1)[0] for actor in actors} <= {"replica-a:loop", "replica-b:loop"}
    assert len(fault_provider.effects) == 20


async def test_recovery_reads_are_paced_by_the_rule_and_do_not_escalate_by_accident(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A replacement agent polls fast through a lookup outage: one lookup per retry_seconds,
    whoever asks, so five quick reads cost one provider call, each `reconcile` answer says
    when to ask again, and two allowed tries are not used up into an escalation."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, grace_seconds=0, max_attempts=2, retry_seconds=30)
    )
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT  # the POST and every lookup: 500
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502
        views = [await recovery(gate, op["operation_id"]) for _ in range(5)]
    assert [v["next_action"] for v in views] == ["reconcile"] * 5
    assert all(20 <= v["retry_after_seconds"] <= 30 for v in views), views
    lookups = [r for r in fault_provider.requests if r.method == "GET"]
    assert len(lookups) == 1
    assert views[-1]["operation"]["escalation"] is None


async def test_an_escalated_operation_is_still_looked_up_and_settles_when_the_effect_shows(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    webhook: Webhook,
) -> None:
    """Lookups failed until a human was asked; later the provider answers and shows the
    effect: the background loop, still looking at a low rate, settles it confirmed and the
    humans are told."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(
            deduplicates=False, grace_seconds=0, max_attempts=1, escalated_retry_seconds=0.05
        )
    )
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url},
        background_interval_seconds=0.05,
        escalation_webhook_url=webhook.url,
    ) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502

        async def escalated() -> bool:
            return (await gate.operation(op["operation_id"]))["escalation"] is not None

        await until(escalated, "escalated", seconds=20)
        fault_provider.mode = FaultMode.OK

        async def confirmed() -> dict[str, Any] | None:
            row = await gate.operation(op["operation_id"])
            return row if row["status"] == "confirmed" else None

        row = await until(confirmed, "confirmed", seconds=20)

        async def told() -> bool:
            return len(webhook.received) >= 2

        await until(told, "told", seconds=20)
    assert row["settled_reason"] == "reconciled"
    assert row["provider_response"]["object_id"] == fault_provider.effects[0].id
    assert [n["event"] for n in webhook.received] == [
        "operation_escalated",
        "operation_settled_by_provider",
    ]
    assert len(fault_provider.effects) == 1


async def test_an_escalated_operation_whose_effect_is_absent_stays_with_the_human(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """Absence, even conclusive, never settles an escalated operation: a human decides."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(
            deduplicates=False, grace_seconds=0, max_attempts=1, escalated_retry_seconds=0.05
        )
    )
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, background_interval_seconds=0.05
    ) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.STALL  # nothing committed; the timeout is 2 s
        sent = asyncio.create_task(
            gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        )
        await fault_provider.in_flight.wait()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT  # lookups fail: escalate
        status, _, _ = await sent
        assert status == 504
        fault_provider.release()

        async def escalated() -> bool:
            return (await gate.operation(op["operation_id"]))["escalation"] is not None

        await until(escalated, "escalated", seconds=20)
        fault_provider.mode = FaultMode.OK  # lookups now answer: no refund exists

        async def looked_up_again() -> bool:
            gets = [r for r in fault_provider.requests if r.method == "GET"]
            return len(gets) >= 3

        await until(looked_up_again, "looked up again", seconds=20)
        row = await gate.operation(op["operation_id"])
    assert (row["status"], row["escalation"] is not None) == ("dispatched", True)
    assert fault_provider.effects == []


async def test_the_reconciliation_lease_outlasts_its_lookups(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
) -> None:
    """A lookup may take the provider's whole timeout (here 90 s): the reconciliation lease
    taken for it must be longer, or it could lapse while the lookup is still out."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, total_timeout=90, grace_seconds=0)
    )
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.DROP_AFTER_COMMIT
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502
        fault_provider.mode = FaultMode.STALL
        read = asyncio.create_task(recovery(gate, op["operation_id"]))
        await fault_provider.in_flight.wait()
        conn = await asyncpg.connect(database_url)
        try:
            remaining = await conn.fetchval(
                "SELECT extract(epoch FROM reconcile_lease_until - now()) FROM operations "
                "WHERE operation_id = $1",
                op["operation_id"],
            )
        finally:
            await conn.close()
        fault_provider.mode = FaultMode.OK
        fault_provider.release()
        await read
    assert remaining > 90


async def test_without_lookups_a_retained_key_is_left_to_the_agent_not_escalated(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """No lookup is declared, but the provider deduplicates and keeps the key: the agent is
    told to retry, so the background loop must not escalate it to a human meanwhile."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=True))
    fault_provider.deduplicate = True
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, background_interval_seconds=0.05
    ) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502

        async def looked_at() -> dict[str, Any] | None:
            row = await gate.operation(op["operation_id"])
            tried = any(e["event"].startswith(("reconcile", "escalated")) for e in row["events"])
            return row if tried else None

        row = await until(looked_at, "looked at", seconds=20)
        view = await recovery(gate, op["operation_id"])
        fault_provider.mode = FaultMode.OK
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
    assert row["escalation"] is None
    assert view["next_action"] == "retry"
    assert status == 200
    assert len(fault_provider.effects) == 1
