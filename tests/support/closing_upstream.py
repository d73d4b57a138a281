"""A provider that reads a request in full and then closes the connection without answering.

This is how a keep-alive connection breaks in the field (a provider restarting, a load
balancer reaping a connection it has just read from), and it is the case in which an HTTP
client may be tempted to re-send on a new connection, because it cannot tell "read" from
"never arrived". A client that promises one send per claim must not.

It is a plain asyncio server on 127.0.0.1 port 0 with its own minimal HTTP/1.1 reading, so
the ground truth does not depend on the HTTP library under test. Every request whose head and
body it read completely is recorded in ``requests`` (with the number of the connection it came
on), in order. Request number ``drop_at`` (1-based; the second by default, so that the first
leaves a pooled keep-alive connection behind) is recorded and then its connection is closed
without a byte of answer. With ``stop_listening``, the listening socket is closed first, so a
re-send's connect is refused. Every other request is answered ``200`` with a small JSON
object, keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from multidict import CIMultiDict

from proxy.gate import upstream
from proxy.gate.upstream import OutboundRequest

__all__ = [
    "ClosingUpstream",
    "ReadRequest",
    "closing_upstream",
    "outbound",
    "send_twice_on_one_connection",
]

_HEAD_LIMIT = 64 * 1024


@dataclass(frozen=True)
class ReadRequest:
    """One request the upstream read completely, before it answered or dropped it."""

    connection: int  # the number of the TCP connection it arrived on, from 1
    method: str
    target: str
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes


@dataclass
class ClosingUpstream:
    """The upstream's controls and ground truth; :func:`closing_upstream` serves it."""

    drop_at: int = 2
    stop_listening: bool = False
    url: str = ""
    requests: list[ReadRequest] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _connections: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def methods(self) -> list[str]:
        return [r.method for r in self.requests]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        connection = next(self._connections)
        try:
            while (request := await _read_request(reader, connection)) is not None:
                self.requests.append(request)
                if len(self.requests) == self.drop_at:
                    if self.stop_listening and self._server is not None:
                        self._server.close()  # closes the listening socket; connections stay
                    return  # the finally closes this connection, unanswered
                writer.write(_answer(len(self.requests)))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away mid-request: nothing complete to record
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._writers.discard(writer)
            self._handlers.discard(task)


async def _read_request(reader: asyncio.StreamReader, connection: int) -> ReadRequest | None:
    """The next complete request on the connection, or None at a clean end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial == b"":
            return None
        raise
    if len(head) > _HEAD_LIMIT:
        raise ConnectionError("request head too large")
    request_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, _version = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return ReadRequest(connection, method, target, headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer lines, then the end
                pass
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)  # the CRLF after each chunk


def _answer(number: int) -> bytes:
    body = json.dumps({"id": f"obj_{number}", "object": "item"}).encode()
    head = (
        "HTTP/1.1 200 OK\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\n"
        "\r\n"
    )
    return head.encode() + body


@contextlib.asynccontextmanager
async def closing_upstream(
    *, drop_at: int = 2, stop_listening: bool = False
) -> AsyncIterator[ClosingUpstream]:
    """Serve a :class:`ClosingUpstream` on 127.0.0.1 port 0 for the block, then stop it and
    every connection it still holds."""
    provider = ClosingUpstream(drop_at=drop_at, stop_listening=stop_listening)
    server = await asyncio.start_server(provider._serve, "127.0.0.1", 0)
    provider._server = server
    port = server.sockets[0].getsockname()[1]
    provider.url = f"http://127.0.0.1:{port}"
    try:
        yield provider
    finally:
        server.close()
        for writer in list(provider._writers):
            writer.close()
        if provider._handlers:
            await asyncio.gather(*provider._handlers, return_exceptions=True)
        await server.wait_closed()


def outbound(method: str, url: str) -> OutboundRequest:
    """A small request of ``method`` to ``url`` (a JSON body, none for DELETE)."""
    body = b"" if method == "DELETE" else b'{"name":"x"}'
    headers = CIMultiDict({"Content-Type": "application/json"} if body else {})
    return OutboundRequest(
        method=method,
        url=url,
        headers=headers,
        body=body,
        connect_timeout=2.0,
        total_timeout=5.0,
        max_response_bytes=1 << 20,
    )


async def send_twice_on_one_connection(
    session: aiohttp.ClientSession, method: str, url: str
) -> BaseException | None:
    """The first request leaves a pooled keep-alive connection; the second is read by the
    upstream and dropped. Returns what the second send raised (None if it returned)."""
    first = await upstream.send(session, outbound(method, f"{url}/v1/items/first"))
    assert first.status == 200
    try:
        await upstream.send(session, outbound(method, f"{url}/v1/items/second"))
    except Exception as exc:
        return exc
    return None
