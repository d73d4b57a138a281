"""``opgate serve --workers N``: a pre-fork supervisor.

The parent does what must happen once (start the embedded PostgreSQL if there is no database
URL, apply migrations, bind the listening sockets), then forks N workers that inherit the
sockets; the kernel spreads connections among them. Each worker has its own event loop and
pool, and is otherwise a complete opgate: opgate keeps no state outside PostgreSQL.

Signals: SIGTERM/SIGINT are passed to every worker, which drains (stops accepting, finishes
in-flight requests up to ``drain_seconds``) and exits; SIGHUP is passed on (policy reload). A
worker that dies unexpectedly is replaced. Workers die with the parent (PR_SET_PDEATHSIG), so a
SIGKILLed supervisor leaves nothing behind serving, exactly like a crashed host.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from proxy.server import bind_listener, check_replication, run_server
from proxy.settings import Settings

_log = structlog.get_logger("opgate.workers")
_PR_SET_PDEATHSIG = 1
_RESTART_BACKOFF_SECONDS = 1.0


def effective_workers(settings: Settings) -> int:
    """The configured count, else the cores this process may run on (a cpuset, in a
    container, rather than the host's count)."""
    return settings.workers or len(os.sched_getaffinity(0)) or 1


def run_supervisor(settings: Settings, workers: int) -> int:
    """Serve with ``workers`` processes until SIGTERM/SIGINT; returns the exit status."""
    with _embedded_database(settings) as settings_with_db:
        from proxy.store.migrate import migrate

        assert settings_with_db.database_url is not None
        asyncio.run(migrate(settings_with_db.database_url))
        asyncio.run(check_replication(settings_with_db.database_url, settings_with_db))
        sockets = _bind_all(settings_with_db)
        return _supervise(settings_with_db, sockets, workers)


@contextlib.contextmanager
def _embedded_database(settings: Settings) -> Iterator[Settings]:
    if settings.database_url:
        yield settings
        return
    from proxy.store.embedded import start_embedded

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    embedded = start_embedded(settings.data_dir)
    try:
        yield settings.model_copy(update={"database_url": embedded.dsn})
    finally:
        embedded.stop()


def _bind_all(settings: Settings) -> dict[str, socket.socket]:
    sockets = {
        "agent": bind_listener("agent_listen", settings.agent_listen),
        "ops": bind_listener("ops_listen", settings.ops_listen),
    }
    if settings.forward_listen:
        sockets["forward"] = bind_listener("forward_listen", settings.forward_listen)
    return sockets


def _supervise(settings: Settings, sockets: dict[str, socket.socket], workers: int) -> int:
    # The workers' shared metric counts live as long as this supervisor.
    metrics_dir = Path(tempfile.mkdtemp(prefix="opgate-metrics-"))
    try:
        return _supervise_workers(settings, sockets, workers, metrics_dir)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _supervise_workers(
    settings: Settings, sockets: dict[str, socket.socket], workers: int, metrics_dir: Path
) -> int:
    stopping = False
    children: dict[int, int] = {}  # pid -> worker index

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        if signum in (signal.SIGTERM, signal.SIGINT):
            stopping = True
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM if signum == signal.SIGINT else signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    for index in range(workers):
        children[_fork_worker(settings, sockets, index, metrics_dir)] = index
    _log.info("workers_started", workers=workers, pids=sorted(children))
    status = 0
    while children:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries os.wait itself
            continue
        if pid not in children:
            continue
        index = children.pop(pid)
        code = os.waitstatus_to_exitcode(wait_status)
        if stopping:
            status = status or (code if code > 0 else 0)
            continue
        _log.error("worker_died", pid=pid, exit_code=code, worker=index)
        time.sleep(_RESTART_BACKOFF_SECONDS)  # a crash loop must not spin the supervisor
        if stopping:  # SIGTERM arrived while we waited: do not start what we must stop
            continue
        new_pid = _fork_worker(settings, sockets, index, metrics_dir)
        children[new_pid] = index
        _log.info("worker_replaced", pid=new_pid, worker=index)
    _log.info("workers_stopped")
    return status


_HANDLED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _fork_worker(
    settings: Settings, sockets: dict[str, socket.socket], index: int, metrics_dir: Path
) -> int:
    # Signals are held across the fork: the child must not run the supervisor's handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
        return pid
    # the worker
    for signum in _HANDLED:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
    _die_with_parent()
    worker_settings = settings.model_copy(
        update={
            "instance_id": f"{settings.instance_id}:w{index}:{os.getpid()}",
            "metrics_dir": metrics_dir,
        }
    )
    code = 0
    try:
        run_server(worker_settings, sockets)
    except BaseException:  # a worker reports and exits; the supervisor replaces it
        _log.exception("worker_failed", worker=index)
        code = 1
    finally:
        # A dead log sink (EPIPE, ENOSPC) must not keep the worker from exiting (sinks.py).
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
    os._exit(code)


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the supervisor dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
