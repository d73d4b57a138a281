"""The operation store's transitions against a real PostgreSQL: each is one conditional
statement, and races are decided by the database, not by opgate."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

import proxy.store
from proxy.errors import AlreadySuperseded, IdempotencyKeyInUse, StoreUnavailable
from proxy.store import queries
from proxy.store.mandates import MandateStore
from proxy.store.operation import Operation, Status
from proxy.store.store import (
    UNIQUE_VIOLATIONS,
    ApprovalKeyScope,
    Claim,
    ProviderAnswer,
    Store,
    operation_from_record,
)
from tests.support.operations import new_operation


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=20)
    try:
        yield opened
    finally:
        await opened.close()


async def test_concurrent_claims_have_exactly_one_winner(store: Store) -> None:
    """Twenty claims racing on one row through twenty connections: one row comes back."""
    await store.create(new_operation("op_race"), actor="test")
    results = await asyncio.gather(
        *(
            store.claim(Claim("op_race", owner=f"r{i}", lease_seconds=30, expected_attempts=0))
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
    await store.claim(Claim("op_settle", owner="a", lease_seconds=30, expected_attempts=0))
    assert await store.settle("op_settle", Status.CONFIRMED, answer, "test") is Status.CONFIRMED
    settled = await store.load("op_settle")
    assert settled is not None
    assert settled.status is Status.CONFIRMED
    assert settled.settled_at is not None
    assert (settled.provider_object_id, settled.response_body) == ("re_1", b"{}")
    refused = ProviderAnswer(402, None, "application/json", b"{}")
    assert await store.settle("op_settle", Status.FAILED, refused, "test") is None


async def test_unknown_keeps_dispatched_and_only_the_lease_holder_releases(store: Store) -> None:
    """end_attempt leaves the row dispatched; a stale attempt number changes nothing."""
    await store.create(new_operation("op_unknown"), actor="test")
    claimed = await store.claim(
        Claim("op_unknown", owner="a", lease_seconds=30, expected_attempts=0)
    )
    assert claimed is not None
    assert await store.end_attempt("op_unknown", 99, "unknown:timeout", None, "x") is None
    assert await store.end_attempt("op_unknown", 1, "unknown:timeout", None, "a") is (
        Status.DISPATCHED
    )
    released = await store.load("op_unknown")
    assert released is not None
    assert (released.status, released.last_outcome) == (Status.DISPATCHED, "unknown:timeout")
    assert not released.lease_is_live()
    # a re-send after an unknown outcome needs a provider that still deduplicates the key
    assert (
        await store.claim(Claim("op_unknown", owner="b", lease_seconds=30, expected_attempts=1))
        is None
    )
    again = await store.claim(
        Claim(
            "op_unknown", owner="b", lease_seconds=30, expected_attempts=1, dedup_window_seconds=600
        )
    )
    assert again is not None
    assert again.attempts == 2


async def test_a_live_lease_blocks_a_resend_and_an_expired_one_does_not(
    store: Store, database_url: str
) -> None:
    """A crashed replica's claim expires: once its lease is past, a new attempt may claim."""
    await store.create(new_operation("op_lease"), actor="test")
    await store.claim(Claim("op_lease", owner="crashed", lease_seconds=30, expected_attempts=0))
    assert (
        await store.claim(
            Claim(
                "op_lease",
                owner="b",
                lease_seconds=30,
                expected_attempts=1,
                dedup_window_seconds=600,
            )
        )
        is None
    )
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET lease_until = now() - interval '1 s' WHERE operation_id = $1",
            "op_lease",
        )
    finally:
        await conn.close()
    assert (
        await store.claim(
            Claim(
                "op_lease",
                owner="b",
                lease_seconds=30,
                expected_attempts=1,
                dedup_window_seconds=600,
            )
        )
        is not None
    )


async def test_revoked_or_expired_rows_cannot_be_claimed(store: Store, database_url: str) -> None:
    """The claim itself re-checks the approval, with the database's clock."""
    await store.create(new_operation("op_revoked"), actor="test")
    await store.revoke("op_revoked", "no", "admin")
    assert (
        await store.claim(Claim("op_revoked", owner="a", lease_seconds=5, expected_attempts=0))
        is None
    )
    await store.create(new_operation("op_expired"), actor="test")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET expires_at = now() WHERE operation_id = 'op_expired'"
        )
    finally:
        await conn.close()
    assert (
        await store.claim(Claim("op_expired", owner="a", lease_seconds=5, expected_attempts=0))
        is None
    )


