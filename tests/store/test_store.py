"""The operation store's transitions against a real PostgreSQL: each is one conditional
statement, and races are decided by the database, not by opgate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio

from proxy.errors import IdempotencyKeyInUse
from proxy.store.operation import Status
from proxy.store.store import NewOperation, ProviderAnswer, Store


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=20)
    try:
        yield opened
    finally:
        await opened.close()


def new_operation(operation_id: str, key: str | None = None) -> NewOperation:
    return NewOperation(
        operation_id=operation_id,
        tenant="t1",
        agent_id=None,
        provider="fault",
        action="refund.create",
        method="POST",
        path="/v1/refunds",
        path_params={},
        amount=500,
        currency="usd",
        params={"charge": "ch_1"},
        idempotency_key=key or f"key-{operation_id}",
        approval_ref="r",
        approved_by="a",
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
    )


async def test_concurrent_claims_have_exactly_one_winner(store: Store) -> None:
    """Twenty claims racing on one row through twenty connections: one row comes back."""
    await store.create(new_operation("op_race"), actor="test")
    results = await asyncio.gather(
        *(
            store.claim("op_race", owner=f"r{i}", lease_seconds=30, allow_resend=True)
            for i in range(20)
        )
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert winners[0].attempts == 1
    assert winners[0].lease_is_live()


async def test_settle_only_from_dispatched_and_never_twice(store: Store) -> None:
    """Settling needs a dispatched row; a confirmed row cannot become failed."""
    await store.create(new_operation("op_settle"), actor="test")
    answer = ProviderAnswer(200, "re_1", "application/json", b"{}")
    assert await store.settle("op_settle", Status.CONFIRMED, answer, "test") is None
    await store.claim("op_settle", owner="a", lease_seconds=30, allow_resend=False)
    settled = await store.settle("op_settle", Status.CONFIRMED, answer, "test")
    assert settled is not None
    assert settled.status is Status.CONFIRMED
    assert settled.settled_at is not None
    refused = ProviderAnswer(402, None, "application/json", b"{}")
    assert await store.settle("op_settle", Status.FAILED, refused, "test") is None


async def test_unknown_keeps_dispatched_and_only_the_lease_holder_releases(store: Store) -> None:
    """release_unknown leaves the row dispatched; a stale attempt number changes nothing."""
    await store.create(new_operation("op_unknown"), actor="test")
    claimed = await store.claim("op_unknown", owner="a", lease_seconds=30, allow_resend=False)
    assert claimed is not None
    assert await store.release_unknown("op_unknown", 99, "unknown:timeout", None, "x") is None
    released = await store.release_unknown("op_unknown", 1, "unknown:timeout", None, "a")
    assert released is not None
    assert (released.status, released.last_outcome) == (Status.DISPATCHED, "unknown:timeout")
    assert not released.lease_is_live()
    # a re-send is a policy decision: refused unless the caller allows it
    assert await store.claim("op_unknown", owner="b", lease_seconds=30, allow_resend=False) is None
    again = await store.claim("op_unknown", owner="b", lease_seconds=30, allow_resend=True)
    assert again is not None
    assert again.attempts == 2


async def test_a_live_lease_blocks_a_resend_and_an_expired_one_does_not(
    store: Store, database_url: str
) -> None:
    """A crashed replica's claim expires: once its lease is past, a new attempt may claim."""
    await store.create(new_operation("op_lease"), actor="test")
    await store.claim("op_lease", owner="crashed", lease_seconds=30, allow_resend=False)
    assert await store.claim("op_lease", owner="b", lease_seconds=30, allow_resend=True) is None
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET lease_until = now() - interval '1 s' WHERE operation_id = $1",
            "op_lease",
        )
    finally:
        await conn.close()
    assert await store.claim("op_lease", owner="b", lease_seconds=30, allow_resend=True) is not None


async def test_revoked_or_expired_rows_cannot_be_claimed(store: Store, database_url: str) -> None:
    """The claim itself re-checks the approval, with the database's clock."""
    await store.create(new_operation("op_revoked"), actor="test")
    await store.revoke("op_revoked", "no", "admin")
    assert await store.claim("op_revoked", owner="a", lease_seconds=5, allow_resend=False) is None
    await store.create(new_operation("op_expired"), actor="test")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET expires_at = now() WHERE operation_id = 'op_expired'"
        )
    finally:
        await conn.close()
    assert await store.claim("op_expired", owner="a", lease_seconds=5, allow_resend=False) is None


async def test_transitions_and_their_events_commit_together(store: Store) -> None:
    """Every transition writes its event row in the same statement."""
    await store.create(new_operation("op_events"), actor="admin")
    await store.claim("op_events", owner="a", lease_seconds=30, allow_resend=False)
    await store.release_unknown("op_events", 1, "unknown:status", 500, "a")
    await store.claim("op_events", owner="b", lease_seconds=30, allow_resend=True)
    await store.settle("op_events", Status.CONFIRMED, ProviderAnswer(200, "re_9", None, b"{}"), "b")
    events = await store.events("op_events")
    assert [(e["event"], e["from_status"], e["to_status"]) for e in events] == [
        ("created", None, "created"),
        ("claimed", "created", "dispatched"),
        ("unknown", "dispatched", "dispatched"),
        ("claimed", "dispatched", "dispatched"),
        ("confirmed", "dispatched", "confirmed"),
    ]
    assert events[3]["detail"]["attempt"] == 2


async def test_a_provider_key_belongs_to_one_operation(store: Store) -> None:
    """Two operations of one provider cannot share an idempotency key."""
    await store.create(new_operation("op_k1", key="shared"), actor="admin")
    with pytest.raises(IdempotencyKeyInUse):
        await store.create(new_operation("op_k2", key="shared"), actor="admin")
    assert await store.load("op_k2") is None
