"""An OAuth 2.0 token endpoint (RFC 6749 4.4, client credentials) on 127.0.0.1 port 0.

It checks the client's Basic credentials and grant type, issues ``tok_<n>`` tokens with the
lifetime the test sets, counts every token request (``requests``), can hold its answers until
released (``hold()`` / ``release()``: requests that arrive meanwhile are seen as concurrent), and
can fail with a chosen status (``fail_with``).
"""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from aiohttp import web


@dataclass
class TokenEndpoint:
    client_id: str = "client-1"
    client_secret: str = "secret-1"
    expires_in: float = 3600
    fail_with: int | None = None
    url: str = ""
    requests: int = 0
    issued: list[str] = field(default_factory=list)
    scopes: list[str | None] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _gate: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._gate.set()

    def hold(self) -> None:
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.arrived.set()
        await self._gate.wait()
        form = parse_qs((await request.read()).decode())
        expected = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        if request.headers.get("Authorization") != f"Basic {expected}":
            return web.json_response({"error": "invalid_client"}, status=401)
        if form.get("grant_type") != ["client_credentials"]:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        if self.fail_with is not None:
            return web.json_response({"error": "server_error"}, status=self.fail_with)
        token = f"tok_{len(self.issued) + 1}"
        self.issued.append(token)
        self.scopes.append(form.get("scope", [None])[0])
        return web.json_response(
            {"access_token": token, "token_type": "Bearer", "expires_in": self.expires_in}
        )


def add_token_route(app: web.Application, endpoint: TokenEndpoint, path: str) -> None:
    app.router.add_post(path, endpoint.handle)


@asynccontextmanager
async def running_token_endpoint(path: str = "/v1/oauth2/token") -> AsyncIterator[TokenEndpoint]:
    endpoint = TokenEndpoint()
    app = web.Application()
    add_token_route(app, endpoint, path)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        endpoint.url = f"http://127.0.0.1:{sock.getsockname()[1]}{path}"
        yield endpoint
    finally:
        endpoint.release()
        await runner.cleanup()
        sock.close()
