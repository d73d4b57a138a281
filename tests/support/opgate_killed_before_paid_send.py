"""``python -m tests.support.opgate_killed_before_paid_send serve ...``: opgate as a real
process that SIGKILLs itself when it is about to send a paid x402 request, after the payment
was kept on the operation's row and before a byte of the request leaves: the one crash window
the paid API cannot reach, since nothing arrives there.

The fault point lives here, in the test support folder, not in opgate: the product has no
switch that kills it. It wraps the one outbound exchange (``proxy.gate.upstream.send``, which
``proxy.gate.x402_pay`` calls with the stored payment only once ``X402Payments.keep`` has
committed it) and kills the process on the first request that carries ``PAYMENT-SIGNATURE``.
Everything else is ``python -m proxy`` unchanged (one worker: the server runs in this
process, so the wrapper is the one the gate calls).
"""

from __future__ import annotations

import os
import signal

import aiohttp

from proxy.cli import main
from proxy.gate import upstream

_send = upstream.send


async def _killed_before_paid_send(
    session: aiohttp.ClientSession, outbound: upstream.OutboundRequest
) -> upstream.UpstreamResponse:
    if "PAYMENT-SIGNATURE" in outbound.headers:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, exactly like a crashed host
    return await _send(session, outbound)


if __name__ == "__main__":
    upstream.send = _killed_before_paid_send  # type: ignore[assignment]
    raise SystemExit(main())
