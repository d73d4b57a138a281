"""The embedded PostgreSQL (pgserver) starts, serves, stops for real, and survives restarts."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import psutil
import pytest

from proxy.observe.auditlog.verify import verify
from proxy.store.embedded import EmbeddedPostgres, start_embedded
from proxy.store.migrate import migrate
from proxy.store.operation import Status
from proxy.store.store import Claim, ProviderAnswer, Store
from tests.support.operations import new_operation
from tests.support.polling import until

# A second opgate process, reduced to what matters here: join the server, report, obey stdin.
_OTHER_PROCESS = """
import sys
from pathlib import Path
from proxy.store.embedded import start_embedded
server = start_embedded(Path(sys.argv[1]))
print(server.dsn, flush=True)
if sys.stdin.readline().strip() == "stop":
    server.stop()
print("done", flush=True)
"""


BEGINNING, END = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)


def _open_tmp_dir(mode: int) -> Path:
    """A temporary directory under /tmp; 0o755 lets the pgserver user (as root) reach it."""
    path = Path(tempfile.mkdtemp(prefix="opgate-embedded-"))
    path.chmod(mode)
    return path


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = _open_tmp_dir(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _postmaster_pid(server: EmbeddedPostgres) -> int:
    return int((server.pgdata / "postmaster.pid").read_text().splitlines()[0])


def _is_alive(pid: int) -> bool:
    """Running and not a zombie: where PID 1 reaps nothing, an exited postmaster stays defunct."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _live_postgres_for(pgdata: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and str(pgdata) in " ".join(cmdline):
            found.append(proc.info["pid"])
    return found


async def _select_one(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT 1"))
    finally:
        await conn.close()


async def test_start_serves_queries_and_stop_leaves_no_postgres(data_dir: Path) -> None:
    """A started server answers asyncpg and, once stopped, no postgres process of it remains."""
    server = start_embedded(data_dir)
    pid = _postmaster_pid(server)
    try:
        assert server.pgdata == (data_dir / "pg").resolve()
        assert await _select_one(server.dsn) == 1
    finally:
        server.stop()
    assert not _is_alive(pid)
    assert _live_postgres_for(server.pgdata) == []


async def test_restart_on_existing_data_dir_keeps_data(data_dir: Path) -> None:
    """Stopping and starting again on the same directory serves the data written before."""
    first = start_embedded(data_dir)
    try:
        conn = await asyncpg.connect(first.dsn)
        await conn.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('yes')")
        await conn.close()
    finally:
        first.stop()
    second = start_embedded(data_dir)
    try:
        conn = await asyncpg.connect(second.dsn)
        assert await conn.fetchval("SELECT v FROM kept") == "yes"
        await conn.close()
    finally:
        second.stop()
    assert _live_postgres_for(second.pgdata) == []


@contextmanager
def _other_process(data_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the server; killed and reaped on the way out whatever happens."""
    with subprocess.Popen(
        [sys.executable, "-c", _OTHER_PROCESS, str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as other:
        try:
            yield other
        finally:
            other.kill()


def _ask(other: subprocess.Popen[str], line: str | None) -> str:
    """Send a line (if any) to the other process and read its next line."""
    assert other.stdin is not None
    assert other.stdout is not None
    if line is not None:
        other.stdin.write(line + "\n")
        other.stdin.flush()
    return other.stdout.readline().strip()


def test_two_processes_share_one_server_and_the_last_stops_it(data_dir: Path) -> None:
    """A second process joins the running server; it keeps running until both have stopped."""
    mine = start_embedded(data_dir)
    pid = _postmaster_pid(mine)
    with _other_process(data_dir) as other:
        assert _ask(other, None) == mine.dsn
        assert _postmaster_pid(mine) == pid
        mine.stop()
        assert _is_alive(pid), "the other process still uses the server"
        assert _ask(other, "stop") == "done"
        assert other.wait(timeout=30) == 0
    assert not _is_alive(pid)


def test_a_killed_process_does_not_keep_the_server_alive(data_dir: Path) -> None:
    """A handle left by a SIGKILLed process is forgotten, so the last live process stops."""
    with _other_process(data_dir) as other:
        assert _ask(other, None).startswith("postgresql://")
        other.send_signal(signal.SIGKILL)
        other.wait()
    server = start_embedded(data_dir)
    pid = _postmaster_pid(server)
    server.stop()
    assert not _is_alive(pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="the pgserver user exists only when run as root")
async def test_as_root_a_private_data_dir_is_not_opened_up() -> None:
    """As root, a data dir below a 0700 directory keeps its mode; the cluster is linked in."""
    private = _open_tmp_dir(0o700)
    base = _open_tmp_dir(0o755)
    try:
        server = start_embedded(private / "opgate", root_cluster_base=base)
        try:
            assert await _select_one(server.dsn) == 1
        finally:
            server.stop()
        assert private.stat().st_mode & 0o777 == 0o700
        link = private / "opgate" / "pg"
        assert link.is_symlink()
        assert link.resolve().parent == base
        assert _live_postgres_for(server.pgdata) == []
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


async def test_a_database_crash_keeps_every_claim_and_settle_that_returned(
    data_dir: Path,
) -> None:
    """PostgreSQL stopped at once, as in a crash (immediate shutdown: WAL not yet written out is
    lost), right after claims and settles. Each returned only once its commit was on disk: after
    the restart every one is there, with its events, and the audit chain verifies. A claim
    lost this way would put its row back to created, free to be sent a second time."""
    operations = [f"op_crash_{n}" for n in range(40)]
    answer = ProviderAnswer(200, "re_1", "application/json", b"{}")
    server = start_embedded(data_dir)
    await migrate(server.dsn)
    store = await Store.open(server.dsn, min_size=1, max_size=2)
    try:
        for operation_id in operations:
            await store.create(new_operation(operation_id), "test")
        for operation_id in operations:
            claimed = await store.claim(
                Claim(operation_id, owner="me", lease_seconds=30, expected_attempts=0)
            )
            assert claimed is not None
            assert await store.settle(operation_id, Status.CONFIRMED, answer, "me") is not None
        postmaster = _postmaster_pid(server)
        os.kill(postmaster, signal.SIGQUIT)  # what pg_ctl stop -m immediate sends
        await until(lambda: not _is_alive(postmaster), "the crashed postmaster exits", 30)
    finally:
        with contextlib.suppress(asyncpg.PostgresError, OSError):
            await store.close()  # its connections' server has gone
    server.stop()
    restarted = start_embedded(data_dir)
    try:
        conn = await asyncpg.connect(restarted.dsn)
        try:
            rows = await conn.fetch(
                "SELECT o.operation_id, o.status, array_agg(e.event ORDER BY e.event_id) AS events"
                "  FROM operations o JOIN operation_events e USING (operation_id)"
                " GROUP BY o.operation_id, o.status"
            )
            report = await verify(conn, BEGINNING, END, key=None, whole_log=True)
        finally:
            await conn.close()
    finally:
        restarted.stop()
    assert sorted(row["operation_id"] for row in rows) == sorted(operations)
    assert {(row["status"], tuple(row["events"])) for row in rows} == {
        ("confirmed", ("created", "claimed", "confirmed"))
    }
    assert report.ok, report.breaks