async def test_transitions_and_their_events_commit_together(store: Store) -> None:
    """Every transition writes its event row in the same statement."""
    await store.create(new_operation("op_events"), actor="admin")
    await store.claim(Claim("op_events", owner="a", lease_seconds=30, expected_attempts=0))
    await store.end_attempt("op_events", 1, "unknown:status", 500, "a")
    await store.claim(
        Claim(
            "op_events", owner="b", lease_seconds=30, expected_attempts=1, dedup_window_seconds=600
        )
    )
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


async def test_each_unique_violation_becomes_opgate_s_own_error(store: Store) -> None:
    """A second operation superseding the same one is AlreadySuperseded, a key held by
    another operation IdempotencyKeyInUse, and through the mandates' store alike; a keyed
    twin's taken Idempotency-Key is None (the caller reads what the key made)."""
    await store.create(new_operation("op_u1"), actor="admin")
    await store.create(dataclasses.replace(new_operation("op_u2"), supersedes="op_u1"), "admin")
    with pytest.raises(AlreadySuperseded):
        await store.create(dataclasses.replace(new_operation("op_u3"), supersedes="op_u1"), "a")
    with pytest.raises(IdempotencyKeyInUse):
        await MandateStore(store).create(
            new_operation("op_u4", key="key-op_u1"), "a", nonce=None, limits=None
        )
    key = ApprovalKeyScope("t1", "admin", "request-1")
    assert await store.create_keyed(new_operation("op_u5"), "admin", key, "f") is not None
    assert await store.create_keyed(new_operation("op_u6"), "admin", key, "f") is None
    assert [await store.load(f"op_u{i}") for i in (3, 4, 6)] == [None, None, None]


async def test_another_unique_violation_is_not_translated(store: Store) -> None:
    """A constraint opgate expects no conflict on is shown as it is, not named a conflict it
    is not; every constraint the translation names is the schema's."""
    await store.run(lambda c: c.execute("CREATE TABLE once (x int PRIMARY KEY)"))
    await store.run(lambda c: c.execute("INSERT INTO once VALUES (1)"))
    with pytest.raises(asyncpg.exceptions.UniqueViolationError):
        await store.run(lambda c: c.execute("INSERT INTO once VALUES (1)"))
    schema = (Path(proxy.store.__file__).parent / "schema.sql").read_text()
    for constraint in UNIQUE_VIOLATIONS:
        assert re.search(rf"CONSTRAINT {constraint} (UNIQUE|PRIMARY KEY)", schema), constraint


async def expire_reconcile_lease(database_url: str, operation_id: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET reconcile_lease_until = now() - interval '1 s' "
            "WHERE operation_id = $1",
            operation_id,
        )
    finally:
        await conn.close()


async def test_a_resend_claim_itself_rechecks_why_the_last_attempt_ended(store: Store) -> None:
    """A re-send decided on a stale read (it believed nothing was sent) cannot claim a row
    whose last attempt ended unknown on a provider that does not deduplicate: the statement,
    not the caller, holds the rule."""
    await store.create(new_operation("op_stale"), actor="test")
    first = await store.claim(Claim("op_stale", owner="a", lease_seconds=30, expected_attempts=0))
    assert first is not None
    await store.end_attempt("op_stale", 1, "unknown:timeout", None, "a")
    stale = await store.claim(Claim("op_stale", owner="b", lease_seconds=30, expected_attempts=1))
    assert stale is None
    # within a deduplicating provider's retention of the key, the same re-send may go
    dedup = await store.claim(
        Claim(
            "op_stale", owner="b", lease_seconds=30, expected_attempts=1, dedup_window_seconds=600
        )
    )
    assert dedup is not None
    assert dedup.attempts == 2


async def test_a_resend_claim_after_not_sent_needs_no_deduplication(store: Store) -> None:
    """Nothing left on the last attempt: a re-send may claim whatever the provider does."""
    await store.create(new_operation("op_not_sent"), actor="test")
    await store.claim(Claim("op_not_sent", owner="a", lease_seconds=30, expected_attempts=0))
    await store.end_attempt("op_not_sent", 1, "not_sent", None, "a")
    again = await store.claim(
        Claim("op_not_sent", owner="b", lease_seconds=30, expected_attempts=1)
    )
    assert again is not None
    assert again.attempts == 2


