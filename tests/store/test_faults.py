"""Store faults by class (proxy/store/faults.py), against errors a real PostgreSQL raises: what
cannot reach or use the store is unavailable, a statement's own result is not; and the Store
translates them, dropping a connection that reached a read-only server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio

from proxy.errors import StoreUnavailable
from proxy.store.faults import drops_connection, is_unavailable
from proxy.store.store import Store
from tests.support.killable_opgate import free_port


async def _raised(make: Callable[[], Awaitable[object]]) -> BaseException:
    try:
        await make()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing was raised")


async def _on(dsn: str, *statements: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def _database(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


def _as_role(dsn: str, role: str) -> str:
    """The same server as ``dsn`` as another user. The host part and the query are kept: the
    embedded server's DSN names no host and reaches its unix socket through ``?host=``."""
    parts = urlsplit(dsn)
    where = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{where}"))


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    opened = await asyncpg.connect(database_url)
    try:
        await opened.execute("CREATE TEMP TABLE t (k int PRIMARY KEY, v int CHECK (v > 0))")
        await opened.execute("INSERT INTO t VALUES (1, 1)")
        yield opened
    finally:
        await opened.close()


# (scenario, statements run on one connection, the last of which fails): a statement's own
# result is never the store's fault.
STATEMENT_RESULTS = [
    ("unique_violation", ["INSERT INTO t VALUES (1, 2)"]),
    ("check_violation", ["INSERT INTO t VALUES (2, -1)"]),
    ("syntax_error", ["SELEC 1"]),
    ("division_by_zero", ["SELECT 1 / 0"]),
    ("undefined_table", ["SELECT * FROM no_such_table"]),
    # 55000 on a statement (not on connect): the statement's own
    ("object_not_in_prerequisite_state", ["CREATE TEMP SEQUENCE s", "SELECT currval('s')"]),
    ("nul_in_jsonb", ["SELECT '\"a\\u0000b\"'::jsonb"]),
]


@pytest.mark.parametrize(
    ("statements"), [s for _, s in STATEMENT_RESULTS], ids=[n for n, _ in STATEMENT_RESULTS]
)
async def test_a_statements_own_error_is_not_unavailable(
    conn: asyncpg.Connection, statements: list[str]
) -> None:
    """A constraint, syntax or data error raised by a statement is its own, not the store's."""
    for statement in statements[:-1]:
        await conn.execute(statement)
    exc = await _raised(lambda: conn.execute(statements[-1]))
    assert isinstance(exc, asyncpg.PostgresError), exc
    assert not is_unavailable(exc)
    assert not drops_connection(exc)


async def test_a_read_only_transaction_is_unavailable_and_drops_the_connection(
    conn: asyncpg.Connection,
) -> None:
    """25006, what a standby or a read-only database answers a write, is unavailable, and the
    connection that met it is to be dropped."""
    async with conn.transaction(readonly=True):
        # (a temporary table may be written in a read-only transaction: not this one)
        exc = await _raised(lambda: conn.execute("CREATE TABLE w (x int)"))
    assert isinstance(exc, asyncpg.ReadOnlySQLTransactionError)
    assert is_unavailable(exc)
    assert drops_connection(exc)


async def test_a_statement_timeout_is_unavailable(conn: asyncpg.Connection) -> None:
    """57014, the server's statement timeout: the store did not answer in time."""
    await conn.execute("SET statement_timeout = 10")
    exc = await _raised(lambda: conn.execute("SELECT pg_sleep(1)"))
    assert isinstance(exc, asyncpg.QueryCanceledError)
    assert is_unavailable(exc)
    assert not drops_connection(exc)


async def test_a_terminated_backend_and_a_closed_connection_are_unavailable(
    database_url: str,
) -> None:
    """An administrator's termination (57P01 or the broken connection) and a call on a closed
    connection (InterfaceError) are unavailable."""
    victim = await asyncpg.connect(database_url)
    pid = victim.get_server_pid()
    await _on(database_url, f"SELECT pg_terminate_backend({pid})")
    terminated = await _raised(lambda: victim.fetchval("SELECT 1"))
    assert is_unavailable(terminated), repr(terminated)
    await victim.close()
    closed = await _raised(lambda: victim.fetchval("SELECT 1"))
    assert isinstance(closed, asyncpg.InterfaceError)
    assert is_unavailable(closed)


@pytest_asyncio.fixture(loop_scope="session")
async def role(pg_server_dsn: str) -> AsyncIterator[str]:
    name = f"opgate_faults_{uuid.uuid4().hex[:10]}"
    await _on(pg_server_dsn, f'CREATE ROLE "{name}" NOLOGIN')
    try:
        yield name
    finally:
        await _on(pg_server_dsn, f'DROP ROLE IF EXISTS "{name}"')


