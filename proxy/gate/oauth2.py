"""OAuth 2.0 client credentials (RFC 6749 section 4.4): the access tokens opgate sends to a
provider that authenticates that way (PayPal).

One token per credential (token endpoint, client id, scope, client secret), cached until
``refresh_before_seconds`` before it expires. Concurrent requests that find no fresh token share
one fetch: twenty requests at once cause one call to the token endpoint, and if that call fails
all twenty fail closed together (the next request tries again). A token never reaches an agent:
it only ever travels in the outbound request's header.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, urlencode

import aiohttp
import yarl
from multidict import CIMultiDict

from proxy.observe.telemetry import UpstreamCall
from proxy.policy.model import OAuth2ClientCredentials

# A token answer is a small JSON object; anything larger is not one.
_MAX_TOKEN_ANSWER_BYTES = 64 * 1024
_FETCH_TIMEOUT_SECONDS = 10.0


class TokenUnavailable(Exception):
    """No access token could be obtained: the request must not leave."""


@dataclass(frozen=True)
class AccessToken:
    value: str
    refresh_at: float  # monotonic seconds: from then on a new token is fetched


_Key = tuple[str, str, str | None, str]


def _key(credential: OAuth2ClientCredentials, client_id: str, client_secret: str) -> _Key:
    digest = hashlib.sha256(client_secret.encode("utf-8")).hexdigest()
    return (credential.token_url, client_id, credential.scope, digest)


class TokenCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens: dict[_Key, AccessToken] = {}
        self._fetching: dict[_Key, asyncio.Future[AccessToken]] = {}
        self.fetches = 0  # token endpoint calls made (for tests and metrics)

    async def token(
        self,
        credential: OAuth2ClientCredentials,
        client_id: str,
        client_secret: str,
        session: aiohttp.ClientSession,
    ) -> str:
        """A fresh access token; TokenUnavailable if the token endpoint gives none."""
        key = _key(credential, client_id, client_secret)
        cached = self._fresh(key)
        if cached is not None:
            return cached
        pending = self._fetching.get(key)
        if pending is None:
            fetching = self._fetch(key, credential, client_id, client_secret, session)
            pending = asyncio.ensure_future(fetching)
            self._fetching[key] = pending
        # shielded: one waiter giving up (its agent hung up) must not cancel the others' fetch
        return (await asyncio.shield(pending)).value

    def _fresh(self, key: _Key) -> str | None:
        cached = self._tokens.get(key)
        if cached is not None and self._clock() < cached.refresh_at:
            return cached.value
        return None

    async def _fetch(
        self,
        key: _Key,
        credential: OAuth2ClientCredentials,
        client_id: str,
        client_secret: str,
        session: aiohttp.ClientSession,
    ) -> AccessToken:
        try:
            self.fetches += 1
            started = self._clock()
            value, lifetime = await fetch_token(credential, client_id, client_secret, session)
            token = AccessToken(value, started + lifetime - credential.refresh_before_seconds)
            if token.refresh_at > self._clock():
                self._tokens[key] = token
            else:  # too short-lived to cache: used for the requests waiting on it, then dropped
                self._tokens.pop(key, None)
            return token
        finally:
            self._fetching.pop(key, None)


async def fetch_token(
    credential: OAuth2ClientCredentials,
    client_id: str,
    client_secret: str,
    session: aiohttp.ClientSession,
) -> tuple[str, float]:
    """(access token, lifetime in seconds) from the token endpoint; TokenUnavailable otherwise."""
    form = {"grant_type": "client_credentials"}
    if credential.scope:
        form["scope"] = credential.scope
    headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
    if credential.client_auth == "client_secret_basic":
        # RFC 6749 2.3.1: both are form-urlencoded before they are joined
        pair = f"{quote(client_id, safe='')}:{quote(client_secret, safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    else:
        form |= {"client_id": client_id, "client_secret": client_secret}
    url = yarl.URL(credential.token_url)
    call = UpstreamCall(session, url)  # timed and traced as a provider call (telemetry.py)
    try:
        async with session.post(
            url,
            data=urlencode(form),
            headers=call.headers(CIMultiDict(headers)),
            timeout=aiohttp.ClientTimeout(total=_FETCH_TIMEOUT_SECONDS),
            allow_redirects=False,
        ) as answer:
            call.answered()
            body = await answer.content.read(_MAX_TOKEN_ANSWER_BYTES + 1)
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise TokenUnavailable(f"the token endpoint did not answer: {type(exc).__name__}") from exc
    finally:
        call.ended()
    if status != 200:
        raise TokenUnavailable(f"the token endpoint answered {status}")
    return read_token_answer(body)


def read_token_answer(body: bytes) -> tuple[str, float]:
    """The token and its lifetime from an RFC 6749 5.1 answer, strictly. Pure."""
    if len(body) > _MAX_TOKEN_ANSWER_BYTES:
        raise TokenUnavailable("the token endpoint's answer is too large")
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenUnavailable("the token endpoint's answer is not JSON") from exc
    if not isinstance(answer, dict):
        raise TokenUnavailable("the token endpoint's answer is not an object")
    value = answer.get("access_token")
    if not isinstance(value, str) or not value or not (value.isascii() and value.isprintable()):
        raise TokenUnavailable("the token endpoint's answer holds no usable access_token")
    if " " in value:
        raise TokenUnavailable("the access token holds a space")
    token_type = answer.get("token_type", "Bearer")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise TokenUnavailable(f"token_type {token_type!r} is not a bearer token")
    lifetime = answer.get("expires_in", 0)
    if isinstance(lifetime, bool) or not isinstance(lifetime, int | float) or lifetime < 0:
        raise TokenUnavailable("expires_in is not a number of seconds")
    return value, float(lifetime)
