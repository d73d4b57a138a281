"""Replication awareness: the durability verdict (pure), the facts read from a real server and
a real primary + standby, the heartbeat commit, and the claim's own synchronous_commit."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from proxy.errors import StoreUnavailable
from proxy.store import queries
from proxy.store.replication import Durability, ReplicationFacts, Standby, judge
from proxy.store.store import Claim, Store
from tests.support.cluster import Cluster
from tests.support.operations import new_operation

SYNC = Standby("s1", "streaming", "sync")
QUORUM = Standby("s1", "streaming", "quorum")
ASYNC = Standby("s2", "streaming", "async")
HIDDEN = Standby(None, None, None)  # a role without pg_monitor sees walsenders' columns NULL


def facts(names: str = "", commit: str = "on", *standbys: Standby) -> ReplicationFacts:
    return ReplicationFacts(False, names, commit, standbys)


@pytest.mark.parametrize(
    ("scenario", "given", "accept", "durability", "refuse_start", "ready"),
    [
        ("single node", facts(), False, Durability.SINGLE_NODE, False, True),
        ("sync standby", facts("s1", "on", SYNC), False, Durability.SYNCHRONOUS, False, True),
        ("quorum standby", facts("ANY 1 (s1)", "remote_write", QUORUM), False,
         Durability.SYNCHRONOUS, False, True),
        ("remote_apply", facts("*", "remote_apply", SYNC, ASYNC), False,
         Durability.SYNCHRONOUS, False, True),
        ("async only", facts("", "on", ASYNC), False, Durability.ASYNCHRONOUS, True, False),
        ("async accepted", facts("", "on", ASYNC), True, Durability.ASYNCHRONOUS, False, True),
        ("sync names, commit local", facts("s1", "local", SYNC), False,
         Durability.ASYNCHRONOUS, True, False),
        ("sync names, commit off", facts("s1", "off", SYNC), False,
         Durability.ASYNCHRONOUS, True, False),
        ("sync names, no standby", facts("s1", "on"), False,
         Durability.SYNC_STANDBY_MISSING, False, False),
        ("sync names, async standby only", facts("s1", "on", ASYNC), False,
         Durability.SYNC_STANDBY_MISSING, False, False),
        ("without pg_monitor", facts("s1", "on", HIDDEN), False,
         Durability.UNVERIFIED, False, True),
    ],
)  # fmt: skip
def test_judge(
    scenario: str,
    given: ReplicationFacts,
    accept: bool,
    durability: Durability,
    refuse_start: bool,
    ready: bool,
) -> None:
    """Each replication set-up gets its verdict: go, go with a note, refuse to start, or 503."""
    verdict = judge(given, accept_async=accept)
    assert (verdict.durability, verdict.refuse_start, verdict.ready) == (
        durability,
        refuse_start,
        ready,
    ), scenario
    assert verdict.refuses_claims is refuse_start  # refused at start, refused at run time
    assert verdict.note


def test_standby_is_never_ready() -> None:
    """A server in recovery is not where opgate may write."""
    verdict = judge(ReplicationFacts(True, "", "on", ()), accept_async=True)
    assert not verdict.ready


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


async def test_single_server_reads_as_single_node(store: Store) -> None:
    """The test server (no standby, no synchronous names) reads as a single node."""
    verdict = judge(await store.replication_facts(), accept_async=False)
    assert verdict.durability is Durability.SINGLE_NODE
    await store.commit_heartbeat(2.0)  # nothing to wait for: it commits at once


async def test_claim_sets_its_own_synchronous_commit(database_url: str) -> None:
    """A session (or database, role, server) at synchronous_commit=off cannot weaken a claim:
    the claim's transaction runs at 'on'."""
    store = await Store.open(database_url, min_size=1, max_size=1)
    try:
        await store.create(new_operation("op_sync"), actor="test")
    finally:
        await store.close()
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("SET synchronous_commit = off")
        async with conn.transaction():
            claimed = await queries.fetchrow(
                conn, "claim_operation",
                operation_id="op_sync", owner="me", lease_seconds=30.0, expected_attempts=0,
                actor=None, dedup_window_seconds=None, after_lookup_by=None,
                read_version=None, decided_before=None,
            )  # fmt: skip
            assert claimed is not None
            level = await conn.fetchval("SHOW synchronous_commit")
        assert level == "on"
        assert await conn.fetchval("SHOW synchronous_commit") == "off"  # only that transaction
    finally:
        await conn.close()


