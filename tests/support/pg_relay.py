"""A cuttable TCP relay in front of PostgreSQL, to make "the database went away" happen for real.

Point opgate (or asyncpg) at the relay instead of the server; ``cut()`` then aborts every relayed
connection, so in-flight and later queries on them fail the way they do when the server dies,
and accepts-then-closes every new connection, so reconnecting fails too, until ``restore()``.
Nothing is simulated inside the client library: it sees a real closed socket.

The target is given the libpq way: a host starting with ``/`` is a unix-socket directory, and
the socket is ``<dir>/.s.PGSQL.<port>``; that is how the embedded server (pgserver) listens.
:func:`relay_target` reads the target from a DSN and :func:`dsn_through_relay` rewrites a DSN to
go through the relay (always TCP on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["TcpRelay", "dsn_through_relay", "relay_target"]

_DEFAULT_PORT = 5432
_CHUNK = 64 * 1024


class TcpRelay:
    """Relays 127.0.0.1:<port 0> to one PostgreSQL server until cut."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._target: tuple[str, int] | None = None
        self._is_cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self, target_host: str, target_port: int) -> tuple[str, int]:
        """Start listening; returns the (host, port) clients should connect to."""
        self._target = (target_host, target_port)
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def cut(self) -> None:
        """Abort every relayed connection and refuse new ones; returns once all are closed."""
        self._is_cut = True
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def restore(self) -> None:
        """Relay new connections again (connections cut earlier stay dead)."""
        self._is_cut = False

    async def stop(self) -> None:
        """Cut everything and stop listening."""
        await self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            if self._is_cut:
                return
            try:
                up_reader, up_writer = await self._connect_upstream()
            except OSError:
                return
            self._writers.add(up_writer)
            try:
                if not self._is_cut:  # a cut may have happened while connecting
                    await asyncio.gather(
                        _pipe(reader, up_writer, writer), _pipe(up_reader, writer, up_writer)
                    )
            finally:
                up_writer.transport.abort()
                self._writers.discard(up_writer)
        finally:
            writer.transport.abort()
            self._writers.discard(writer)
            self._handlers.discard(task)

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert self._target is not None
        host, port = self._target
        if host.startswith("/"):
            return await asyncio.open_unix_connection(str(Path(host) / f".s.PGSQL.{port}"))
        return await asyncio.open_connection(host, port)


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: asyncio.StreamWriter
) -> None:
    """Copy until EOF or error, then abort the other side too: no half-open connections."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.transport.abort()
        peer.transport.abort()


def relay_target(dsn: str) -> tuple[str, int]:
    """The (host, port) a DSN connects to; host is a socket directory for unix sockets."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    host = query.get("host") or parts.hostname
    if not host:  # libpq would pick a compiled-in socket directory: be explicit instead
        raise ValueError(f"DSN names no host: {dsn}")
    port = int(query.get("port") or parts.port or _DEFAULT_PORT)
    return host, port


def dsn_through_relay(dsn: str, relay_host: str, relay_port: int) -> str:
    """The same DSN (user, database, other options) pointed at the relay over TCP."""
    parts = urlsplit(dsn)
    userinfo, at, _ = parts.netloc.rpartition("@")
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port")]
    netloc = f"{userinfo}{at}{relay_host}:{relay_port}"
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))
