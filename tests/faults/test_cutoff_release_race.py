"""A cut-off claim's release and the reconciler's settle cannot race (proxy/gate/cutoff.py,
proxy/recovery/reconcile.py): a reconciler that took its lease before the release, and whose
lookup then found nothing, must not settle ``failed`` a row that was released meanwhile as
never sent; the approval is not burned. Driven statement by statement against PostgreSQL in
the order a synchronous standby's return produced it (measured: 14 of 42 cut-off claims
burned, settled 14-30 ms after their release)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest_asyncio

from proxy.store.operation import Status
from proxy.store.store import NewOperation, Store


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=2)
    try:
        yield opened
    finally:
        await opened.close()


def _approval(operation_id: str) -> NewOperation:
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
        idempotency_key="opk_" + operation_id,
        approval_ref="race",
        approved_by="test",
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    )


async def test_a_settle_read_before_the_release_does_not_burn_the_approval(
    store: Store,
) -> None:
    """Lease expired, reconciler takes the row, the cut-off claim is released as not_sent,
    then the reconciler's 'no effect' settle comes: zero rows, the row stays dispatched and
    not_sent, sendable again."""
    await store.create(_approval("op_race_1"), actor="test")
    claimer = "gw-1#cut"
    # the claim committed (its answer lost) with a lease that is already over when the
    # standby returns: the background reconciler may take the row
    claimed = await store.claim("op_race_1", owner=claimer, lease_seconds=0, expected_attempts=0)
    assert claimed is not None
    taken = await store.claim_reconcile_one("op_race_1", "gw-1/reconciler", 30)
    assert taken is not None, "the reconciler could not take the row"
    released = await store.end_attempt("op_race_1", 1, "not_sent", None, "gw-1", owner=claimer)
    assert released is Status.DISPATCHED
    settled = await store.settle_reconciled(
        "op_race_1",
        "gw-1/reconciler",
        Status.FAILED,
        "no_effect",
        None,
        {"lookups": []},
        expected_attempts=taken.attempts,
        unchanged_since=taken.updated_at,
    )
    assert settled is None, "a stale lookup settled a row released as never sent"
    row = await store.load("op_race_1")
    assert row is not None
    assert (row.status, row.last_outcome) == (Status.DISPATCHED, "not_sent")