async def test_cluster_facts_follow_the_standby(cluster: Cluster) -> None:
    """On a real primary + sync standby: synchronous; standby stopped: missing and the heartbeat
    commit times out; asynchronous: refused unless accepted."""
    dsn = await cluster.create_database(f"repl_{uuid.uuid4().hex[:8]}")
    store = await Store.open(dsn, min_size=1, max_size=4)
    try:
        verdict = judge(await store.replication_facts(), accept_async=False)
        assert verdict.durability is Durability.SYNCHRONOUS, verdict
        await store.commit_heartbeat(2.0)

        cluster.stop_standby()
        try:
            verdict = judge(await store.replication_facts(), accept_async=False)
            assert verdict.durability is Durability.SYNC_STANDBY_MISSING, verdict
            assert not verdict.ready
            began = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.commit_heartbeat(0.5)
            assert time.monotonic() - began < 3
        finally:
            cluster.start_standby()

        cluster.set_sync(False)
        try:
            verdict = judge(await store.replication_facts(), accept_async=False)
            assert verdict.durability is Durability.ASYNCHRONOUS, verdict
            assert verdict.refuse_start
        finally:
            cluster.set_sync(True)
    finally:
        await store.close()


async def test_claim_waits_for_the_standby_whatever_the_database_says(cluster: Cluster) -> None:
    """With synchronous_commit=local set on the database and the sync standby stopped, a claim
    is not acknowledged (it times out: StoreUnavailable), where it would have been at once."""
    name = f"repl_{uuid.uuid4().hex[:8]}"
    dsn = await cluster.create_database(name)
    admin = await asyncpg.connect(cluster.primary.dsn())
    try:
        await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = local')
    finally:
        await admin.close()
    store = await Store.open(dsn, min_size=1, max_size=4, statement_timeout_ms=800)
    try:
        await store.create(new_operation("op_local"), actor="test")  # local: at once
        cluster.stop_standby()
        try:
            with pytest.raises(StoreUnavailable):
                await store.claim(
                    Claim("op_local", owner="me", lease_seconds=30, expected_attempts=0)
                )
        finally:
            cluster.start_standby()
    finally:
        await store.close()


async def test_without_pg_monitor_the_standbys_are_unverified(cluster: Cluster) -> None:
    """A role without pg_monitor reads the walsenders' state as NULL: 'unverified' (served,
    readiness left to the heartbeat); granted pg_monitor, the same standby reads synchronous."""
    role = f"plain_{uuid.uuid4().hex[:8]}"
    database = f"repl_{uuid.uuid4().hex[:8]}"
    await cluster.create_database(database)  # migrated: a new connection records its timeline
    admin = await asyncpg.connect(cluster.primary.dsn(database))
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        # what an application role is given on opgate's tables, pg_monitor aside
        await admin.execute(
            f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}";'
            f' GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"'
        )
        dsn = f"postgresql://{role}@127.0.0.1:{cluster.primary_port}/{database}"
        store = await Store.open(dsn, min_size=1, max_size=1)
        try:
            verdict = judge(await store.replication_facts(), accept_async=False)
            assert verdict.durability is Durability.UNVERIFIED, verdict
            assert "pg_monitor" in verdict.note
            await admin.execute(f'GRANT pg_monitor TO "{role}"')
            verdict = judge(await store.replication_facts(), accept_async=False)
            assert verdict.durability is Durability.SYNCHRONOUS, verdict
        finally:
            await store.close()
    finally:
        await admin.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')
        await admin.close()
