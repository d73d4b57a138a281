"""A claim under a budget's lock compares with and records the time as it runs, not its
transaction's start: the wait for the lock (another claim on the budget holding it) can outlast
an approval or a lease (queries.sql claim_operation, budget_spent)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import asyncpg
import pytest_asyncio

from proxy.store.locks import LockKey, LockKind
from proxy.store.queries import QUERIES
from proxy.store.store import BudgetedClaim, BudgetSum, Claim, Store
from tests.support.operations import new_operation
from tests.support.polling import until

BUDGET = BudgetSum("tenant-budget:t1", "fault", "usd", "t1", None, 3600)


def _budget_lock(budget: BudgetSum) -> tuple[int, int]:
    """The budget's lock's key, as another session takes it (proxy/store/locks.py)."""
    return LockKey(LockKind.BUDGET, budget.lock_name).ints


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


@pytest_asyncio.fixture(loop_scope="session")
async def holder(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A second connection, standing for another claim on the budget that holds its lock."""
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def _claim_waiting_for(
    store: Store, holder: asyncpg.Connection, operation_id: str, lease_seconds: float
) -> tuple[asyncio.Task[BudgetedClaim], datetime]:
    """A budgeted claim of ``operation_id`` started while ``holder`` holds the budget's lock,
    once it waits for it; and when its transaction began."""
    await holder.execute("SELECT pg_advisory_lock($1, $2)", *_budget_lock(BUDGET))
    claim = asyncio.create_task(
        store.claim_within_budgets(
            Claim(operation_id, owner="first", lease_seconds=lease_seconds, expected_attempts=0),
            [BUDGET],
            lambda spent: True,
        )
    )
    began: datetime = await until(
        lambda: holder.fetchval(
            "SELECT a.xact_start FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND NOT l.granted"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ),
        "the claim waits for the budget's lock",
    )
    return claim, began


async def _hold_until(holder: asyncpg.Connection, moment: datetime) -> datetime:
    """Keep the lock until the database's clock is past ``moment``; release it; when."""
    await until(
        lambda: holder.fetchval("SELECT clock_timestamp() > $1", moment),
        "the database's clock passes the moment",
    )
    released: datetime = await holder.fetchval("SELECT clock_timestamp()")
    await holder.execute("SELECT pg_advisory_unlock($1, $2)", *_budget_lock(BUDGET))
    return released


async def test_an_approval_that_expired_during_the_wait_is_not_claimed(
    store: Store, holder: asyncpg.Connection
) -> None:
    """The approval expires while the claim waits for the budget's lock: once the lock is
    free, the claim finds it expired, and nothing is claimed."""
    soon = await holder.fetchval("SELECT clock_timestamp() + interval '1 second'")
    await store.create(dataclasses.replace(new_operation("op_expiring"), expires_at=soon), "test")
    claim, _ = await _claim_waiting_for(store, holder, "op_expiring", lease_seconds=30)
    await _hold_until(holder, soon)
    claimed = await claim
    assert claimed.admitted
    assert claimed.operation is None
    row = await store.load("op_expiring")
    assert row is not None
    assert (row.status.value, row.attempts) == ("created", 0)


async def test_a_claim_that_waited_past_its_lease_holds_a_live_lease_from_when_it_ran(
    store: Store, holder: asyncpg.Connection
) -> None:
    """The claim waits longer than its lease for the budget's lock: its lease runs from when
    it claimed, so a re-send right after it (a deduplicating provider's, which needs only a
    free lease) is refused while the first attempt is in flight, and dispatched_at is the
    time of the claim, not of its transaction's start."""
    lease = 2.0
    await store.create(new_operation("op_waited"), actor="test")
    claim, began = await _claim_waiting_for(store, holder, "op_waited", lease_seconds=lease)
    released = await _hold_until(holder, began + timedelta(seconds=lease + 0.2))
    first = (await claim).operation
    assert first is not None
    second = await store.claim(
        Claim(
            "op_waited",
            owner="second",
            lease_seconds=30,
            expected_attempts=1,
            dedup_window_seconds=600,
        )
    )
    assert second is None, "a second send of one approval while the first is in flight"
    assert first.dispatched_at is not None
    assert first.dispatched_at >= released
    assert first.lease_until is not None
    assert first.lease_until >= released + timedelta(seconds=lease)
    assert first.read_at >= released
    assert first.lease_is_live()


# The statements that move an operation: each compares with and records its own clock.
MOVES = (
    "claim_operation",
    "settle_operation",
    "release_unknown",
    "revoke_operation",
    "revoke_unsent_operation",
    "claim_reconcile_one",
    "claim_reconcile_batch",
    "settle_reconciled",
    "reconcile_inconclusive",
    "escalate_operation",
    "resolve_operation",
    "release_reconcile",
)


def test_no_statement_that_moves_an_operation_reads_the_transactions_clock() -> None:
    """None of the statements that claim, settle, release, revoke or reconcile says now() (the
    transaction's start), nor 0016's lease condition on it; the budget sums bound their
    window by their own statement's start."""
    for name in MOVES:
        assert "now()" not in QUERIES[name].sql, name
    for query in QUERIES.values():
        assert "opgate_lease_free(" not in query.sql, query.name
    for name in ("budget_spent", "budget_spent_by_key"):
        assert "now()" not in QUERIES[name].sql, name
        assert "statement_timestamp()" in QUERIES[name].sql, name
