"""The console's statements (proxy/store/console.py), each run against a real PostgreSQL through
the store's connections, and the scrape's counts (proxy/store/metrics.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest
import pytest_asyncio

from proxy.errors import StoreUnavailable
from proxy.store import audit
from proxy.store.console import ConsoleStore, StoredSession
from proxy.store.metrics import OperationCounts, operation_counts
from proxy.store.store import Claim, Store
from tests.support.operations import new_operation


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


async def _escalated(store: Store, operation_id: str) -> None:
    """A dispatched operation escalated to a human (its notice queued with it)."""
    await store.create(new_operation(operation_id), actor="test")
    claimed = await store.claim(
        Claim(operation_id, owner="w", lease_seconds=30, expected_attempts=0)
    )
    assert claimed is not None
    escalated = await store.escalate(operation_id, None, "unknown", {}, look_again_seconds=60)
    assert escalated is not None


async def test_a_session_is_created_read_and_deleted(store: Store) -> None:
    """A session is found by its digest until deleted; one that expired is not found."""
    console = ConsoleStore(store)
    await console.create_session("d1", "admin", "ada", "csrf-1", 60)
    await console.create_session("d2", "reviewer", "bob", "csrf-2", 0)
    assert await console.session("d1") == StoredSession("admin", "ada", "csrf-1")
    assert await console.session("d2") is None
    await console.delete_session("d1")
    assert await console.session("d1") is None


async def test_the_operation_lists_filter_and_order(store: Store) -> None:
    """Operations by status and tenant, newest first, and the escalation queue."""
    console = ConsoleStore(store)
    await store.create(new_operation("op_1"), actor="test")
    await store.create(new_operation("op_2", tenant="t2"), actor="test")
    await _escalated(store, "op_3")
    created = await console.operations(["created"], None, None, None, 10)
    assert [op.operation_id for op in created] == ["op_2", "op_1"]
    assert [
        op.operation_id for op in await console.operations(["created"], "t2", None, None, 10)
    ] == ["op_2"]
    assert await console.operations(["created"], None, None, 3600.0, 10) == []
    assert [op.operation_id for op in await console.escalated(10)] == ["op_3"]
    assert len(await console.notifications("op_3")) == 1
    assert await console.notifications("op_1") == []


async def test_the_timeline_reads_and_the_last_checkpoint(store: Store) -> None:
    """An operation's audit records (its transitions, written by the trigger) read back as
    rows; the newest checkpoint is None until one is written."""
    console = ConsoleStore(store)
    await store.create(new_operation("op_a"), actor="test")
    rows = await console.audit_records("op_a")
    assert [r.kind for r in rows] == ["transition"]
    assert json.loads(rows[0].record)["operation_id"] == "op_a"
    assert await console.last_checkpoint() is None

    async def checkpoint(conn: asyncpg.Connection) -> int:
        return await audit.insert_checkpoint(
            conn, datetime.now(UTC), "test", "[]", bytes(32), b"m" * 32
        )

    checkpoint_id = await store.run(checkpoint)
    last = await console.last_checkpoint()
    assert last is not None
    assert (last["checkpoint_id"], last["writer"], last["heads"]) == (checkpoint_id, "test", 0)


async def test_the_dashboard_counts_what_waits_on_the_humans(store: Store) -> None:
    """The dashboard line: escalations waiting and the oldest's age, pending proposals (none
    here), and no checkpoint yet on a fresh database."""
    console = ConsoleStore(store)
    empty = await console.dashboard()
    assert (empty.escalations, empty.oldest_escalation_seconds) == (0, None)
    assert (empty.pending_proposals, empty.last_checkpoint_at) == (0, None)
    await _escalated(store, "op_dash_1")
    await _escalated(store, "op_dash_2")
    await store.create(new_operation("op_dash_3"), actor="test")  # not escalated
    waiting = await console.dashboard()
    assert waiting.escalations == 2
    assert waiting.oldest_escalation_seconds is not None
    assert 0 <= waiting.oldest_escalation_seconds < 60


async def test_the_scrape_counts_unsettled_operations(store: Store) -> None:
    """Created, dispatched, dispatched too long ago, and escalated operations are counted."""
    await store.create(new_operation("op_1"), actor="test")
    await _escalated(store, "op_2")
    assert await operation_counts(store, 3600.0) == OperationCounts(1, 1, 0, 1, 0)
    assert (await operation_counts(store, 0.0)).dispatched_old == 1


async def test_a_closed_store_is_unavailable_to_the_console(database_url: str) -> None:
    """The console's statements run through the store's translation: a pool that cannot be
    used raises StoreUnavailable, not asyncpg's error."""
    opened = await Store.open(database_url, min_size=1, max_size=1)
    await opened.close()
    with pytest.raises(StoreUnavailable):
        await ConsoleStore(opened).session("d1")
    with pytest.raises(StoreUnavailable):
        await operation_counts(opened, 60.0)
