"""The one outbound HTTP exchange with a provider, translated into opgate's own errors.

Sends exactly the bytes and headers it is given: no automatic headers, no decompression, no
redirects, no retries (a retry is a new attempt, and only the pipeline may start one).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.errors import UpstreamDropped, UpstreamNotSent, UpstreamTimeout, UpstreamTruncated


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


def new_client_session(
    trace_configs: list[aiohttp.TraceConfig] | None = None,
) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        trace_configs=trace_configs,  # tracing and latency metrics (proxy/observe/telemetry.py)
        auto_decompress=False,
        # The agent's environment (HTTP_PROXY...) must not route opgate's own egress.
        trust_env=False,
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def send(session: aiohttp.ClientSession, outbound: OutboundRequest) -> UpstreamResponse:
    timeout = aiohttp.ClientTimeout(
        total=outbound.total_timeout, sock_connect=outbound.connect_timeout
    )
    try:
        async with session.request(
            outbound.method,
            outbound.url,
            headers=outbound.headers,
            data=outbound.body if outbound.body or outbound.method not in ("GET", "HEAD") else None,
            timeout=timeout,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        ) as response:
            body = await _read_bounded(response, outbound.max_response_bytes)
            return UpstreamResponse(response.status, response.reason or "", response.headers, body)
    except aiohttp.ClientConnectorError as exc:
        # Raised only while opening a new connection: the request never left.
        raise UpstreamNotSent(str(exc)) from exc
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise UpstreamTimeout(f"no complete answer within {outbound.total_timeout}s") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamDropped(f"{type(exc).__name__}: {exc}") from exc


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise UpstreamTruncated(f"the answer is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
