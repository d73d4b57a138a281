"""A cuttable TCP relay in front of PostgreSQL, to make "the database went away" happen for real.

Point opgate (or asyncpg) at the relay instead of the server; ``cut()`` then aborts every relayed
connection, so in-flight and later queries on them fail the way they do when the server dies,
and accepts-then-closes every new connection, so reconnecting fails too, until ``restore()``.
Nothing is simulated inside the client library: it sees a real closed socket.
``lose_reply_to(marker)`` makes the other half of a failover happen: a statement that ran and
committed on the server, whose answer never reached the client (the acknowledgement lost with
the connection).

The target is given the libpq way: a host starting with ``/`` is a unix-socket directory, and
the socket is ``<dir>/.s.PGSQL.<port>``; that is how the embedded server (pgserver) listens.
:func:`relay_target` reads the target from a DSN and :func:`dsn_through_relay` rewrites a DSN to
go through the relay (always TCP on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["TcpRelay", "dsn_through_relay", "relay_target"]

_DEFAULT_PORT = 5432
_CHUNK = 64 * 1024
_TAIL = 4096  # client bytes kept across chunks to find a marker cut in two (markers are short)
Verdict = Literal["relay", "drop", "cut"]  # what a pipe does with a chunk


class TcpRelay:
    """Relays 127.0.0.1:<port 0> to one PostgreSQL server until cut."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._target: tuple[str, int] | None = None
        self._is_cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._lose_after: bytes | None = None
        self.replies_lost = 0

    def lose_reply_to(self, marker: bytes) -> None:
        """Once: the next client message holding ``marker`` (e.g. a value bound to a statement)
        goes to the server, whose whole reply to it, up to and including its ReadyForQuery, is
        dropped; then that connection is cut. A server sends ReadyForQuery only after the
        statement's implicit transaction has committed, so the client sees a broken connection
        for a statement that did happen."""
        self._lose_after = marker

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
                    losing = _LostReply()
                    await asyncio.gather(
                        _pipe(reader, up_writer, writer, lambda data: self._watch(data, losing)),
                        _pipe(up_reader, writer, up_writer, losing.swallow),
                    )
                    if losing.complete:
                        self.replies_lost += 1
            finally:
                up_writer.transport.abort()
                self._writers.discard(up_writer)
        finally:
            writer.transport.abort()
            self._writers.discard(writer)
            self._handlers.discard(task)

    def _watch(self, data: bytes, losing: _LostReply) -> Verdict:
        """Client to server: arms ``losing`` on the message holding the marker (always relayed)."""
        losing.seen_tail += data
        if self._lose_after is not None and self._lose_after in losing.seen_tail:
            self._lose_after = None
            losing.armed = True
        losing.seen_tail = losing.seen_tail[-_TAIL:]
        return "relay"

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert self._target is not None
        host, port = self._target
        if host.startswith("/"):
            return await asyncio.open_unix_connection(str(Path(host) / f".s.PGSQL.{port}"))
        return await asyncio.open_connection(host, port)


class _LostReply:
    """One connection's reply to lose: armed by the client's marker, complete at the server's
    ReadyForQuery (parsed by message: type byte, then a length that counts itself)."""

    def __init__(self) -> None:
        self.armed = False
        self.complete = False
        self.seen_tail = b""
        self._reply = b""

    def swallow(self, data: bytes) -> Verdict:
        """Server to client: relayed until armed, then dropped; cut once the reply is whole."""
        if not self.armed:
            return "relay"
        self._reply += data
        while len(self._reply) >= 5:
            kind, length = self._reply[:1], int.from_bytes(self._reply[1:5], "big")
            if len(self._reply) < 1 + length:
                break
            self._reply = self._reply[1 + length :]
            if kind == b"Z":
                self.complete = True
                return "cut"
        return "drop"


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    peer: asyncio.StreamWriter,
    passes: Callable[[bytes], Verdict] = lambda data: "relay",
) -> None:
    """Copy until EOF, error or a ``passes`` verdict "cut" ("drop": the chunk is not copied),
    then abort the other side too: no half-open connections."""
    try:
        while data := await reader.read(_CHUNK):
            verdict = passes(data)
            if verdict == "cut":
                break
            if verdict == "relay":
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
