"""A connection accepted just as the drain began is closed at once (proxy/gate/shutdown.py):
aiohttp's handler of a real connection over a socket pair, closed the way ``pre_shutdown``
closes it, between the connection's arrival and its handler task's first turn."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest_asyncio
from aiohttp import web

from proxy.admin.access import admin_malformed_answer
from proxy.gate.framing import ProblemAppRunner


async def ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest_asyncio.fixture
async def runner() -> AsyncIterator[ProblemAppRunner]:
    app = web.Application()
    app.router.add_get("/", ok)
    made = ProblemAppRunner(app, answer=admin_malformed_answer)
    await made.setup()
    yield made
    await made.cleanup()


async def connect(runner: ProblemAppRunner, *, closed_at_once: bool) -> socket.socket:
    """A client socket whose server side is one of ``runner``'s connections; with
    ``closed_at_once``, marked closing right as it is made (before its task first runs)."""
    client, server_side = socket.socketpair()
    client.setblocking(False)
    server = runner.server
    assert server is not None
    handler = server()
    if closed_at_once:
        made = handler.connection_made

        def made_then_closed(transport: asyncio.BaseTransport) -> None:
            made(transport)
            handler.close()  # what pre_shutdown does to every connection it has

        handler.connection_made = made_then_closed  # type: ignore[method-assign]
    await asyncio.get_running_loop().connect_accepted_socket(lambda: handler, server_side)
    return client


async def answer(client: socket.socket) -> bytes | None:
    """What the server answers a request on ``client`` (None: the connection was reset)."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    received = b""
    try:
        while chunk := await asyncio.wait_for(loop.sock_recv(client, 4096), 5):
            received += chunk
    except ConnectionResetError:  # closed with the request unread
        return None
    return received


async def test_a_connection_closed_before_its_first_turn_is_closed_at_once(
    runner: ProblemAppRunner,
) -> None:
    """Without the fix its request is never read, and nothing ends the wait but the drain
    deadline: here, the 5 s bound of ``answer``."""
    client = await connect(runner, closed_at_once=True)
    try:
        assert await answer(client) in (b"", None)  # closed: nothing answered, nothing decided
    finally:
        client.close()


async def test_a_connection_not_draining_is_served(runner: ProblemAppRunner) -> None:
    client = await connect(runner, closed_at_once=False)
    try:
        received = await answer(client)
    finally:
        client.close()
    assert received is not None
    assert received.startswith(b"HTTP/1.1 200 OK")
    assert received.endswith(b"ok")
