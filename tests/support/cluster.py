"""A real PostgreSQL 15 primary with a streaming standby on loopback, for failover tests.

Built from the Debian binaries (``/usr/lib/postgresql/15/bin``) run as the ``postgres`` user
(they refuse root): ``initdb`` for the primary, ``pg_basebackup -R -X stream`` for the standby,
both listening on free ports of 127.0.0.1 with their sockets, data and logs in one temporary
folder that :meth:`Cluster.stop` removes with everything it started.

Replication is synchronous (``synchronous_standby_names`` names the standby's
``application_name``) or asynchronous (empty), and can be switched with :meth:`Cluster.set_sync`.
A failover is :meth:`Cluster.kill_primary` (``pg_ctl -m immediate stop``: a crash, nothing
flushed to the standby after it) then :meth:`Cluster.promote` (``pg_ctl -w promote``).
:meth:`Cluster.dsn` is the multi-host DSN opgate is given in production
(``target_session_attrs=read-write``), which follows the promotion.

``fsync=off``: the test bed crashes the server, never the machine, so the page cache survives
and an unflushed commit is still durable; it saves seconds per cluster on a shared disk.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from proxy.store.migrate import migrate
from tests.support.killable_opgate import free_port

__all__ = ["PG_BIN", "Cluster", "Node", "cluster", "missing_reason", "running_cluster"]

PG_BIN = Path(os.environ.get("OPGATE_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
STANDBY_NAME = "opgate_standby"
_OWNER = "postgres"


def missing_reason() -> str | None:
    """Why a cluster cannot be built here, or None when it can."""
    for binary in ("initdb", "pg_ctl", "pg_basebackup"):
        if not (PG_BIN / binary).exists():
            return f"PostgreSQL binaries not found: {PG_BIN / binary} (set OPGATE_TEST_PG_BIN)"
    try:
        pwd.getpwnam(_OWNER)
    except KeyError:
        return f"no {_OWNER!r} user to run PostgreSQL as"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != _OWNER:
        return f"running as neither root nor {_OWNER!r}: cannot run the server as {_OWNER!r}"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "runuser not found: cannot run the server as postgres"
    return None


def _as_owner(*argv: str) -> list[str]:
    command = [str(PG_BIN / argv[0]), *argv[1:]]
    if os.geteuid() == 0:
        return ["runuser", "-u", _OWNER, "--", *command]
    return command


def _run(*argv: str, timeout: float = 60) -> str:
    done = subprocess.run(
        _as_owner(*argv), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


@dataclass
class Node:
    """One PostgreSQL server of the cluster."""

    name: str
    datadir: Path
    port: int
    logfile: Path
    running: bool = False

    def start(self) -> None:
        for attempt in range(3):
            try:
                _run(
                    "pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-w", "-t", "60",
                    "start",
                )  # fmt: skip
                break
            except RuntimeError:
                if attempt == 2 or "could not bind" not in self.log():
                    raise
                # Another process took the free port between its choice and this start (two
                # test workers build clusters side by side): another port, set last so it wins.
                self.port = free_port()
                with (self.datadir / "postgresql.auto.conf").open("a") as conf:
                    conf.write(f"port = {self.port}\n")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        if not self.running:
            return
        _run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Cluster:
    """A primary and one streaming standby; see the module docstring."""

    workdir: Path
    primary: Node
    standby: Node
    sync: bool
    databases: list[str] = field(default_factory=list)

    @property
    def primary_port(self) -> int:
        return self.primary.port

    @property
    def standby_port(self) -> int:
        return self.standby.port

    @classmethod
    def start(cls, *, sync: bool, fsync: bool = False) -> Cluster:
        """Initialise, start and connect both nodes; returns once the standby streams (and, when
        ``sync``, is the primary's synchronous standby). ``fsync``: flush as production does
        (for measurements; tests do not need it)."""
        reason = missing_reason()
        if reason is not None:
            raise RuntimeError(reason)
        workdir = Path(tempfile.mkdtemp(prefix="opgate-cluster-"))
        # The servers run as postgres and create their folders here; root still removes it.
        shutil.chown(workdir, _OWNER, _OWNER)
        sockets = workdir / "sockets"
        sockets.mkdir()
        shutil.chown(sockets, _OWNER, _OWNER)
        primary = Node("primary", workdir / "primary", free_port(), workdir / "primary.log")
        standby = Node("standby", workdir / "standby", free_port(), workdir / "standby.log")
        for path in (primary.logfile, standby.logfile):
            path.touch()
            shutil.chown(path, _OWNER, _OWNER)
        cluster = cls(workdir, primary, standby, sync)
        try:
            cluster._init_primary(sockets, fsync)
            cluster._init_standby()
            cluster._wait_streaming()
            if sync:
                cluster.set_sync(True)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _init_primary(self, sockets: Path, fsync: bool) -> None:
        node = self.primary
        _run("initdb", "-D", str(node.datadir), "-U", "postgres", "--auth=trust", "--no-sync")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(node.port),
            "unix_socket_directories": f"'{sockets}'",
            "wal_level": "replica",
            "max_wal_senders": "4",
            "hot_standby": "on",
            "wal_log_hints": "on",
            "fsync": "on" if fsync else "off",
            "shared_buffers": "16MB",
            "max_connections": "60",
            "synchronous_standby_names": "''",
            # A standby that connects late still finds the WAL it needs.
            "wal_keep_size": "64MB",
        }
        with (node.datadir / "postgresql.auto.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        with (node.datadir / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        node.start()

    def _init_standby(self) -> None:
        node = self.standby
        _run(
            "pg_basebackup",
            f"--dbname=host=127.0.0.1 port={self.primary.port} user=postgres "
            f"application_name={STANDBY_NAME}",
            "-D",
            str(node.datadir),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        # -R wrote primary_conninfo (with our application_name) and standby.signal; the copied
        # auto.conf still says the primary's port.
        with (node.datadir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"port = {node.port}\n")
        node.start()

    def _wait_streaming(self) -> None:
        self._poll_primary(
            "SELECT count(*) FROM pg_stat_replication "
            f"WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'",
            "1",
            "the standby streams from the primary",
        )

    def _psql(self, node: Node, sql: str, database: str = "postgres") -> str:
        return _run(
            "psql",
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(node.port),
            "-U",
            "postgres",
            "-d",
            database,
            "-c",
            sql,
        ).strip()

    def _poll_primary(self, sql: str, expected: str, what: str, seconds: float = 20.0) -> None:
        # A subprocess poll of a server we just started: nothing signals when it is ready.
        deadline = time.monotonic() + seconds
        while True:
            if self._psql(self.primary, sql) == expected:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not within {seconds} s: {what}\n{self.primary.log()[-2000:]}"
                    f"\n{self.standby.log()[-2000:]}"
                )
            time.sleep(0.05)

    def set_sync(self, sync: bool) -> None:
        """Make the standby synchronous (or not) on the primary, and wait until it is."""
        names = STANDBY_NAME if sync else ""
        self._psql(self.primary, f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        self._psql(self.primary, "SELECT pg_reload_conf()")
        self._poll_primary(
            "SELECT current_setting('synchronous_standby_names')",
            names,
            "the primary reloads synchronous_standby_names",
        )
        if sync:
            self._poll_primary(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                "1",
                "the standby is synchronous",
            )
        self.sync = sync

    def kill_primary(self) -> None:
        """Crash the primary: nothing it had not yet sent reaches the standby."""
        self.primary.stop("immediate")

    def promote(self) -> None:
        """Promote the standby; returns once it accepts writes."""
        _run("pg_ctl", "-D", str(self.standby.datadir), "-w", "-t", "60", "promote")

    def stop_standby(self) -> None:
        """Stop the standby (cleanly): with sync replication the primary's commits now hang."""
        self.standby.stop("fast")

    def start_standby(self) -> None:
        self.standby.start()
        self._wait_streaming()

    def dsn(self, database: str = "postgres") -> str:
        """The DSN opgate is given: both hosts, only ever the one that accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},"
            f"127.0.0.1:{self.standby.port}/{database}?target_session_attrs=read-write"
        )

    async def create_database(self, name: str = "opgate") -> str:
        """Create and migrate opgate's database on the primary; returns its multi-host DSN."""
        conn = await asyncpg.connect(self.primary.dsn())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        self.databases.append(name)
        await migrate(self.primary.dsn(name))
        return self.dsn(name)

    def stop(self) -> None:
        """Stop both servers (a crashed one is already down) and remove the folder."""
        for node in (self.standby, self.primary):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                node.stop("immediate")
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def running_cluster(*, sync: bool, fsync: bool = False) -> Iterator[Cluster]:
    """A started cluster, stopped on the way out whatever happened."""
    started = Cluster.start(sync=sync, fsync=fsync)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A synchronous primary + standby shared by a module's tests (skipped without binaries).

    Tests that kill or promote a node must build their own with :func:`running_cluster`.
    """
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_cluster(sync=True) as started:
        yield started
