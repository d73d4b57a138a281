"""The egress client against real upstreams on loopback: one claim leaves at most once, and
"nothing was sent" is said only when the request's connection never opened."""

from __future__ import annotations

import ast
import asyncio
import socket
from pathlib import Path

import aiohttp
import pytest

from proxy.errors import ConfigurationError, UpstreamDropped, UpstreamNotSent
from proxy.gate import upstream
from proxy.gate.upstream import new_client_session
from tests.support.closing_upstream import closing_upstream, outbound, send_twice_on_one_connection
from tests.support.paths import REPO

METHODS = ["PUT", "DELETE", "PATCH", "POST"]


@pytest.mark.parametrize("stop_listening", [False, True], ids=["listening", "stops-listening"])
@pytest.mark.parametrize("method", METHODS)
async def test_a_request_read_then_dropped_is_sent_once_and_unknown(
    method: str, stop_listening: bool
) -> None:
    """A request the upstream read before closing its pooled connection is never re-sent on
    a new connection, and its outcome is unknown (dropped), never "not sent"."""
    async with closing_upstream(stop_listening=stop_listening) as provider:
        session = new_client_session()
        try:
            error = await send_twice_on_one_connection(session, method, provider.url)
        finally:
            await session.close()
    targets = [r.target for r in provider.requests]
    assert targets == ["/v1/items/first", "/v1/items/second"], "the dropped request was re-sent"
    # the second request really travelled on the pooled connection the first one left
    assert provider.requests[0].connection == provider.requests[1].connection
    assert isinstance(error, UpstreamDropped), repr(error)
    assert not isinstance(error, UpstreamNotSent)


async def test_a_refused_connection_is_not_sent() -> None:
    """A connection that never opened is the one case reported as "nothing was sent"."""
    bound = socket.socket()
    bound.bind(("127.0.0.1", 0))  # bound, never listening: the connect is refused
    session = new_client_session()
    try:
        port = bound.getsockname()[1]
        with pytest.raises(UpstreamNotSent):
            await upstream.send(session, outbound("PUT", f"http://127.0.0.1:{port}/v1/items/x"))
    finally:
        await session.close()
        bound.close()


async def test_an_aiohttp_without_the_resend_switch_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If aiohttp stops having the switch that turns its re-send off, making an egress
    session fails loudly instead of quietly sending twice."""
    original = aiohttp.ClientSession.__init__

    def without_switch(self: aiohttp.ClientSession, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        del self._retry_connection

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", without_switch)
    with pytest.raises(ConfigurationError, match="re-send"):
        new_client_session()


# Sessions that never carry an agent's request, made for opgate's own reads and submissions:
# the MCP endpoint's JWKS fetches (a GET: a hidden re-send is harmless) and the audit log's
# checkpoints sent to witnesses (a POST: aiohttp never re-sends one). Both ignore HTTP_PROXY.
OWN_SESSIONS = {"proxy/mcp/endpoint.py", "proxy/observe/auditlog/witnesses.py"}


def test_every_egress_session_is_made_by_new_client_session() -> None:
    """No module of opgate builds an aiohttp ClientSession for egress itself: each one comes
    from new_client_session, which turns the hidden re-send off; opgate's own sessions (above)
    are the only others, and they do not trust the environment."""
    makers: list[str] = []
    for path in sorted((REPO / "proxy").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and _names_client_session(node.func):
                where = str(path.relative_to(REPO))
                if where in OWN_SESSIONS:
                    assert any(
                        k.arg == "trust_env" and getattr(k.value, "value", None) is False
                        for k in node.keywords
                    ), where
                    continue
                makers.append(f"{where}:{node.lineno}")
    assert len(makers) == 1, makers
    assert makers[0].startswith(str(Path("proxy/gate/upstream.py")))


def _names_client_session(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "ClientSession"
    return isinstance(func, ast.Name) and func.id == "ClientSession"


async def test_an_unreadable_answer_is_unknown_and_its_bytes_are_not_repeated() -> None:
    """An answer aiohttp cannot parse (here a header past its 8190-byte line limit) leaves the
    outcome unknown, and the error opgate tells the agent names the failure without repeating
    a byte of what the upstream sent."""
    marker = "UPSTREAM-BYTES-" * 700  # one header line of about 10 KB

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = f"HTTP/1.1 402 Payment Required\r\nPayment-Required: {marker}\r\n"
        writer.write(head.encode() + b"Content-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    session = new_client_session()
    try:
        with pytest.raises(UpstreamDropped) as raised:
            await upstream.send(session, outbound("POST", f"http://127.0.0.1:{port}/v1/pay"))
    finally:
        await session.close()
        server.close()
        await server.wait_closed()
    told = str(raised.value)
    assert "UPSTREAM-BYTES" not in told, told[:200]
    assert len(told) < 200, told[:200]
