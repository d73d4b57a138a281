"""The one outbound HTTP exchange with a provider, translated into opgate's own errors.

Sends exactly the bytes and headers it is given: no automatic headers, no decompression, no
redirects, no retries (a retry is a new attempt, and only the pipeline may start one).

Every HTTP client session opgate sends with (to providers in both modes, for reconciliation
lookups, to the escalation webhook) is made by :func:`new_client_session`, so none can be made
without aiohttp's own re-send turned off.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import yarl
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.errors import (
    ConfigurationError,
    UpstreamDropped,
    UpstreamNotSent,
    UpstreamTimeout,
    UpstreamTruncated,
)
from proxy.observe.telemetry import UpstreamCall


@dataclass(frozen=True)
class OutboundRequest:
    method: str
    url: str
    headers: CIMultiDict[str]
    body: bytes
    connect_timeout: float
    total_timeout: float
    max_response_bytes: int


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    reason: str
    headers: CIMultiDictProxy[str]
    body: bytes


def new_client_session(*, connector: aiohttp.BaseConnector | None = None) -> aiohttp.ClientSession:
    """An egress session that sends each request at most once. ``connector`` replaces the
    default one (forward mode brings its own TLS context and checked resolver)."""
    session = aiohttp.ClientSession(
        auto_decompress=False,
        # The agent's environment (HTTP_PROXY...) must not route opgate's own egress.
        trust_env=False,
        connector=connector or aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    # aiohttp re-sends a request of an idempotent method (GET, HEAD, OPTIONS, TRACE, PUT,
    # DELETE; RFC 9112 section 9.3.1) once on a new connection when the pooled keep-alive
    # connection it was written to breaks before an answer. The provider may have read it: that
    # is a second send under one claim, and if the re-send's connect then fails, aiohttp raises
    # a connect error, which would read as "nothing was sent". The session's private
    # ``_retry_connection`` is the only switch aiohttp has (3.14); an aiohttp without it may
    # re-send in some other way, so it is refused rather than trusted.
    if not isinstance(getattr(session, "_retry_connection", None), bool):
        session.detach()  # nothing was opened yet; marks the session closed without a warning
        raise ConfigurationError(
            f"aiohttp {aiohttp.__version__} has no ClientSession._retry_connection: opgate "
            "cannot turn off its automatic re-send of PUT/DELETE and refuses to send with it"
        )
    session._retry_connection = False
    return session


async def send(session: aiohttp.ClientSession, outbound: OutboundRequest) -> UpstreamResponse:
    timeout = aiohttp.ClientTimeout(
        total=outbound.total_timeout, sock_connect=outbound.connect_timeout
    )
    url = yarl.URL(outbound.url)  # as aiohttp makes it of the string, made once for both
    call = UpstreamCall(session, url)  # its latency and traceparent (observe/telemetry.py)
    try:
        async with session.request(
            outbound.method,
            url,
            headers=call.headers(outbound.headers),
            data=outbound.body if outbound.body or outbound.method not in ("GET", "HEAD") else None,
            timeout=timeout,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        ) as response:
            call.answered()
            body = await _read_bounded(response, outbound.max_response_bytes)
            return UpstreamResponse(response.status, response.reason or "", response.headers, body)
    except aiohttp.ClientConnectorError as exc:
        # Raised only by the connector while it opens this request's connection (TCP, TLS,
        # DNS), before a byte of the request is written. It is this request's first and only
        # connection: the session never re-sends (new_client_session) and redirects are not
        # followed. Everything raised once a connection was handed out (a reset or a close
        # while writing or reading, a bad or cut answer) is one of the errors below: the
        # request may have left, so the outcome is unknown. (A connect timeout is below too,
        # as a timeout: on the safe side.)
        raise UpstreamNotSent(str(exc)) from exc
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise UpstreamTimeout(f"no complete answer within {outbound.total_timeout}s") from exc
    except (aiohttp.ClientError, OSError) as exc:
        # aiohttp's text can quote what the upstream sent (a header line it could not parse):
        # the agent is told which failure, never those bytes (they stay on the chained cause)
        raise UpstreamDropped(
            f"the connection ended without a complete answer ({type(exc).__name__})"
        ) from exc
    finally:
        call.ended()


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise UpstreamTruncated(f"the answer is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
