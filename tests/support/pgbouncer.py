"""A real PgBouncer (Debian package ``pgbouncer``) in transaction pooling mode, in front of the
test PostgreSQL, started and stopped by the test that asks for it."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import asyncpg

from tests.support.killable_opgate import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return Path(PGBOUNCER).exists()


def reaches_over_tcp(dsn: str) -> bool:
    """PgBouncer runs as ``postgres``; the embedded server's socket belongs to another user, so
    the test needs a PostgreSQL reached over TCP (CI's, or OPGATE_TEST_DATABASE_URL)."""
    host = _upstream(dsn)[0]
    return not host.startswith("/")


def _upstream(dsn: str) -> tuple[str, int, str, str]:
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    host = query.get("host") or parts.hostname or "127.0.0.1"
    port = int(query.get("port") or parts.port or 5432)
    return host, port, parts.username or "postgres", parts.path.lstrip("/")


def _write_config(host: str, port: int, user: str, database: str) -> tuple[Path, int]:
    workdir = Path(tempfile.mkdtemp(prefix="opgate-pgbouncer-"))
    workdir.chmod(0o777)  # PgBouncer refuses to run as root: it runs as postgres
    listen = free_port()
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{database} = host={host} port={port} dbname={database}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\n"
        f"unix_socket_dir =\nauth_type = trust\nauth_file = {workdir}/users.txt\n"
        "pool_mode = transaction\ndefault_pool_size = 5\nmax_client_conn = 200\n"
        # opgate names its instance in a session setting for the audit trigger; PgBouncer
        # cannot keep session settings in transaction pooling, so it must drop it.
        "ignore_startup_parameters = opgate.instance_id\n"
        f"logfile = {workdir}/pgbouncer.log\npidfile = {workdir}/pgbouncer.pid\n"
    )
    for path in workdir.iterdir():
        path.chmod(0o666)
    return workdir, listen


@contextlib.asynccontextmanager
async def pgbouncer_in_front_of(database_url: str) -> AsyncIterator[str]:
    """The DSN of ``database_url`` reached through PgBouncer (pool_mode=transaction)."""
    host, port, user, database = _upstream(database_url)
    workdir, listen = await asyncio.to_thread(_write_config, host, port, user, database)
    process = subprocess.Popen(  # noqa: ASYNC220  (a daemon we stop below)
        [PGBOUNCER, "-u", "postgres", str(workdir / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    netloc = f"{user}@127.0.0.1:{listen}"
    dsn = urlunsplit(("postgresql", netloc, f"/{database}", "", ""))
    try:
        await _wait_accepting(dsn, process, workdir)
        yield dsn
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 10)
        shutil.rmtree(workdir, ignore_errors=True)


async def _wait_accepting(dsn: str, process: subprocess.Popen[bytes], workdir: Path) -> None:
    for _ in range(200):
        if process.poll() is not None:
            log = (
                (workdir / "pgbouncer.log").read_text()
                if (workdir / "pgbouncer.log").exists()
                else ""
            )
            raise AssertionError(f"pgbouncer exited {process.returncode}: {log[-1500:]}")
        try:
            conn = await asyncpg.connect(dsn, statement_cache_size=0, timeout=2)
        except (OSError, asyncpg.PostgresError):
            await asyncio.sleep(0.05)  # polling a starting daemon, bounded
            continue
        await conn.close()
        return
    raise AssertionError("pgbouncer did not accept connections")
