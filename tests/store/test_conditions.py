"""The conditions written once (migration 0016, proxy/store/operation.py): the SQL and the Python
definitions agree with each other and with the copies they replaced, and a call in a WHERE is
inlined by PostgreSQL (the plan shows the expression, the partial index still matches)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest_asyncio

from proxy.store.operation import STATUS_FILTERS, UNSETTLED, Operation, Status
from proxy.store.queries import QUERIES
from tests.support.operations import new_operation


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def test_unsettled_is_one_set_in_python_and_sql(conn: asyncpg.Connection) -> None:
    """On every status: opgate_unsettled, the literal it replaced, and UNSETTLED agree."""
    for status in Status:
        row = await conn.fetchrow(
            "SELECT opgate_unsettled($1) AS new, $1 IN ('created', 'dispatched') AS old", status
        )
        assert row["new"] is row["old"] is (status in UNSETTLED), status
    assert {Status.CREATED, Status.DISPATCHED} == UNSETTLED
    assert STATUS_FILTERS["unsettled"] == ["created", "dispatched"]
    assert STATUS_FILTERS["all"] == ["created", "dispatched", "confirmed", "failed"]


async def test_the_lease_is_free_as_it_was_written_out(conn: asyncpg.Connection) -> None:
    """Never taken, lapsed, lapsing now and live: opgate_lease_free as the expression it
    replaced."""
    for until in ("NULL", "now() - interval '1 s'", "now()", "now() + interval '1 s'"):
        row = await conn.fetchrow(
            f"SELECT opgate_lease_free({until}) AS new,"
            f" ({until} IS NULL OR {until} <= now()) AS old"
        )
        assert row["new"] is row["old"], until


async def test_the_lease_v2_is_free_by_the_clock_as_the_statement_runs(
    conn: asyncpg.Connection,
) -> None:
    """opgate_lease_free_v2 is 0016's condition on clock_timestamp(): inside a transaction that
    began before a lease lapsed, the lease is free by v2 and still taken by now()."""
    async with conn.transaction():
        # a lease that lapses after the transaction began and before the next statement
        until = await conn.fetchval("SELECT clock_timestamp()")
        row = await conn.fetchrow(
            "SELECT opgate_lease_free_v2($1) AS v2, opgate_lease_free($1) AS v1,"
            " opgate_lease_free_v2(NULL) AS never, opgate_lease_free_v2($1 + interval '1 h')"
            " AS live",
            until,
        )
    assert (row["v2"], row["v1"], row["never"], row["live"]) == (True, False, True, False)


async def test_nothing_left_yet_agrees_with_python_and_the_copies_it_replaced(
    conn: asyncpg.Connection,
) -> None:
    """On every status and attempt count: opgate_nothing_left_yet equals
    Operation.nothing_left_yet, and the old SQL form wherever a row can be (a created row has
    made no attempt); where none can, the new form is the stricter."""
    base = _operation()
    for status, attempts, unsent in itertools.product(Status, range(3), range(3)):
        if unsent > attempts:
            continue
        row = await conn.fetchrow(
            "SELECT opgate_nothing_left_yet($1, $2, $3) AS new,"
            " ($1 = 'created' OR ($1 = 'dispatched' AND $2 = $3)) AS old",
            status.value,
            attempts,
            unsent,
        )
        op = dataclasses.replace(base, status=status, attempts=attempts, unsent_attempts=unsent)
        assert row["new"] is op.nothing_left_yet(), (status, attempts, unsent)
        reachable = status is not Status.CREATED or attempts == unsent == 0
        if reachable:
            assert row["new"] is row["old"], (status, attempts, unsent)
        else:
            assert not row["new"] or row["old"], (status, attempts, unsent)


async def test_a_condition_in_a_where_is_inlined_and_matches_the_partial_index(
    conn: asyncpg.Connection,
) -> None:
    """The plan of a WHERE with opgate_unsettled names no function and scans
    operations_unsettled, as the literal did; the lease's function is inlined too."""
    await conn.execute("SET enable_seqscan = off")
    plan = "\n".join(
        r[0]
        for r in await conn.fetch(
            "EXPLAIN SELECT count(*) FROM operations"
            " WHERE tenant = 't' AND opgate_unsettled(status)"
            " AND opgate_lease_free_v2(lease_until)"
        )
    )
    assert "operations_unsettled" in plan, plan
    assert "opgate_" not in plan, plan
    assert "lease_until <= clock_timestamp()" in plan, plan


async def test_a_budget_sum_reads_only_its_window_from_the_index(conn: asyncpg.Connection) -> None:
    """budget_spent, with opgate_spends inlined, is an index-only scan of the budget window's
    index, bounded by the window (the columns the condition reads are in the index)."""
    await conn.execute("SET enable_seqscan = off")
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute(f"PREPARE probe AS {QUERIES['budget_spent'].sql}")
    plan = "\n".join(
        r[0]
        for r in await conn.fetch("EXPLAIN EXECUTE probe('fault', 'usd', 3600, 't1', NULL, NULL)")
    )
    await conn.execute("DEALLOCATE probe")
    assert "Index Only Scan using operations_budget_window_v2" in plan, plan
    assert "dispatched_at > (statement_timestamp()" in plan, plan
    assert "opgate_" not in plan, plan


CONDITIONS = (
    "opgate_lease_free",
    "opgate_unsettled",
    "opgate_nothing_left_yet",
    "opgate_nothing_sent",
    "opgate_spends",
)


async def test_every_statement_plans_its_conditions_inlined(conn: asyncpg.Connection) -> None:
    """Each statement of queries.sql that uses a condition, planned as asyncpg prepares it (a
    generic plan), calls no condition function: each is inlined into its WHERE, as if written
    out (the claim's cost unchanged)."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    users = [q for q in QUERIES.values() if any(c in q.sql for c in CONDITIONS)]
    assert {
        "claim_operation",
        "metrics_operations",
        "budget_spent",
        "mandate_open_use",
        "revoke_operation",
    } <= {q.name for q in users}
    for query in users:
        await conn.execute(f"PREPARE probe AS {query.sql}")
        nulls = ", ".join("NULL" for _ in query.parameters)
        explain = (
            f"EXPLAIN VERBOSE EXECUTE probe({nulls})" if nulls else "EXPLAIN VERBOSE EXECUTE probe"
        )
        plan = "\n".join(r[0] for r in await conn.fetch(explain))
        await conn.execute("DEALLOCATE probe")
        assert not [c for c in CONDITIONS if c in plan], (query.name, plan)


def _operation() -> Operation:
    new = new_operation("op_conditions")
    now = datetime.now(UTC)
    fields = {f.name: None for f in dataclasses.fields(Operation)}
    fields.update(dataclasses.asdict(new))
    fields.update(
        status=Status.CREATED, attempts=0, unsent_attempts=0, reconcile_attempts=0,
        created_at=now, updated_at=now, read_at=now, expires_at=now + timedelta(minutes=5),
    )  # fmt: skip
    return Operation(**fields)
