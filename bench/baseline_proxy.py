"""The baseline: a bare aiohttp forwarding proxy, the fair reference for "what does a Python
proxy cost" on this machine.

It does the least any aiohttp reverse proxy must do, and nothing opgate adds: read the agent's
body, send it with one shared ``ClientSession`` to the provider, read the answer, return it.
No policy, no database, no audit line. Its client session is configured like opgate's
(no decompression, no connection limit, no cookie jar, ``trust_env=False``), and it runs on the
same default asyncio loop, so the gap between this row and opgate's is opgate's own work.

Run as ``python bench/baseline_proxy.py --port PORT --upstream http://127.0.0.1:UPSTREAM``.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

CLIENT = web.AppKey("client", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)

# Headers the baseline passes on, both ways: enough for the fake provider to see a form body
# and for the load generator to see a JSON answer; hop-by-hop headers are never copied.
_REQUEST_HEADERS = ("Content-Type", "Authorization", "Idempotency-Key", "Accept")
_RESPONSE_HEADERS = ("Content-Type",)


async def forward(request: web.Request) -> web.Response:
    body = await request.read()
    headers = {name: request.headers[name] for name in _REQUEST_HEADERS if name in request.headers}
    url = request.app[UPSTREAM] + request.raw_path
    async with request.app[CLIENT].request(
        request.method,
        url,
        headers=headers,
        data=body if body else None,
        allow_redirects=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
    ) as answer:
        answer_body = await answer.read()
        answer_headers = {
            name: answer.headers[name] for name in _RESPONSE_HEADERS if name in answer.headers
        }
        return web.Response(status=answer.status, headers=answer_headers, body=answer_body)


async def client_session(app: web.Application) -> AsyncIterator[None]:
    """One pooled session for the app's lifetime, as opgate holds one."""
    async with aiohttp.ClientSession(
        auto_decompress=False,
        trust_env=False,
        connector=aiohttp.TCPConnector(limit=0),
        cookie_jar=aiohttp.DummyCookieJar(),
    ) as session:
        app[CLIENT] = session
        yield


def baseline_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=1024 * 1024)
    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(client_session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the provider's base URL")
    args = parser.parse_args()
    web.run_app(
        baseline_app(args.upstream),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        auto_decompress=False,
    )


if __name__ == "__main__":
    main()
