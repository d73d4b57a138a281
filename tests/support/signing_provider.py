"""A provider that accepts only requests signed by an agent it knows (RFC 9421, as Visa's
Trusted Agent Protocol and Web Bot Auth verify them): a real aiohttp server on 127.0.0.1, port
0, checking every request with ``http-message-signatures``' own verifier, not opgate's code."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from http_message_signatures import HTTPMessageVerifier, algorithms
from http_message_signatures.exceptions import HTTPMessageSignaturesException
from http_message_signatures.resolvers import MappingKeyResolver
from joserfc.jwk import OKPKey

REQUIRED_COMPONENTS = ("@authority", "@path", "content-digest")
# Web Bot Auth's key directory (draft-meunier-webbotauth-httpsig-directory): where, as what,
# and what its response signatures cover and are tagged
DIRECTORY_PATH = "/.well-known/http-message-signatures-directory"
DIRECTORY_MEDIA_TYPE = "application/http-message-signatures-directory+json"
DIRECTORY_TAG = "http-message-signatures-directory"
DIRECTORY_COMPONENTS = ('"@authority";req', "content-digest")


@dataclass
class _Message:
    method: str
    url: str
    headers: Any


@dataclass
class _Response:
    status_code: int
    headers: Any
    request: _Message


async def resolve_directory(
    http: aiohttp.ClientSession, origin: str
) -> dict[str, Ed25519PublicKey]:
    """The keys an agent's key directory publishes, as a verifier takes them: served as the
    draft's media type, each key's ``kid`` its RFC 7638 thumbprint, and only keys whose own
    signature over the response (``@authority`` of this request, ``content-digest``, the
    directory's tag) the library verifies; a key without one is ignored, as the draft says."""
    url = origin + DIRECTORY_PATH
    async with http.get(url, headers={"Accept": DIRECTORY_MEDIA_TYPE}) as response:
        body = await response.read()
        assert response.status == 200, body
        assert response.headers["Content-Type"].split(";")[0] == DIRECTORY_MEDIA_TYPE
        headers = response.headers
    offered: dict[str, Ed25519PublicKey] = {}
    for jwk in json.loads(body)["keys"]:
        key = OKPKey.import_key(jwk)
        assert jwk["crv"] == "Ed25519"
        assert jwk["kid"] == key.thumbprint()
        public = key.public_key
        assert isinstance(public, Ed25519PublicKey)
        offered[jwk["kid"]] = public
    verifier = HTTPMessageVerifier(
        signature_algorithm=algorithms.ED25519,
        key_resolver=MappingKeyResolver(public_keys=offered, private_keys={}),
    )
    message = _Response(200, headers, _Message("GET", url, {}))
    results = verifier.verify(
        message, expect_tag=DIRECTORY_TAG, require_components=DIRECTORY_COMPONENTS, body=body
    )
    signed = {result.parameters["keyid"] for result in results}
    return {kid: key for kid, key in offered.items() if kid in signed}


@dataclass
class SigningProvider:
    """Verified requests (their signed parameters and components) and refused ones."""

    url: str
    tag: str
    keys: dict[str, Ed25519PublicKey]
    verified: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    # the Signature-Agent header of each verified request, as received (Web Bot Auth)
    signature_agents: list[str] = field(default_factory=list)

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
        self.signature_agents += request.headers.getall("Signature-Agent", [])
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
