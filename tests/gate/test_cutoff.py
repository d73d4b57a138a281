"""Cut-off claims are remembered until their release is acknowledged, and a release names only
the claim that was cut off (a real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from proxy.errors import StoreUnavailable
from proxy.gate.cutoff import CutOffClaim, CutOffClaims, claim_owner
from proxy.store.operation import Status
from proxy.store.store import Claim, Store
from tests.support.operations import new_operation
from tests.support.polling import until


async def test_release_is_retried_until_the_store_answers() -> None:
    """A release that finds the store unavailable is tried again; once done, it is forgotten."""
    tries: list[CutOffClaim] = []

    async def release(claim: CutOffClaim) -> bool:
        tries.append(claim)
        if len(tries) < 3:
            raise StoreUnavailable("still away")
        return True

    claims = CutOffClaims()
    cut = CutOffClaim("op_1", 1, claim_owner("me"))
    claims.remember(cut, release)
    try:
        await until(lambda: claims.pending == 0, "the cut-off claim released")
    finally:
        await claims.close()
    assert tries == [cut, cut, cut]


def test_claim_owners_are_unique_per_claim() -> None:
    """Two claims of one instance never share a lease owner."""
    assert claim_owner("host:1") != claim_owner("host:1")
    assert claim_owner("host:1").startswith("host:1#")


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


async def test_release_names_only_the_cut_off_claim(store: Store) -> None:
    """The attempt held by another claim of the same instance (being sent) is not released as
    not_sent; the cut-off claim's own attempt is, once, and the row may be sent again."""
    await store.create(new_operation("op_cut"), actor="test")
    sending, cut = claim_owner("me"), claim_owner("me")
    claimed = await store.claim(
        Claim("op_cut", owner=sending, lease_seconds=30, expected_attempts=0)
    )
    assert claimed is not None
    assert await store.end_attempt("op_cut", 1, "not_sent", None, "me", owner=cut) is None
    row = await store.load("op_cut")
    assert row is not None
    assert (row.status, row.last_outcome, row.lease_owner) == (Status.DISPATCHED, None, sending)

    released = await store.end_attempt("op_cut", 1, "not_sent", None, "me", owner=sending)
    assert released is Status.DISPATCHED
    again = await store.end_attempt("op_cut", 1, "not_sent", None, "me", owner=sending)
    assert again is None  # its end is recorded: a second release changes nothing
    row = await store.load("op_cut")
    assert row is not None
    assert (row.last_outcome, row.unsent_attempts) == ("not_sent", 1)