async def test_a_stale_reconciliation_cannot_settle_after_a_newer_attempt(
    store: Store, database_url: str
) -> None:
    """The reconciler's lease lapsed during a slow lookup; an agent's re-send claimed, went
    out and ended unknown. The reconciler's late 'no effect' must not settle the row failed:
    its lease is gone and an attempt started after its lookup began."""
    await store.create(new_operation("op_slow_lookup"), actor="test")
    await store.claim(Claim("op_slow_lookup", owner="a", lease_seconds=30, expected_attempts=0))
    await store.end_attempt("op_slow_lookup", 1, "not_sent", None, "a")
    taken = await store.claim_reconcile_one("op_slow_lookup", "reconciler", 30)
    assert taken is not None
    assert taken.attempts == 1
    await expire_reconcile_lease(database_url, "op_slow_lookup")
    resent = await store.claim(
        Claim("op_slow_lookup", owner="b", lease_seconds=30, expected_attempts=1)
    )
    assert resent is not None
    await store.end_attempt("op_slow_lookup", 2, "unknown:timeout", None, "b")
    settled = await store.settle_reconciled(
        "op_slow_lookup",
        "reconciler",
        Status.FAILED,
        "no_effect",
        None,
        {"lookups": []},
        expected_attempts=taken.attempts,
    )
    assert settled is None
    row = await store.load("op_slow_lookup")
    assert row is not None
    assert row.status is Status.DISPATCHED


async def test_a_claim_waits_for_a_live_reconciliation(store: Store) -> None:
    """While a reconciliation holds the row, no attempt starts: its answer would be stale."""
    await store.create(new_operation("op_held"), actor="test")
    await store.claim(Claim("op_held", owner="a", lease_seconds=30, expected_attempts=0))
    await store.end_attempt("op_held", 1, "not_sent", None, "a")
    assert await store.claim_reconcile_one("op_held", "reconciler", 30) is not None
    assert (
        await store.claim(Claim("op_held", owner="b", lease_seconds=30, expected_attempts=1))
        is None
    )


async def test_on_demand_lookups_are_paced_per_operation(store: Store) -> None:
    """After an inconclusive try, no one may take the row for another lookup before the
    rule's retry time: an agent polling fast cannot multiply calls to the provider."""
    await store.create(new_operation("op_paced"), actor="test")
    await store.claim(Claim("op_paced", owner="a", lease_seconds=30, expected_attempts=0))
    await store.end_attempt("op_paced", 1, "unknown:timeout", None, "a")
    taken = await store.claim_reconcile_one("op_paced", "one", 30)
    assert taken is not None
    await store.reconcile_inconclusive("op_paced", "one", 600, {"lookups": []}, expected_attempts=1)
    assert await store.claim_reconcile_one("op_paced", "two", 30) is None


async def test_a_row_becomes_the_operation_its_dataclass_would_build(
    store: Store, database_url: str
) -> None:
    """The conversion that skips the frozen dataclass's __init__ gives an equal Operation, with
    decoded JSON columns, a Status and nothing but the dataclass's own fields."""
    await store.create(new_operation("op_convert"), actor="test")
    conn = await asyncpg.connect(database_url)
    try:
        row = await queries.fetchrow(conn, "load_operation", operation_id="op_convert")
    finally:
        await conn.close()
    assert row is not None
    op = operation_from_record(row)
    names = [f.name for f in dataclasses.fields(Operation)]
    built = Operation(
        **{name: row[name] for name in names}
        | {"path_params": {}, "params": {"charge": "ch_1"}, "status": Status.CREATED}
    )
    assert op == built
    assert vars(op).keys() == {*names, "_decoded_from"}  # and the texts it was decoded from
    assert isinstance(op.status, Status)
    assert op.params == {"charge": "ch_1"}


async def test_a_claim_decodes_the_rows_json_once_per_request(
    store: Store, database_url: str
) -> None:
    """The claim's row takes the load's decoded path_params and params when its JSON texts are
    the load's, and decodes its own when they differ (never the load's values for other text)."""
    await store.create(new_operation("op_once"), actor="test")
    loaded = await store.load("op_once")
    assert loaded is not None
    claimed = await store.claim(
        Claim("op_once", owner="a", lease_seconds=30, expected_attempts=0), loaded=loaded
    )
    assert claimed is not None
    assert claimed.params is loaded.params
    assert claimed.path_params is loaded.path_params
    conn = await asyncpg.connect(database_url)
    try:
        row = await queries.fetchrow(conn, "load_operation", operation_id="op_once")
    finally:
        await conn.close()
    assert row is not None
    changed = dict(row) | {"params": '{"charge": "ch_2"}'}
    other = operation_from_record(changed, loaded)  # type: ignore[arg-type]
    assert other.params == {"charge": "ch_2"}
    assert other.path_params == loaded.path_params
    assert other.path_params is not loaded.path_params


