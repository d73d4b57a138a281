"""The cuttable relay really breaks PostgreSQL connections; the database fixtures isolate tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from tests.support.pg_relay import TcpRelay, dsn_through_relay, relay_target

# What asyncpg raises when the server side of its socket goes away, depending on the moment.
CONNECTION_ERRORS = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)

_seen_databases: list[str] = []


@pytest_asyncio.fixture(loop_scope="session")
async def relay(database_url: str) -> AsyncIterator[tuple[TcpRelay, str]]:
    """A relay in front of this test's database, and the DSN that goes through it."""
    relay = TcpRelay()
    host, port = await relay.start(*relay_target(database_url))
    try:
        yield relay, dsn_through_relay(database_url, host, port)
    finally:
        await relay.stop()


async def test_query_through_relay(relay: tuple[TcpRelay, str]) -> None:
    """A query sent through the relay reaches the database and returns its answer."""
    _, dsn = relay
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT 41 + 1") == 42
    finally:
        await conn.close()


async def test_cut_breaks_connections_until_restore(relay: tuple[TcpRelay, str]) -> None:
    """After cut() open and new connections fail; after restore() new ones work again."""
    tcp_relay, dsn = relay
    conn = await asyncpg.connect(dsn)
    try:
        await tcp_relay.cut()
        with pytest.raises(CONNECTION_ERRORS):
            await conn.fetchval("SELECT 1")
        with pytest.raises(CONNECTION_ERRORS):
            await asyncpg.connect(dsn)
    finally:
        conn.terminate()
    await tcp_relay.restore()
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_a_lost_reply_is_a_broken_connection_for_a_committed_statement(
    relay: tuple[TcpRelay, str], database_url: str
) -> None:
    """With lose_reply_to, the statement bound to the marker commits while its client sees
    the connection fail."""
    tcp_relay, dsn = relay
    setup = await asyncpg.connect(database_url)
    try:
        await setup.execute("CREATE TABLE relay_lost (note text)")
        conn = await asyncpg.connect(dsn)
        try:
            tcp_relay.lose_reply_to(b"marker-4d1e")
            with pytest.raises(CONNECTION_ERRORS):
                await conn.execute("INSERT INTO relay_lost VALUES ($1)", "marker-4d1e")
        finally:
            conn.terminate()
        assert tcp_relay.replies_lost == 1
        assert await setup.fetchval("SELECT count(*) FROM relay_lost") == 1
    finally:
        await setup.close()


@pytest.mark.parametrize(
    ("dsn", "target", "through"),
    [
        pytest.param(
            "postgresql://postgres@127.0.0.1:5432/postgres",
            ("127.0.0.1", 5432),
            "postgresql://postgres@127.0.0.1:6000/postgres",
            id="tcp-url",
        ),
        pytest.param(
            "postgresql://postgres:@/opgate_x?host=/srv/d/pg",
            ("/srv/d/pg", 5432),
            "postgresql://postgres:@127.0.0.1:6000/opgate_x",
            id="unix-socket-uri",
        ),
        pytest.param(
            "postgresql://u@/db?host=/run/pg&port=5433&sslmode=disable",
            ("/run/pg", 5433),
            "postgresql://u@127.0.0.1:6000/db?sslmode=disable",
            id="unix-socket-with-port-and-options",
        ),
    ],
)
def test_dsn_rewriting(dsn: str, target: tuple[str, int], through: str) -> None:
    """The relay's target is read from the DSN and the DSN is rewritten to the relay."""
    assert relay_target(dsn) == target
    assert dsn_through_relay(dsn, "127.0.0.1", 6000) == through


@pytest.mark.parametrize("run", ["first", "second"])
async def test_each_test_gets_a_fresh_migrated_database(database_url: str, run: str) -> None:
    """Each test's database is new, has the schema, and holds nothing a previous test wrote."""
    conn = await asyncpg.connect(database_url)
    try:
        name = await conn.fetchval("SELECT current_database()")
        assert name not in _seen_databases
        _seen_databases.append(name)
        assert await conn.fetchval("SELECT count(*) FROM operations") == 0
        assert await conn.fetchval("SELECT count(*) FROM opgate_migrations") >= 1
        await conn.execute(
            "INSERT INTO operations (operation_id, tenant, provider, action, method, path,"
            " idempotency_key, approval_ref, approved_by, expires_at)"
            " VALUES ($1, 't', 'stripe', 'refund', 'POST', '/v1/refunds', $1, 'a', 'b',"
            " now() + interval '1 hour')",
            f"op_{run}",
        )
    finally:
        await conn.close()
