"""The cluster fixture is a real primary with a real streaming standby that can fail over."""

from __future__ import annotations

import socket

import asyncpg
import pytest

from tests.support.cluster import Cluster, missing_reason, running_cluster


async def test_multi_host_dsn_reaches_the_primary_and_writes_replicate(cluster: Cluster) -> None:
    """The multi-host DSN opens the primary, and its migrated database reaches the standby."""
    dsn = await cluster.create_database("fixture_check")
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
        assert await conn.fetchval("SELECT current_setting('port')::int") == cluster.primary_port
        await conn.execute("CREATE TABLE marker (id int)")
        # 'on' waits for the standby's flush; remote_apply also for its replay, so it is visible.
        await conn.execute("SET synchronous_commit = remote_apply")
        await conn.execute("INSERT INTO marker VALUES (7)")
    finally:
        await conn.close()
    standby = await asyncpg.connect(cluster.standby.dsn("fixture_check"))
    try:
        assert await standby.fetchval("SELECT pg_is_in_recovery()") is True
        assert await standby.fetchval("SELECT id FROM marker") == 7
        assert await standby.fetchval("SELECT count(*) FROM opgate_migrations") > 0
    finally:
        await standby.close()
    sync_states = await _primary_fetch(
        cluster, "SELECT sync_state FROM pg_stat_replication ORDER BY 1"
    )
    assert sync_states == ["sync"]


async def test_kill_and_promote_moves_the_dsn_to_the_standby() -> None:
    """After the primary is crashed and the standby promoted, the same DSN writes there."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_cluster(sync=False) as fresh:
        dsn = await fresh.create_database("opgate")
        fresh.kill_primary()
        fresh.promote()
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
            assert await conn.fetchval("SELECT current_setting('port')::int") == fresh.standby_port
            assert await conn.fetchval("SELECT count(*) FROM opgate_migrations") > 0
        finally:
            await conn.close()


async def _primary_fetch(cluster: Cluster, sql: str) -> list[object]:
    conn = await asyncpg.connect(cluster.primary.dsn())
    try:
        return [row[0] for row in await conn.fetch(sql)]
    finally:
        await conn.close()


def test_stop_leaves_nothing_running() -> None:
    """stop() stops both servers and removes the folder, including after a crash."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    fresh = Cluster.start(sync=False)
    fresh.kill_primary()
    fresh.stop()
    assert not fresh.workdir.exists()
    for port in (fresh.primary_port, fresh.standby_port):
        with (
            pytest.raises(ConnectionRefusedError),
            socket.create_connection(("127.0.0.1", port), timeout=2),
        ):
            pass
