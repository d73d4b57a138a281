"""CONNECT: take the agent's connection over, for an inspected tunnel or an opaque one.

aiohttp's server has no CONNECT support, but it hands the request to a middleware with the raw
transport. After ``200 Connection established``:

- **inspected**: ``loop.start_tls`` turns the raw transport into a TLS server connection with a
  leaf certificate for the CONNECT target, and a fresh aiohttp ``RequestHandler`` of the same
  listener (``web.Server()``) serves the requests inside it: each one reaches the forward
  middleware and then the same pipeline as reverse mode. ``_Handover`` buffers what the TLS
  layer delivers before that handler is attached (httpx sends its request at once).
- **pass-through**: bytes are copied both ways to the checked address, and counted.

Either way the CONNECT handler waits until the tunnel closes and then tells the original
``RequestHandler`` that its connection is gone (its transport now belongs to another
protocol, so nobody else would: it would stay in the server's connection set for ever).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast

from aiohttp import web

from proxy.observe.audit import AuditRecord

TUNNEL_ESTABLISHED = "Connection established"


class _Handover(asyncio.Protocol):
    """Stands between the TLS transport and the tunnel's request handler."""

    def __init__(self, closed: asyncio.Future[None]) -> None:
        self._inner: asyncio.Protocol | None = None
        self._early: list[bytes] = []
        self._eof = False
        self._closed = closed

    def attach(self, inner: asyncio.Protocol, transport: asyncio.BaseTransport) -> None:
        self._inner = inner
        inner.connection_made(transport)
        for data in self._early:
            inner.data_received(data)
        self._early.clear()
        if self._eof:
            inner.eof_received()

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            self._early.append(data)
        else:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is None:
            self._eof = True
            return None
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._inner.connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)


async def establish(request: web.Request) -> None:
    """Answer ``200 Connection established`` and flush it; the body never follows."""
    response = web.StreamResponse(status=200, reason=TUNNEL_ESTABLISHED)
    response.content_length = 0  # nothing follows the head but the tunnel itself
    await response.prepare(request)


def release(request: web.Request) -> None:
    """Drop the original handler's connection: its transport went to the tunnel."""
    request.protocol.connection_lost(None)


async def serve_inspected(
    request: web.Request,
    server: web.Server,
    context: ssl.SSLContext,
    handshake_timeout: float,
) -> bool:
    """Upgrade the agent's connection to TLS and serve it with a fresh request handler until
    it closes. The caller sets the tunnel's context variable first: the handler's tasks are
    created here and inherit it. False when the handshake failed (e.g. an agent that does
    not trust opgate's CA)."""
    loop = asyncio.get_running_loop()
    transport = request.transport
    if transport is None:
        return False
    closed: asyncio.Future[None] = loop.create_future()
    handover = _Handover(closed)
    try:
        tls = await loop.start_tls(
            transport,
            handover,
            context,
            server_side=True,
            ssl_handshake_timeout=handshake_timeout,
        )
    except (OSError, ssl.SSLError, TimeoutError, ConnectionError):
        transport.close()
        return False
    if tls is None:
        return False
    handover.attach(server(), tls)
    await closed
    return True


class _Pipe(asyncio.Protocol):
    """One side of an opaque tunnel: what it receives is written to its peer, and counted."""

    def __init__(self, closed: asyncio.Future[None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: asyncio.Transport | None = None
        self.received = 0
        self._closed = closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream's transport: read and written. Not checked by isinstance: uvloop's
        # transports have asyncio.Transport's methods without being its subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.peer is not None:
            self.peer.write(data)

    def eof_received(self) -> bool | None:
        # No half-close: the first side to finish ends the tunnel.
        if self.peer is not None:
            self.peer.close()
        return None

    def pause_writing(self) -> None:  # our side's buffer is full: stop reading the peer
        if self.peer is not None:
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()
        if not self._closed.done():
            self._closed.set_result(None)


async def open_pass_through(
    address: str, port: int, connect_timeout: float
) -> tuple[asyncio.Transport, _Pipe, asyncio.Future[None]]:
    """Connect to the checked address (never the name again: it was resolved and checked)."""
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    async with asyncio.timeout(connect_timeout):
        transport, protocol = await loop.create_connection(lambda: _Pipe(closed), address, port)
    return transport, protocol, closed


async def serve_pass_through(
    request: web.Request,
    upstream: asyncio.Transport,
    upstream_side: _Pipe,
    closed: asyncio.Future[None],
    record: AuditRecord,
) -> None:
    """Copy bytes both ways until either side closes; count them into the audit record."""
    agent_transport = request.transport
    agent_side = _Pipe(closed)
    try:
        if agent_transport is None or agent_transport.is_closing():
            return
        agent_side.connection_made(agent_transport)
        agent_side.peer, upstream_side.peer = upstream, agent_transport
        agent_transport.set_protocol(agent_side)
        agent_transport.resume_reading()
        await closed
    finally:
        upstream.close()
        if agent_transport is not None:
            agent_transport.close()
        record.bytes_from_agent = agent_side.received
        record.bytes_to_agent = upstream_side.received
