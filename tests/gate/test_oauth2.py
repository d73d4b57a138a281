"""OAuth2 client credentials (proxy/gate/oauth2.py, credentials.py) against a real token
endpoint on loopback: one fetch for many concurrent requests, cached until shortly before
expiry, refreshed after, and every failure fails closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from proxy.gate.credentials import CredentialSource, CredentialUnavailable
from proxy.gate.oauth2 import TokenCache, TokenUnavailable, read_token_answer
from proxy.policy.model import OAuth2ClientCredentials
from tests.support.token_endpoint import TokenEndpoint, running_token_endpoint


@pytest_asyncio.fixture(loop_scope="session")
async def endpoint() -> AsyncIterator[TokenEndpoint]:
    async with running_token_endpoint() as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


def credential(endpoint: TokenEndpoint, **extra: object) -> OAuth2ClientCredentials:
    return OAuth2ClientCredentials.model_validate(
        {
            "kind": "oauth2_client_credentials",
            "token_url": endpoint.url,
            "client_id": endpoint.client_id,
            "secret": "pp_secret",
            **extra,
        }
    )


CLIENT_SECRET = TokenEndpoint.client_secret


def source(secret: str | None = CLIENT_SECRET) -> CredentialSource:
    return CredentialSource(None, {"OPGATE_SECRET_PP_SECRET": secret} if secret else {})


async def test_twenty_concurrent_requests_fetch_one_token(
    endpoint: TokenEndpoint, session: aiohttp.ClientSession
) -> None:
    """Twenty requests that find no token while the first fetch is in flight share it."""
    creds, cache = credential(endpoint), source()
    endpoint.hold()
    waiting = [asyncio.ensure_future(cache.resolve(creds, session)) for _ in range(20)]
    await asyncio.wait_for(endpoint.arrived.wait(), 5)
    endpoint.release()
    values = await asyncio.gather(*waiting)
    assert endpoint.requests == 1
    assert set(values) == {"Bearer tok_1"}


async def test_the_token_is_cached_until_shortly_before_expiry(
    endpoint: TokenEndpoint, session: aiohttp.ClientSession
) -> None:
    """A token is reused while fresh, and fetched anew once within refresh_before_seconds of
    its expiry."""
    now = [1000.0]
    cache = TokenCache(clock=lambda: now[0])
    endpoint.expires_in = 300
    creds = credential(endpoint, refresh_before_seconds=60)
    assert await cache.token(creds, "client-1", "secret-1", session) == "tok_1"
    now[0] += 239
    assert await cache.token(creds, "client-1", "secret-1", session) == "tok_1"
    now[0] += 1  # 240 s: 60 s before the 300 s expiry
    assert await cache.token(creds, "client-1", "secret-1", session) == "tok_2"
    assert endpoint.requests == 2


async def test_a_rotated_secret_fetches_a_new_token(
    endpoint: TokenEndpoint, session: aiohttp.ClientSession
) -> None:
    """The cache is keyed by the client secret too: a rotated secret is used at once."""
    cache = TokenCache()
    creds = credential(endpoint)
    assert await cache.token(creds, "client-1", "secret-1", session) == "tok_1"
    with pytest.raises(TokenUnavailable, match="answered 401"):
        await cache.token(creds, "client-1", "rotated", session)
    assert endpoint.requests == 2


@pytest.mark.parametrize("status", [400, 500, 503])
async def test_a_failing_token_endpoint_fails_closed_for_every_waiter(
    endpoint: TokenEndpoint, session: aiohttp.ClientSession, status: int
) -> None:
    """A token endpoint error makes every concurrent request fail (one fetch, no retry storm),
    and the next request tries again."""
    endpoint.fail_with, cache, creds = status, source(), credential(endpoint)
    endpoint.hold()
    waiting = [asyncio.ensure_future(cache.resolve(creds, session)) for _ in range(5)]
    await asyncio.wait_for(endpoint.arrived.wait(), 5)
    endpoint.release()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, CredentialUnavailable) for r in results), results
    assert endpoint.requests == 1
    endpoint.fail_with = None
    assert await cache.resolve(creds, session) == "Bearer tok_1"


async def test_an_unreachable_token_endpoint_fails_closed(session: aiohttp.ClientSession) -> None:
    """No answer from the token endpoint is CredentialUnavailable, never an unauthenticated send."""
    creds = OAuth2ClientCredentials.model_validate(
        {
            "kind": "oauth2_client_credentials",
            "token_url": "http://127.0.0.1:9/v1/oauth2/token",
            "client_id": "c",
            "secret": "pp_secret",
        }
    )
    with pytest.raises(CredentialUnavailable, match="did not answer"):
        await source().resolve(creds, session)


async def test_a_missing_client_secret_fails_closed(
    endpoint: TokenEndpoint, session: aiohttp.ClientSession
) -> None:
    """Without the configured client secret nothing is fetched and nothing may be sent."""
    with pytest.raises(CredentialUnavailable, match="not configured"):
        await source(None).resolve(credential(endpoint), session)
    assert endpoint.requests == 0


async def test_the_scope_is_asked_for(
    endpoint: TokenEndpoint, session: aiohttp.ClientSession
) -> None:
    """A declared scope travels in the token request."""
    await source().resolve(credential(endpoint, scope="payments"), session)
    assert endpoint.scopes == ["payments"]


@pytest.mark.parametrize(
    "answer",
    [
        b"not json",
        b"[]",
        b'{"token_type": "Bearer", "expires_in": 60}',
        b'{"access_token": "", "expires_in": 60}',
        b'{"access_token": "a b", "expires_in": 60}',
        b'{"access_token": "t", "token_type": "mac", "expires_in": 60}',
        b'{"access_token": "t", "expires_in": "60"}',
        b'{"access_token": "t", "expires_in": -1}',
        b'{"access_token": "t\\u0000", "expires_in": 60}',
    ],
)
def test_a_token_answer_is_read_strictly(answer: bytes) -> None:
    """Anything but a printable bearer token with a numeric lifetime is refused."""
    with pytest.raises(TokenUnavailable):
        read_token_answer(answer)
