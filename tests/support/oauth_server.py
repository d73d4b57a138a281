"""A small OAuth 2.1 authorization server for the MCP endpoint's tests: a real aiohttp app on
127.0.0.1 port 0 that signs access tokens (RS256 or ES256, with pyjwt and cryptography) and
serves its keys as a JWKS, with RFC 8414 metadata.

``POST /token`` takes the client credentials grant: ``client_id`` is the token's subject,
``resource`` (RFC 8707) its audience, ``scope`` its scopes. A test-only ``expires_in`` (which
may be negative) makes expired tokens. ``rotate()`` signs with a new key id from then on and
publishes only the new key, as a rotation does.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


def _new_key(algorithm: str) -> Any:
    if algorithm == "RS256":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


@dataclass
class AuthorizationServer:
    algorithm: str = "RS256"
    url: str = ""
    key: Any = None
    kid: str = ""
    jwks_fetches: int = 0
    clients: dict[str, str] = field(default_factory=dict)  # client_id -> client_secret
    issued: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rotate()

    def rotate(self) -> None:
        self.key, self.kid = _new_key(self.algorithm), secrets.token_hex(8)

    @property
    def issuer(self) -> str:
        return self.url

    def jwks(self) -> dict[str, Any]:
        encoder = RSAAlgorithm if self.algorithm == "RS256" else ECAlgorithm
        public = encoder.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**public, "kid": self.kid, "alg": self.algorithm, "use": "sig"}]}

    def token(
        self, subject: str, resource: str, scope: str, expires_in: int = 300, **claims: Any
    ) -> str:
        now = int(time.time())
        body = {
            "iss": self.issuer,
            "sub": subject,
            "aud": resource,
            "scope": scope,
            "iat": now,
            "exp": now + expires_in,
            "client_id": subject,
            **claims,
        }
        self.issued.append(body)
        return jwt.encode(body, self.key, algorithm=self.algorithm, headers={"kid": self.kid})

    def signed(self, payload: bytes, **header: Any) -> str:
        """A compact JWS over ``payload`` exactly as given (any member order, a name given
        twice, any claim left out), signed with the current key, as an issuer that chose
        those bytes would sign them."""
        return jwt.api_jws.PyJWS().encode(
            payload, self.key, algorithm=self.algorithm, headers={"kid": self.kid, **header}
        )

    async def _metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token",
                "jwks_uri": f"{self.url}/jwks.json",
                "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                "code_challenge_methods_supported": ["S256"],
            }
        )

    async def _jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        return web.json_response(self.jwks())

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        client_id = str(form.get("client_id", ""))
        if request.headers.get("Authorization", "").startswith("Basic "):
            # client_secret_basic (RFC 6749 2.3.1): the id and secret, form-encoded, in Basic
            decoded = base64.b64decode(request.headers["Authorization"][6:]).decode()
            client_id, _, secret = decoded.partition(":")
            client_id, secret = unquote(client_id), unquote(secret)
            if self.clients.get(client_id) != secret:
                return web.json_response({"error": "invalid_client"}, status=401)
        token = self.token(
            client_id,
            str(form["resource"]),
            str(form.get("scope", "")),
            int(str(form.get("expires_in", "300"))),
        )
        return web.json_response({"access_token": token, "token_type": "Bearer"})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/.well-known/oauth-authorization-server", self._metadata)
        app.router.add_get("/jwks.json", self._jwks)
        app.router.add_post("/token", self._token)
        return app


@contextlib.asynccontextmanager
async def authorization_server(algorithm: str = "RS256") -> AsyncIterator[AuthorizationServer]:
    server = AuthorizationServer(algorithm)
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


async def issued_token(server: AuthorizationServer, **form: str) -> str:
    """A token through the server's own token endpoint (client credentials, RFC 8707)."""
    async with (
        aiohttp.ClientSession(trust_env=False) as http,
        http.post(
            f"{server.url}/token", data={"grant_type": "client_credentials", **form}
        ) as response,
    ):
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        token: str = answer["access_token"]
        return token
