"""Cut-off claims after a synchronous standby's outage (proxy/gate/cutoff.py): a release and
the reconciler's settle cannot race (a reconciler that took its lease before the release, and
whose lookup then found nothing, must not settle ``failed`` a row released meanwhile as never
sent: measured, 14 of 42 cut-off claims burned, settled 14-30 ms after their release); the
releases of many cut-off claims are under way together; and a retried release that finds
nothing is not logged as "never committed". The race is driven statement by statement against
PostgreSQL in the order the standby's return produced it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest_asyncio
import structlog

from proxy.errors import StoreUnavailable
from proxy.gate.cutoff import CutOffClaim, CutOffClaims, claim_owner
from proxy.store.operation import Status
from proxy.store.store import Claim, NewOperation, Store
from tests.support.polling import until


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
    claimed = await store.claim(
        Claim("op_race_1", owner=claimer, lease_seconds=0, expected_attempts=0)
    )
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


async def test_cut_off_claims_are_released_together_not_one_timeout_each() -> None:
    """Many claims cut off at once: their releases are all under way together (each would wait
    a whole statement timeout on a store that hangs), not one after the other."""
    count = 8
    started: list[CutOffClaim] = []
    all_started = asyncio.Event()

    async def release(claim: CutOffClaim) -> bool:
        started.append(claim)
        if len(started) == count:
            all_started.set()
        async with asyncio.timeout(5):  # a statement timeout: one after the other never ends
            await all_started.wait()
        return True

    claims = CutOffClaims()
    try:
        for index in range(count):
            claims.remember(CutOffClaim(f"op_many_{index}", 1, claim_owner("gw")), release)
        await until(lambda: claims.pending == 0, "every cut-off claim released", seconds=10)
    finally:
        await claims.close()
    assert len(started) == count


async def test_a_retried_release_that_finds_nothing_does_not_say_never_committed() -> None:
    """A release tried again after an unanswered try (it may have committed) that finds
    nothing is logged as such, never as 'never committed'."""
    tries = 0

    async def release(claim: CutOffClaim) -> bool:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise StoreUnavailable("the answer to the release was lost")
        return False

    claims = CutOffClaims()
    with structlog.testing.capture_logs() as logged:
        try:
            claims.remember(CutOffClaim("op_retried", 1, claim_owner("gw")), release)
            await until(lambda: claims.pending == 0, "the retried release done")
        finally:
            await claims.close()
    events = [line["event"] for line in logged]
    assert "claim_cut_off_never_committed" not in events, events
    assert "claim_cut_off_release_unconfirmed" in events, events
