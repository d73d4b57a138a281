"""The timeline rule in the store (migration 0014, queries.sql ``timeline_seen``): the timeline
each new connection sees is recorded, and the first time it is greater than every one recorded,
the operations still created or dispatched are marked ``lookup_before_send``; a marked row is
claimed only after its lookup, never as sent.

Here, on the suite's single server, the switch is the recorded history made to end one
timeline lower than the server's own: the statement that detects and marks is the real one.
tests/faults/test_failover_async.py and the last test here switch for real (a promoted
standby)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio

from proxy.gate.checks import decide_by_state
from proxy.gate.decision import ClaimKind, Forward
from proxy.policy.load import parse_policy_text
from proxy.store.operation import LastOutcome, Operation, Status
from proxy.store.store import Claim, ProviderAnswer, Store, TimelineSeen, see_timeline
from tests.support.cluster import missing_reason, running_cluster
from tests.support.operations import new_operation
from tests.support.opgate import fault_policy
from tests.support.timelines import pretend_the_last_timeline_was_lower


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=20)
    try:
        yield opened
    finally:
        await opened.close()


async def _seen(database_url: str) -> TimelineSeen:
    """What one new connection sees, as the pool's ``init`` would."""
    conn = await asyncpg.connect(database_url)
    try:
        return await see_timeline(conn)
    finally:
        await conn.close()


async def _dispatched(store: Store, operation_id: str, outcome: LastOutcome | None) -> None:
    await store.create(new_operation(operation_id), actor="test")
    claimed = await store.claim(
        Claim(operation_id, owner="o", lease_seconds=30, expected_attempts=0)
    )
    assert claimed is not None
    if outcome is not None:
        await store.end_attempt(operation_id, 1, outcome.value, None, "test")


async def _events(store: Store, operation_id: str) -> list[str]:
    return [e["event"] for e in await store.events(operation_id)]


async def test_the_first_timeline_recorded_marks_nothing(store: Store, database_url: str) -> None:
    """A database that never recorded a timeline (a new install, or just migrated) saw no
    switch: the timeline is recorded and nothing is put in doubt."""
    await store.create(new_operation("op_before"), actor="test")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("DELETE FROM timelines")
    finally:
        await conn.close()
    seen = await _seen(database_url)
    assert (seen.previous, seen.marked) == (None, 0)
    assert seen.current is not None
    op = await store.load("op_before")
    assert op is not None
    assert op.lookup_before_send is None
    assert (await _seen(database_url)).marked is None  # recorded once


async def test_a_greater_timeline_marks_what_was_unsettled_once(
    store: Store, database_url: str
) -> None:
    """Created and dispatched rows are marked, with an event each, in the statement that
    records the new timeline; settled rows, and rows created after it, are not."""
    await store.create(new_operation("op_created"), actor="test")
    await _dispatched(store, "op_unknown", LastOutcome.UNKNOWN_TIMEOUT)
    await _dispatched(store, "op_confirmed", None)
    answer = ProviderAnswer(200, "re_1", "application/json", b"{}")
    await store.settle("op_confirmed", Status.CONFIRMED, answer, "test")
    current = await pretend_the_last_timeline_was_lower(database_url)

    seen = await _seen(database_url)
    assert (seen.current, seen.previous, seen.marked) == (current, current - 1, 2)
    await store.create(new_operation("op_after"), actor="test")
    assert (await _seen(database_url)).marked is None
    marked = {
        op_id: (op := await store.load(op_id)) is not None and op.lookup_before_send is not None
        for op_id in ("op_created", "op_unknown", "op_confirmed", "op_after")
    }
    assert marked == {
        "op_created": True,
        "op_unknown": True,
        "op_confirmed": False,
        "op_after": False,
    }
    assert (await _events(store, "op_created"))[-1] == "timeline_switched"
    switched = (await store.events("op_unknown"))[-1]
    assert switched["event"] == "timeline_switched"
    assert switched["detail"] == {"timeline": current, "previous_timeline": current - 1}