async def test_a_full_pool_still_fails_closed_after_the_acquire_timeout(database_url: str) -> None:
    """With every connection held, a store call waits the acquire timeout and then raises
    StoreUnavailable: skipping the wait's timer when a connection is idle does not remove it."""
    small = await Store.open(database_url, min_size=1, max_size=1, acquire_timeout=0.2)
    held = asyncio.Event()
    done = asyncio.Event()

    async def hold(conn: asyncpg.Connection) -> None:
        held.set()
        await done.wait()

    try:
        holder = asyncio.create_task(small.run(hold))
        await held.wait()
        with pytest.raises(StoreUnavailable):
            await small.load("op_nothing")
        done.set()
        await holder
        assert await small.load("op_nothing") is None  # the freed connection is taken again
    finally:
        done.set()
        await small.close()


async def test_a_claim_needs_the_row_at_the_version_its_decision_read(store: Store) -> None:
    """A claim given the updated_at its decision read fails once the row changed (its
    updated_at is no longer the one read), and goes while it is as it was."""
    created = await store.create(new_operation("op_pre"), actor="test")
    assert created is not None
    seen = created.updated_at
    claimed = await store.claim(
        Claim("op_pre", owner="a", lease_seconds=30, expected_attempts=0, read_version=seen)
    )
    assert claimed is not None
    await store.create(new_operation("op_pre2"), actor="test")
    before = await store.load("op_pre2")
    assert before is not None
    stale = before.updated_at - timedelta(microseconds=1)
    refused = await store.claim(
        Claim("op_pre2", owner="a", lease_seconds=30, expected_attempts=0, read_version=stale)
    )
    assert refused is None


async def test_a_failed_precondition_is_kept_while_nothing_of_the_operation_left(
    store: Store,
) -> None:
    """Attempts released as not_sent are counted; while they are all the row's attempts, a
    failed precondition before the re-send is kept, and read back only until the next claim.
    Once an attempt may have left, none is kept."""
    await store.create(new_operation("op_pfr"), actor="test")
    await store.claim(Claim("op_pfr", owner="a", lease_seconds=30, expected_attempts=0))
    assert not await store.record_precondition_failed("op_pfr", "test", {"n": 1})  # in flight
    await store.end_attempt("op_pfr", 1, "not_sent", None, "a")
    row = await store.load("op_pfr")
    assert row is not None
    assert (row.attempts, row.unsent_attempts) == (1, 1)
    assert await store.record_precondition_failed("op_pfr", "test", {"n": 2})
    assert await store.precondition_failures(["op_pfr"]) == {"op_pfr": {"n": 2}}
    await store.claim(Claim("op_pfr", owner="a", lease_seconds=30, expected_attempts=1))
    assert await store.precondition_failures(["op_pfr"]) == {}  # before this claim
    await store.end_attempt("op_pfr", 2, "unknown:timeout", None, "a")
    row = await store.load("op_pfr")
    assert row is not None
    assert (row.attempts, row.unsent_attempts) == (2, 1)
    assert not await store.record_precondition_failed("op_pfr", "test", {"n": 3})
    assert await store.precondition_failures(["op_pfr"]) == {}


async def test_a_failed_precondition_is_kept_only_while_the_row_is_created(store: Store) -> None:
    """The evidence is an event of a created row; a row claimed and in flight records none,
    and the latest failure of each created row is what precondition_failures returns."""
    await store.create(new_operation("op_pf"), actor="test")
    assert await store.record_precondition_failed("op_pf", "test", {"n": 1})
    assert await store.record_precondition_failed("op_pf", "test", {"n": 2})
    assert await store.precondition_failures(["op_pf", "op_none"]) == {"op_pf": {"n": 2}}
    await store.claim(Claim("op_pf", owner="a", lease_seconds=30, expected_attempts=0))
    assert not await store.record_precondition_failed("op_pf", "test", {"n": 3})
    assert await store.precondition_failures(["op_pf"]) == {}