async def test_errors_raised_while_connecting_are_unavailable(
    pg_server_dsn: str, database_url: str, role: str
) -> None:
    """A role that may not log in (28000), a database that does not exist (3D000) or refuses
    connections (55000) and a closed port (OSError) are unavailable when connecting; 55000 is
    not when a statement raised it."""
    refused_login = await _raised(lambda: asyncpg.connect(_as_role(database_url, role)))
    assert isinstance(refused_login, asyncpg.InvalidAuthorizationSpecificationError)
    assert is_unavailable(refused_login)
    assert is_unavailable(refused_login, connecting=True)

    missing = urlunsplit(urlsplit(database_url)._replace(path="/opgate_no_such_database"))
    no_database = await _raised(lambda: asyncpg.connect(missing))
    assert isinstance(no_database, asyncpg.InvalidCatalogNameError)
    assert is_unavailable(no_database, connecting=True)

    database = _database(database_url)
    await _on(pg_server_dsn, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    try:
        refusing = await _raised(lambda: asyncpg.connect(database_url))
    finally:
        await _on(pg_server_dsn, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
    assert isinstance(refusing, asyncpg.ObjectNotInPrerequisiteStateError)
    assert is_unavailable(refusing, connecting=True)
    assert not is_unavailable(refusing)

    parts = urlsplit(database_url)
    # no query: a ``?host=`` (the embedded server's socket) would win over the closed port
    nobody = urlunsplit(
        parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{free_port()}", query="")
    )
    unreachable = await _raised(lambda: asyncpg.connect(nobody, timeout=5))
    assert isinstance(unreachable, OSError)
    assert is_unavailable(unreachable)


# Recovery conflicts need a hot standby to happen for real (tests/faults/ has one); here the
# message, which is what tells them from a primary's own serialization failure and deadlock.
CONFLICTS = [
    ("recovery_conflict_snapshot", asyncpg.SerializationError, True),
    ("recovery_conflict_buffer_deadlock", asyncpg.DeadlockDetectedError, True),
]


@pytest.mark.parametrize(
    ("error", "is_conflict"), [(e, c) for _, e, c in CONFLICTS], ids=[n for n, _, _ in CONFLICTS]
)
def test_a_recovery_conflict_drops_the_connection_a_primarys_own_does_not(
    error: type[asyncpg.PostgresError], is_conflict: bool
) -> None:
    """40001/40P01 "canceling statement due to conflict with recovery" is a standby's: dropped;
    the same SQLSTATE from a primary's own transactions is the statement's result."""
    conflict = error("canceling statement due to conflict with recovery")
    own = error("could not serialize access due to concurrent update")
    assert is_unavailable(conflict)
    assert drops_connection(conflict)
    assert not is_unavailable(own)
    assert not drops_connection(own)


async def test_no_exception_of_opgate_or_python_is_unavailable() -> None:
    """Only the store's errors: a ValueError or a KeyError from opgate's own code is a bug."""
    assert not is_unavailable(ValueError("x"))
    assert not is_unavailable(KeyError("x"))
    assert is_unavailable(TimeoutError())
    assert is_unavailable(ConnectionResetError())


async def test_the_store_drops_a_connection_that_met_a_read_only_server(
    database_url: str,
) -> None:
    """A write refused as read-only is StoreUnavailable, and that connection is terminated, not
    handed on: the next call runs on a new one (the pool reconnects)."""
    store = await Store.open(database_url, min_size=1, max_size=1)
    try:
        first = await store.run(lambda c: c.fetchval("SELECT pg_backend_pid()"))
        # the connection turns read-only, as a demoted primary's sessions are
        await store.run(lambda c: c.execute("SET default_transaction_read_only = on"))
        assert await store.run(lambda c: c.fetchval("SELECT pg_backend_pid()")) == first
        with pytest.raises(StoreUnavailable, match="read-only"):
            await store.run(lambda c: c.execute("CREATE TABLE w (x int)"))
        second = await store.run(lambda c: c.fetchval("SELECT pg_backend_pid()"))
        assert second != first
        await store.run(lambda c: c.execute("CREATE TABLE w (x int)"))  # writable again
    finally:
        await store.close()


async def test_readiness_refuses_a_read_only_session_and_drops_it(database_url: str) -> None:
    """The readiness ping fails on a read-only session and the next ping, on a new connection,
    succeeds."""
    store = await Store.open(database_url, min_size=1, max_size=1)
    try:
        await store.run(lambda c: c.execute("SET default_transaction_read_only = on"))
        with pytest.raises(StoreUnavailable, match="read-only"):
            await store.ping()
        await store.ping()
    finally:
        await store.close()


async def test_the_store_translates_a_database_that_refuses_connections(
    pg_server_dsn: str, database_url: str
) -> None:
    """Opening the pool, and reconnecting after the backends were terminated, against a database
    that refuses connections: StoreUnavailable, not ObjectNotInPrerequisiteStateError."""
    database = _database(database_url)
    store = await Store.open(database_url, min_size=1, max_size=1)
    try:
        await _on(
            pg_server_dsn,
            f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false',
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{database}' AND pid <> pg_backend_pid()",
        )
        # the first call may meet the terminated connection, the next reconnects and is refused
        for _ in range(2):
            with pytest.raises(StoreUnavailable):
                await store.load("op_1")
        with pytest.raises(StoreUnavailable, match="not currently accepting connections"):
            await Store.open(database_url, min_size=1, max_size=1)
    finally:
        await _on(pg_server_dsn, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await store.close()