async def test_a_witness_on_a_server_that_never_streamed_proves_nothing(
    store: Store, database_url: str
) -> None:
    """A witness of the previous timeline naming a required standby, read by a server asked
    to prove the switch: this server never received WAL by streaming (it was not that
    standby), so it marks, and keeps no proof sentence."""
    await store.create(new_operation("op_witnessed"), actor="test")
    current = await pretend_the_last_timeline_was_lower(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO sync_witness (timeline_id, standby_names, wal_senders,"
            " statement_timeout, recorded_at) VALUES ($1, 'opgate_standby',"
            " '{opgate_standby}', '0', now())",
            current - 1,
        )
        seen = await see_timeline(conn, prove=True)
        kept = await conn.fetchval(
            "SELECT unmarked_because FROM timelines WHERE timeline_id = $1", current
        )
    finally:
        await conn.close()
    assert seen.marked == 1
    assert kept is None
    op = await store.load("op_witnessed")
    assert op is not None
    assert op.lookup_before_send is not None


async def test_opgate_processes_seeing_the_switch_at_once_mark_once(
    store: Store, database_url: str
) -> None:
    """Ten connections (as many processes' pools) see the new timeline together: one
    records it and marks; the others wait for its commit and mark nothing."""
    for i in range(5):
        await store.create(new_operation(f"op_{i}"), actor="test")
    await pretend_the_last_timeline_was_lower(database_url)
    seen = await asyncio.gather(*(_seen(database_url) for _ in range(10)))
    assert sorted((s.marked for s in seen), key=str) == [5] + [None] * 9
    for i in range(5):
        assert (await _events(store, f"op_{i}")).count("timeline_switched") == 1


async def test_a_new_pool_connection_marks_before_it_is_used(database_url: str) -> None:
    """Store.open's pool runs the detection on each new connection, before any statement of
    the caller: the first read after the switch already shows the mark."""
    first = await Store.open(database_url, min_size=1, max_size=1)
    try:
        await first.create(new_operation("op_1"), actor="test")
    finally:
        await first.close()
    await pretend_the_last_timeline_was_lower(database_url)
    reopened = await Store.open(database_url, min_size=1, max_size=1)
    try:
        op = await reopened.load("op_1")
    finally:
        await reopened.close()
    assert op is not None
    assert op.lookup_before_send is not None


async def _mark(store: Store, database_url: str, *operation_ids: str) -> None:
    await pretend_the_last_timeline_was_lower(database_url)
    assert (await _seen(database_url)).marked == len(operation_ids)


async def test_a_row_in_doubt_is_claimed_only_after_its_lookup(
    store: Store, database_url: str
) -> None:
    """No plain claim, no reconciliation lease for a created row (absence
    there means "send", not "failed"); the lookup's lease, then the claim under it, which
    clears the mark."""
    await store.create(new_operation("op_1"), actor="test")
    await _mark(store, database_url, "op_1")
    assert (
        await store.claim(Claim("op_1", owner="a", lease_seconds=30, expected_attempts=0)) is None
    )
    assert await store.claim_reconcile_one("op_1", "r1", 30) is None
    taken = await store.claim_reconcile_one("op_1", "r1", 30, in_doubt=True)
    assert taken is not None
    assert taken.status is Status.CREATED
    assert (
        await store.claim(Claim("op_1", owner="a", lease_seconds=30, expected_attempts=0)) is None
    )
    claimed_row = await store.claim(
        Claim("op_1", owner="a", lease_seconds=30, expected_attempts=0, after_lookup_by="r1")
    )
    assert claimed_row is not None
    assert (claimed_row.status, claimed_row.attempts) == (Status.DISPATCHED, 1)
    assert claimed_row.lookup_before_send is None
    claim_event = (await store.events("op_1"))[-1]
    assert claim_event["detail"]["after_lookup"] == "r1"


async def test_a_created_row_in_doubt_found_by_its_lookup_is_settled_reconciled(
    store: Store, database_url: str
) -> None:
    """The lost timeline sent it: confirmed from the provider's record, straight from created."""
    await store.create(new_operation("op_1"), actor="test")
    await _mark(store, database_url, "op_1")
    assert await store.claim_reconcile_one("op_1", "r1", 30, in_doubt=True) is not None
    found = ProviderAnswer(200, "re_1", "application/json", b'{"id": "re_1"}')
    settled = await store.settle_reconciled(
        "op_1", "r1", Status.CONFIRMED, "reconciled", found, {}, expected_attempts=0
    )
    assert settled is not None
    assert (settled.status, settled.settled_reason, settled.attempts) == (
        Status.CONFIRMED,
        "reconciled",
        0,
    )
    event = (await store.events("op_1"))[-1]
    assert (event["event"], event["from_status"], event["to_status"]) == (
        "reconciled",
        "created",
        "confirmed",
    )


async def test_a_created_row_in_doubt_can_be_escalated_and_is_then_never_claimed(
    store: Store, database_url: str
) -> None:
    """Without a lookup it goes to a human: escalated while created, claimable by no one,
    settled by the human's verdict."""
    await store.create(new_operation("op_1"), actor="test")
    await store.create(new_operation("op_fresh"), actor="test")
    await _mark(store, database_url, "op_1", "op_fresh")
    assert await store.claim_reconcile_one("op_1", "r1", 30, in_doubt=True) is not None
    escalated = await store.escalate(
        "op_1", None, "no lookup", {}, look_again_seconds=3600, actor="test"
    )
    assert escalated is not None
    assert (escalated.status, escalated.escalated_at is not None) == (Status.CREATED, True)
    # not even by a lookup's lease taken before the escalation
    assert (
        await store.claim(
            Claim("op_1", owner="a", lease_seconds=30, expected_attempts=0, after_lookup_by="r1")
        )
        is None
    )
    assert await store.claim_reconcile_one("op_1", "r2", 30, in_doubt=True) is None
    resolved = await store.resolve("op_1", Status.FAILED, None, "not sent", "alice")
    assert resolved is not None
    assert resolved.status is Status.FAILED
    # a created row that is not in doubt is never escalated this way
    await store.create(new_operation("op_new"), actor="test")
    assert await store.escalate("op_new", None, "x", {}, look_again_seconds=1, actor="test") is None


ROW_STATES = {
    "created": None,
    "never left": LastOutcome.NOT_SENT,
    "unknown outcome": LastOutcome.UNKNOWN_TIMEOUT,
}
DEDUPLICATING, _ = parse_policy_text(fault_policy(deduplicates=True, grace_seconds=0), "f.yaml")


@pytest.mark.parametrize("state", list(ROW_STATES))
async def test_the_gate_asks_first_exactly_where_the_claim_refuses_to_go_unasked(
    store: Store, database_url: str, state: str
) -> None:
    """One fact in two places kept equal: a row in doubt is routed to its lookup by the checks
    and taken by no claim without one, in each state where, not in doubt, the claim would take
    it unasked (a provider that deduplicates: every unasked path of the statement open)."""
    provider = DEDUPLICATING
    assert provider is not None
    window = provider.idempotency.dedup_window_seconds
    outcomes = {}
    for doubted in (True, False):  # the one in doubt first: the switch marks every row
        operation_id = f"op_{doubted}"
        if state == "created":
            await store.create(new_operation(operation_id), actor="test")
        else:
            await _dispatched(store, operation_id, ROW_STATES[state])
        if doubted:
            await _mark(store, database_url, operation_id)
        op = await store.load(operation_id)
        assert op is not None
        decision = decide_by_state(provider, op)
        unasked = isinstance(decision, Forward) and decision.claim in (
            ClaimKind.FIRST,
            ClaimKind.RESEND,
        )
        claimed = await store.claim(
            Claim(
                operation_id,
                owner="a",
                lease_seconds=30,
                expected_attempts=op.attempts,
                dedup_window_seconds=window,
            )
        )
        outcomes[doubted] = (unasked, claimed is not None)
        if doubted:
            assert decision == Forward(ClaimKind.RESEND_AFTER_LOOKUP)
    assert outcomes[True] == (False, False)
    assert outcomes[False][1] is True  # not in doubt, the statement takes it unasked


async def test_a_promoted_standby_puts_what_was_unsettled_in_doubt() -> None:
    """A real switch: a primary with a streaming standby, operations created and claimed,
    the primary crashed, the standby promoted; no replication judgement ever witnessed the
    synchronous standby (proxy/store/promotion.py), so the first connection to it marks them."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_cluster(sync=True) as cluster:
        dsn = await cluster.create_database()
        assert await _seen(cluster.standby.dsn()) == TimelineSeen(None, None, None)
        store = await Store.open(dsn, min_size=1, max_size=2)
        try:
            await store.create(new_operation("op_created"), actor="test")
            await _dispatched(store, "op_dispatched", LastOutcome.UNKNOWN_DROPPED)
            before = await store.load("op_created")
        finally:
            await store.close()
        assert before is not None
        assert before.lookup_before_send is None
        await asyncio.to_thread(cluster.kill_primary)
        await asyncio.to_thread(cluster.promote)
        promoted = await Store.open(dsn, min_size=1, max_size=2)
        try:
            rows = [await promoted.load(i) for i in ("op_created", "op_dispatched")]
            await promoted.create(new_operation("op_after"), actor="test")
            after = await promoted.load("op_after")
        finally:
            await promoted.close()
    doubted = [op for op in rows if isinstance(op, Operation) and op.lookup_before_send]
    assert len(doubted) == 2
    assert after is not None
    assert after.lookup_before_send is None
    seen_at = doubted[0].lookup_before_send
    assert seen_at is not None
    assert datetime.now(UTC) - seen_at < timedelta(minutes=1)
