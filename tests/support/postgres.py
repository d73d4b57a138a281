"""Real PostgreSQL for tests: one server and one migrated template per session, a fresh database
per test.

The server is the one named by ``OPGATE_TEST_DATABASE_URL`` (trust auth, a role allowed to create
databases, e.g. ``postgresql://postgres@127.0.0.1:5432/postgres``) or, when that is unset, the
embedded pgserver that opgate itself uses, started in a temporary directory for the session.

Why a template: ``CREATE DATABASE ... TEMPLATE`` copies the migrated schema in a few
milliseconds, so every test starts from an empty, fully migrated database without running the
migrations again. Database names carry a random suffix, so several test sessions (xdist
workers, two developers' runs on one CI server) can share a server without colliding. A
session killed with SIGKILL leaves its ``opgate_tpl_*``/``opgate_test_*`` databases behind.

Register with ``pytest_plugins = ["tests.support.postgres"]`` in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio

from proxy.store.embedded import start_embedded
from proxy.store.migrate import load_migrations, migrate

__all__ = [
    "DATABASE_URL_ENV",
    "database_at_migration",
    "database_url",
    "dsn_for_database",
    "pg_server_dsn",
    "pg_template",
]

DATABASE_URL_ENV = "OPGATE_TEST_DATABASE_URL"


def dsn_for_database(server_dsn: str, database: str) -> str:
    """The same server, user and options (``?host=/socket/dir`` included), another database."""
    parts = urlsplit(server_dsn)
    return urlunsplit(parts._replace(path="/" + quote(database, safe="")))


async def database_at_migration(server_dsn: str, name: str, last: int) -> str:
    """A new database ``name`` migrated only up to migration ``last`` (as a deployment of that
    release left it), recorded in opgate_migrations so that ``migrate`` goes on from there; its
    DSN. The caller drops it."""
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = dsn_for_database(server_dsn, name)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE opgate_migrations (number integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in load_migrations():
            if migration.number <= last:
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO opgate_migrations (number, name) VALUES ($1, $2)",
                    migration.number,
                    migration.name,
                )
    finally:
        await conn.close()
    return dsn


def _unique_name(kind: str) -> str:
    return f"opgate_{kind}_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """DSN of a server this session may create databases on (its maintenance database)."""
    configured = os.environ.get(DATABASE_URL_ENV)
    if configured:
        yield configured
        return
    # Not tmp_path_factory: pytest keeps /tmp/pytest-of-<user> at 0700, which the pgserver
    # user (when running as root) cannot traverse. Our own directory may be opened up.
    workdir = Path(tempfile.mkdtemp(prefix="opgate-test-pg-"))
    workdir.chmod(0o755)
    server = start_embedded(workdir)
    try:
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def _execute_on_server(server_dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pg_template(pg_server_dsn: str) -> AsyncIterator[str]:
    """Name of a database migrated once for the session, to copy per test."""
    name = _unique_name("tpl")
    await _execute_on_server(pg_server_dsn, f'CREATE DATABASE "{name}"')
    try:
        await migrate(dsn_for_database(pg_server_dsn, name))
        yield name
    finally:
        await _execute_on_server(pg_server_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest_asyncio.fixture(loop_scope="session")
async def database_url(pg_server_dsn: str, pg_template: str) -> AsyncIterator[str]:
    """DSN of a fresh, migrated database of this test's own, force-dropped afterwards."""
    name = _unique_name("test")
    await _execute_on_server(pg_server_dsn, f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    try:
        yield dsn_for_database(pg_server_dsn, name)
    finally:
        await _execute_on_server(pg_server_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
