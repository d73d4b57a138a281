"""A fake payment provider for the benchmark: the cheapest upstream aiohttp can serve.

It answers ``POST /v1/refunds`` with a small Stripe-like refund (with an ``"id"``, so opgate's
classifier has an object id to record) and any ``GET`` with a small JSON object. It keeps no
state and checks nothing, so that every row of the benchmark pays the same, minimal upstream
cost and the differences between rows are the proxies' own.

Run as ``python bench/provider.py --port PORT`` (the bench runner does this).
"""

from __future__ import annotations

import argparse
import itertools

from aiohttp import web

_REFUND_IDS = itertools.count(1)


async def create_refund(request: web.Request) -> web.Response:
    """Reads the whole body first, as a real provider would, then answers a fresh refund."""
    await request.read()
    refund_id = f"re_bench_{next(_REFUND_IDS)}"
    body = (
        f'{{"id":"{refund_id}","object":"refund","amount":1000,"currency":"usd",'
        '"charge":"ch_bench","status":"succeeded"}'
    )
    return web.Response(text=body, content_type="application/json")


async def read_anything(request: web.Request) -> web.Response:
    """Any read: a fixed small object, the same size order as the refund answer."""
    return web.Response(
        text='{"id":"re_bench_0","object":"refund","amount":1000,"status":"succeeded"}',
        content_type="application/json",
    )


def provider_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/refunds", create_refund)
    app.router.add_get("/{tail:.*}", read_anything)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # No access log: a log line per request would be the provider's largest cost.
    web.run_app(provider_app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
