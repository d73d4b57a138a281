"""The embedded PostgreSQL that opgate runs when it is given no database URL.

The quick start must need nothing installed by hand, and opgate never falls back to SQLite, so
the ``pgserver`` wheel (PostgreSQL 16 binaries inside a Python package) provides a real server
on a unix socket. First start (initdb) takes about a second; later starts about 0.1 s.

What pgserver 0.1.4 does, and what this module adds:

* **Run as root**, PostgreSQL refuses to run, so pgserver creates a system user ``pgserver``
  (``useradd``) and runs initdb and the server as that user, after ``chown``-ing the data
  directory to it. To let that user reach the data directory it adds ``g+rx,o+rx`` to *every*
  ancestor, all the way up to ``/``: a data directory under ``/root`` would make ``/root``
  world-readable. So, as root, when some ancestor of ``data_dir/pg`` is not already ``g+rx,o+rx``,
  the cluster is created instead in a fresh directory under :data:`ROOT_CLUSTER_BASE`
  (``/var/lib/opgate/embedded``) and ``data_dir/pg`` becomes a symlink to it; pgserver resolves
  the link, finds only already-open ancestors, and changes no one's permissions. Removing
  ``data_dir`` leaves that cluster behind: delete the link's target too.
  pgserver also opens up the ancestors of its own binaries (the virtualenv), which this module
  cannot avoid: install opgate outside ``/root`` when running as root.
* **Two opgate processes on one data directory** share one server: pgserver takes a per-user
  file lock (in ``$XDG_RUNTIME_DIR``, or ``/tmp/runtime-<uid>``), finds the running postmaster
  through ``postmaster.pid`` and records each process id in ``.handle_pids.json``; only the
  last process to stop stops the server. PostgreSQL itself refuses a second postmaster on the
  same directory, so nothing can corrupt the data. A process killed with SIGKILL stays in that
  list and would keep the server running forever after, so dead ids are pruned at start.
* **Stopping** runs ``pg_ctl -w stop`` (fast shutdown) when this is the last handle and then
  waits until the postmaster has exited. Where PID 1 does not reap orphans, the exited
  postmaster lingers as a ``<defunct>`` entry: dead, holding no socket, file or memory.

Within one process there is one server per data directory: starting twice returns handles to
the same server, and the first ``stop()`` stops it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import stat
import tempfile
import time
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_log = logging.getLogger(__name__)

ROOT_CLUSTER_BASE = Path("/var/lib/opgate/embedded")
_OPEN_BITS = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
_STOP_WAIT_SECONDS = 10.0


@dataclass
class EmbeddedPostgres:
    """A running embedded server; ``dsn`` is a unix-socket URI asyncpg accepts."""

    dsn: str
    pgdata: Path
    _server: Any
    _stopped: bool = field(default=False, init=False)

    def stop(self) -> None:
        """Stop the server unless another process still uses it; idempotent."""
        from pgserver.postgres_server import PostgresServer

        if self._stopped:
            return
        self._stopped = True
        pid = self._server.get_pid()
        # cleanup() takes pgserver's lock and only stops (cleanup_mode="stop"), despite its name.
        self._server.cleanup()
        atexit.unregister(self._server._cleanup)
        # pgserver forgets the handle only when it stopped the server; forget it in every case,
        # so that a later start in this process registers afresh.
        was_last = PostgresServer._instances.pop(self.pgdata, None) is None
        if was_last:
            _wait_until_exited(pid)


def start_embedded(
    data_dir: Path, *, root_cluster_base: Path = ROOT_CLUSTER_BASE
) -> EmbeddedPostgres:
    """Start (or join) the embedded server whose data lives in ``data_dir / "pg"``."""
    pgserver = _import_pgserver()
    from pgserver.postgres_server import PostgresServer

    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = _cluster_path(data_dir.resolve(), root_cluster_base)
    with PostgresServer._lock:
        _forget_dead_handles(pgdata)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    return EmbeddedPostgres(dsn=server.get_uri(), pgdata=pgdata, _server=server)


def _import_pgserver() -> Any:
    """Import pgserver without its import-time warning about a missing XDG_RUNTIME_DIR.

    platformdirs warns and falls back to ``/tmp/runtime-<uid>``, which is fine for a lock file;
    under ``filterwarnings = error`` the warning would otherwise make the import fail.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
        import pgserver

    return pgserver


def _cluster_path(data_dir: Path, root_cluster_base: Path) -> Path:
    """Where the cluster lives, resolved: ``data_dir/pg``, or its symlink's target (as root)."""
    link = data_dir / "pg"
    if os.geteuid() != 0 or link.exists() or _all_open(data_dir):
        link.mkdir(exist_ok=True)
        return link.resolve()
    root_cluster_base.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not _all_open(root_cluster_base):
        raise RuntimeError(
            f"{root_cluster_base} and its ancestors must be g+rx,o+rx for the pgserver user"
        )
    target = Path(tempfile.mkdtemp(prefix="pg-", dir=root_cluster_base))
    try:
        link.symlink_to(target, target_is_directory=True)
        _log.info("embedded PostgreSQL cluster for %s placed at %s", data_dir, target)
    except FileExistsError:  # another opgate process linked first: use its cluster
        target.rmdir()
    return link.resolve()


def _all_open(directory: Path) -> bool:
    """True if ``directory`` and every ancestor already have ``g+rx,o+rx``."""
    return all(p.stat().st_mode & _OPEN_BITS == _OPEN_BITS for p in (directory, *directory.parents))


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop ids of processes that died without stopping, so the last live one can stop."""
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    pids: list[int] = json.loads(handles.read_text())
    alive = [pid for pid in pids if _is_running(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _is_running(pid: int) -> bool:
    """True if the process exists and is not a zombie (exited but not reaped)."""
    if not Path("/proc/self/stat").exists():  # no procfs: signal 0 counts zombies as running
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_until_exited(pid: int) -> None:
    """Wait for the postmaster to exit: ``pg_ctl -w`` returns when its pid file is gone."""
    deadline = time.monotonic() + _STOP_WAIT_SECONDS
    while _is_running(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"embedded PostgreSQL (pid {pid}) did not exit")
        time.sleep(0.01)


@contextlib.asynccontextmanager
async def database_dsn(database_url: str | None, data_dir: Path) -> AsyncIterator[str]:
    """The primary's URL, or an embedded PostgreSQL in ``data_dir`` when none is given."""
    if database_url:
        yield database_url
        return
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    embedded = await asyncio.to_thread(start_embedded, data_dir)
    _log.info("embedded PostgreSQL started in %s", data_dir)
    try:
        yield embedded.dsn
    finally:
        await asyncio.to_thread(embedded.stop)
