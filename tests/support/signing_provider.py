"""A provider that accepts only requests signed by an agent it knows (RFC 9421, as Visa's
Trusted Agent Protocol and Web Bot Auth verify them): a real aiohttp server on 127.0.0.1, port
0, checking every request with ``http-message-signatures``' own verifier, not opgate's code."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from http_message_signatures import HTTPMessageVerifier, algorithms
from http_message_signatures.exceptions import HTTPMessageSignaturesException
from http_message_signatures.resolvers import MappingKeyResolver

REQUIRED_COMPONENTS = ("@authority", "@path", "content-digest")


@dataclass
class _Message:
    method: str
    url: str
    headers: Any


@dataclass
class SigningProvider:
    """Verified requests (their signed parameters and components) and refused ones."""

    url: str
    tag: str
    keys: dict[str, Ed25519PublicKey]
    verified: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        verifier = HTTPMessageVerifier(
            signature_algorithm=algorithms.ED25519,
            key_resolver=MappingKeyResolver(public_keys=self.keys, private_keys={}),
        )
        message = _Message(request.method, str(request.url), request.headers)
        try:
            [result] = verifier.verify(
                message, expect_tag=self.tag, require_components=REQUIRED_COMPONENTS, body=body
            )
        except (HTTPMessageSignaturesException, ValueError) as exc:
            self.refused.append(f"{type(exc).__name__}: {exc}")
            return web.json_response({"error": "unsigned"}, status=401)
        self.verified.append(
            {
                "parameters": dict(result.parameters),
                "components": list(result.covered_components),
                "body": result.body,
            }
        )
        return web.json_response({"id": f"re_{len(self.verified)}"})


@contextlib.asynccontextmanager
async def running_signing_provider(
    tag: str, keys: dict[str, Ed25519PublicKey]
) -> AsyncIterator[SigningProvider]:
    provider = SigningProvider("", tag, keys)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", provider.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    provider.url = f"http://127.0.0.1:{_port(runner)}"
    try:
        yield provider
    finally:
        await runner.cleanup()


def _port(runner: web.AppRunner) -> int:
    [site] = runner.sites
    assert isinstance(site, web.TCPSite)
    server = site._server  # aiohttp keeps the listening socket here; port 0 was asked for
    assert server is not None
    port: int = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    return port
