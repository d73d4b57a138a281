"""The claim commits only the decision made on the row as read (queries.sql claim_operation's
read_version and decided_before, proxy/gate/transitions.py commit_guard): a concurrent writer
that moves the row between the read and the commit, even while the claim waits for the row's
lock, leaves the decision uncommitted; so does a deadline that passes first, the wait counted."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
import pytest_asyncio

from proxy.gate.transitions import ClaimRule, Kind, commit_guard, stale_reason, transition
from proxy.store import queries
from proxy.store.operation import Operation, Status
from proxy.store.store import Claim, Store
from tests.support.operations import new_operation
from tests.support.polling import until

RULE = ClaimRule("fault", None, lookups=False)
_DISPATCHED_NOT_SENT = """
UPDATE operations SET status = 'dispatched', attempts = 1, unsent_attempts = 1,
       last_outcome = 'not_sent', dispatched_at = clock_timestamp(),
       attempt_ended_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE operation_id = $1
"""


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


@pytest_asyncio.fixture(loop_scope="session")
async def writer(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A second connection: the concurrent writer (here, the reconciler's)."""
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def _unsent(store: Store, operation_id: str) -> Operation:
    """A dispatched operation whose only attempt never left, as read from the primary: the
    gate decides to re-send it (resend_not_sent)."""
    await store.create(new_operation(operation_id), actor="test")
    await store.run(lambda conn: conn.execute(_DISPATCHED_NOT_SENT, operation_id))
    read = await store.load(operation_id)
    assert read is not None
    assert transition(read, RULE).kind is Kind.RESEND_NOT_SENT
    return read


def _claim(read: Operation, lifetime_seconds: float = 60.0) -> Claim:
    guard = commit_guard(read, lifetime_seconds)
    return Claim(
        read.operation_id,
        owner="gate",
        lease_seconds=30,
        expected_attempts=read.attempts,
        read_version=guard.read_version,
        decided_before=guard.decided_before,
    )


async def _waiting_for_the_row(writer: asyncpg.Connection) -> None:
    await until(
        lambda: writer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        ),
        "the claim waits for the writer's row lock",
    )


async def test_a_decision_on_a_row_a_concurrent_writer_moved_claims_nothing(
    store: Store, writer: asyncpg.Connection
) -> None:
    """The reconciler takes the row's lease and leaves it to the agent (it stays claimable:
    never sent, approval standing) in a transaction the claim waits for: once it commits, the
    claim, decided on the read before, claims nothing; read again, the row tells why, and a
    claim decided on that read goes."""
    read = await _unsent(store, "op_moved")
    transaction = writer.transaction()
    await transaction.start()
    try:
        taken = await queries.fetchrow(
            writer, "claim_reconcile_one", operation_id="op_moved", owner="bg",
            lease_seconds=30.0, in_doubt=False, unchanged_since=None,
        )  # fmt: skip
        assert taken is not None
        left = await queries.fetchrow(
            writer, "reconcile_inconclusive", operation_id="op_moved", owner="bg",
            retry_in_seconds=3600.0, evidence="{}", expected_attempts=1,
        )  # fmt: skip
        assert left is not None
        claim = asyncio.create_task(store.claim(_claim(read)))
        await _waiting_for_the_row(writer)
    finally:
        await transaction.commit()
    assert await claim is None, "a decision on a row that changed since was committed"
    current = await store.load("op_moved")
    assert current is not None
    assert (current.status, current.attempts) == (Status.DISPATCHED, 1)
    assert transition(current, RULE).kind is Kind.RESEND_NOT_SENT  # still allowed: only stale
    why = stale_reason(commit_guard(read, 60.0), current)
    assert why is not None
    assert why.startswith("the operation changed while this request was decided")
    claimed = await store.claim(_claim(current))
    assert claimed is not None
    assert claimed.attempts == 2


async def test_the_same_claim_unguarded_would_have_gone(
    store: Store, writer: asyncpg.Connection
) -> None:
    """The control: the statement's own conditions let the moved row go (an unguarded claim
    takes it), so the guard alone refused the stale decision above."""
    read = await _unsent(store, "op_moved_unguarded")
    await queries.fetchrow(
        writer, "claim_reconcile_one", operation_id="op_moved_unguarded", owner="bg",
        lease_seconds=30.0, in_doubt=False, unchanged_since=None,
    )  # fmt: skip
    await queries.execute(
        writer, "release_reconcile", operation_id="op_moved_unguarded", owner="bg"
    )
    unguarded = Claim("op_moved_unguarded", owner="gate", lease_seconds=30, expected_attempts=1)
    assert await store.claim(_claim(read)) is None
    assert await store.claim(unguarded) is not None


async def test_a_decision_past_its_deadline_claims_nothing(store: Store) -> None:
    """A decision whose deadline is its read (no lifetime) is stale by the time its claim
    runs: nothing is claimed, the row is as it was, and the re-read names the deadline."""
    read = await _unsent(store, "op_late")
    assert await store.claim(_claim(read, lifetime_seconds=0.0)) is None
    current = await store.load("op_late")
    assert current is not None
    assert (current.updated_at, current.attempts) == (read.updated_at, 1)
    why = stale_reason(commit_guard(read, 0.0), current)
    assert why is not None
    assert why.startswith("the decision was stale before it could commit")


async def test_a_deadline_that_passes_while_the_claim_waits_for_the_row_claims_nothing(
    store: Store, writer: asyncpg.Connection
) -> None:
    """The row is locked (not changed) by another transaction while the claim waits; its
    deadline passes meanwhile: once the lock is free, the claim compares the deadline with the
    time as it runs, and claims nothing."""
    read = await _unsent(store, "op_waited_out")
    soon: datetime = await writer.fetchval("SELECT clock_timestamp() + interval '300 ms'")
    claim = dataclasses.replace(_claim(read), decided_before=soon)
    transaction = writer.transaction()
    await transaction.start()
    try:
        await writer.execute(
            "SELECT 1 FROM operations WHERE operation_id = $1 FOR UPDATE", "op_waited_out"
        )
        claiming = asyncio.create_task(store.claim(claim))
        await _waiting_for_the_row(writer)
        await until(
            lambda: writer.fetchval("SELECT clock_timestamp() > $1", soon),
            "the database's clock passes the deadline",
        )
    finally:
        await transaction.commit()
    assert await claiming is None, "a decision committed past its deadline"
    current = await store.load("op_waited_out")
    assert current is not None
    assert (current.updated_at, current.attempts) == (read.updated_at, 1)
    assert await store.claim(_claim(current)) is not None  # decided again, in time: it goes
