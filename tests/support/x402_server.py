"""A paid API made of the official x402 SDK's server side: its ``x402HTTPResourceServer`` core
(the one its FastAPI and Flask middleware wrap), wrapped here in an aiohttp application on
loopback, over the SDK's ``exact`` EVM facilitator and the in-memory token (x402_ledger). It
verifies, runs the handler, settles, then answers, as the SDK's middleware does; and it can
lose an answer after settlement (``lose_answers``), the failure of x402 issue #3438.

With ``payment_ids`` on, it also supports the ``payment-identifier`` extension as its spec
(x402-foundation/x402 ``specs/extensions/payment_identifier.md``) describes, which the SDK's
server declares but does not act on: the 402 declares it; a paid request's id is looked up
before anything is verified; the answer is kept as it was sent (``PAYMENT-RESPONSE``
included) under the id, bound to the exact payload; a repeat with the same id and payload is
answered from it without verifying or settling again; the same id with another payload is
409; a repeat while the first is still being served waits for the first's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from x402 import x402Facilitator, x402ResourceServer
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    declare_payment_identifier_extension,
    extract_payment_identifier,
)
from x402.http import x402HTTPResourceServer
from x402.http.types import HTTPRequestContext, PaymentOption, RouteConfig
from x402.http.utils import decode_payment_signature_header
from x402.mechanisms.evm.exact import register_exact_evm_facilitator, register_exact_evm_server
from x402.schemas import AssetAmount

from tests.support.x402_ledger import NETWORK, TOKEN, TOKEN_NAME, TOKEN_VERSION, Ledger

PRICE = 10_000  # 0.01 USDC
PAYEE = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"


@dataclass
class PaidApi:
    """The running paid API: its base URL, its knobs, and what its handler served."""

    ledger: Ledger
    pay_to: str = PAYEE
    lose_answers: int = 0  # answers still to lose after settling
    drop_payments: int = 0  # paid requests still to drop on arrival: nothing verified or settled
    max_timeout_seconds: int = 300  # the requirement's maxTimeoutSeconds (validBefore's bound)
    # called (then the connection dropped) when a paid request arrives, before anything is
    # verified; or once it has settled, before the answer: where a test SIGKILLs its client
    crash_on_arrival: Callable[[], Awaitable[None]] | None = None
    crash_after_settlement: Callable[[], Awaitable[None]] | None = None
    next_pay_to: str | None = None  # the payee after the next unpaid 402 (a swap)
    payment_ids: bool = False  # the payment-identifier extension declared and honoured
    # the payee by the request's User-Agent (else pay_to): one API, many merchants, at once
    pay_to_by_user_agent: dict[str, str] = field(default_factory=dict)
    served: int = 0
    replayed: int = 0  # paid requests answered from a kept answer (payment-identifier)
    base: str = ""
    payment_headers_seen: list[str] = field(default_factory=list)
    # payment id -> (the exact PAYMENT-SIGNATURE, its answer once sent: status, body, headers)
    kept_answers: dict[str, tuple[str, asyncio.Future[_Answer]]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Answer:
    status: int
    body: Any
    headers: dict[str, str]


class _Adapter:
    """The SDK's HTTPAdapter over an aiohttp request."""

    def __init__(self, request: web.Request) -> None:
        self._request = request

    def get_header(self, name: str) -> str | None:
        return self._request.headers.get(name)

    def get_method(self) -> str:
        return self._request.method

    def get_path(self) -> str:
        return self._request.path

    def get_url(self) -> str:
        return str(self._request.url)

    def get_accept_header(self) -> str:
        return self._request.headers.get("Accept", "")

    def get_user_agent(self) -> str:
        return self._request.headers.get("User-Agent", "")

    def get_query_params(self) -> dict[str, str | list[str]]:
        return dict(self._request.query)

    def get_query_param(self, name: str) -> str | None:
        return self._request.query.get(name)

    def get_body(self) -> Any:
        return None


def _json(body: Any, status: int, headers: dict[str, str]) -> web.Response:
    """The SDK's response instructions as an aiohttp answer (its headers name a Content-Type)."""
    kept = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    return web.json_response(body or {}, status=status, headers=kept)


@asynccontextmanager
async def paid_api(ledger: Ledger) -> AsyncIterator[PaidApi]:
    """The paid API on a loopback port, stopped on exit."""
    state = PaidApi(ledger)
    facilitator = register_exact_evm_facilitator(x402Facilitator(), ledger, networks=NETWORK)
    server = register_exact_evm_server(x402ResourceServer(facilitator), networks=NETWORK)
    built: dict[tuple[int, bool], x402HTTPResourceServer] = {}

    def http_server() -> x402HTTPResourceServer:
        """The SDK's HTTP server for the requirement as the knobs say now."""
        timeout, payment_ids = state.max_timeout_seconds, state.payment_ids
        if (timeout, payment_ids) not in built:
            option = PaymentOption(
                scheme="exact",
                pay_to=lambda context: state.pay_to_by_user_agent.get(
                    context.adapter.get_user_agent(), state.pay_to
                ),
                price=AssetAmount(
                    amount=str(PRICE),
                    asset=TOKEN,
                    extra={"name": TOKEN_NAME, "version": TOKEN_VERSION},
                ),
                network=NETWORK,
                max_timeout_seconds=timeout,
            )
            extensions = (
                {PAYMENT_IDENTIFIER: declare_payment_identifier_extension()}
                if payment_ids
                else None
            )
            route = RouteConfig(accepts=option, description="a paid report", extensions=extensions)
            built[timeout, payment_ids] = x402HTTPResourceServer(server, {"GET /report": route})
            built[timeout, payment_ids].initialize()
        return built[timeout, payment_ids]

    def payment_id(header: str) -> str | None:
        """The payment-identifier id the paid request carries (None: none, or not honoured)."""
        if not state.payment_ids:
            return None
        try:
            payload = decode_payment_signature_header(header)
        except ValueError:
            return None
        if getattr(payload, "x402_version", 2) != 2:
            return None
        return extract_payment_identifier(payload)  # type: ignore[arg-type]

    async def from_kept(header: str, kept_id: str) -> web.StreamResponse | None:
        """The answer kept under the id (waiting for it if the first is still being served),
        a 409 for another payload under the id, or None: the id is new."""
        kept = state.kept_answers.get(kept_id)
        if kept is None:
            return None
        first_header, answer = kept
        if first_header != header:
            return web.json_response(
                {"error": "payment id reused with another payload"}, status=409
            )
        try:
            sent = await asyncio.shield(answer)
        except asyncio.CancelledError:
            if not answer.cancelled():
                raise
            # the first ended unanswered (its payment refused): nothing is kept to answer with
            return web.json_response({"error": "not answered yet; retry"}, status=409)
        state.replayed += 1
        return _json(sent.body, sent.status, sent.headers)

    async def report(request: web.Request) -> web.StreamResponse:
        header = request.headers.get("PAYMENT-SIGNATURE")
        kept_id: str | None = None
        if header is not None:
            state.payment_headers_seen.append(header)
            crash, state.crash_on_arrival = state.crash_on_arrival, None
            if crash is not None:
                await crash()
            if crash is not None or state.drop_payments > 0:  # lost on the way in: not seen
                state.drop_payments = max(0, state.drop_payments - 1)
                assert request.transport is not None
                request.transport.abort()
                return web.Response()
            kept_id = payment_id(header)
            if kept_id is not None:  # looked up before anything is verified
                replay = await from_kept(header, kept_id)
                if replay is not None:
                    return replay
                pending: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
                state.kept_answers[kept_id] = (header, pending)
        try:
            return await serve(request, header, kept_id)
        finally:
            if kept_id is not None and not state.kept_answers[kept_id][1].done():
                state.kept_answers.pop(kept_id)[1].cancel()  # unanswered: the id stays new

    async def serve(
        request: web.Request, header: str | None, kept_id: str | None
    ) -> web.StreamResponse:
        context = HTTPRequestContext(
            adapter=_Adapter(request),
            path=request.path,
            method=request.method,
            payment_header=header,
        )
        result = await http_server().process_http_request(context)
        if result.type == "payment-error":
            assert result.response is not None
            if header is None and state.next_pay_to is not None:
                state.pay_to, state.next_pay_to = state.next_pay_to, None
            return _json(result.response.body, result.response.status, result.response.headers)
        assert result.type == "payment-verified"
        state.served += 1  # the handler ran
        settled = await http_server().process_settlement(
            result.payment_payload,
            result.payment_requirements,
            context=context,
            declared_extensions=result.declared_extensions,
        )
        if not settled.success:
            assert settled.response is not None
            return _json(settled.response.body, settled.response.status, settled.response.headers)
        answer = _Answer(200, {"report": "ok"}, dict(settled.headers))
        if kept_id is not None:  # kept as it is sent, before it can be lost on the way
            state.kept_answers[kept_id][1].set_result(answer)
        crash, state.crash_after_settlement = state.crash_after_settlement, None
        if crash is not None:
            await crash()
        if crash is not None or state.lose_answers > 0:  # paid, the answer never reaches it
            state.lose_answers = max(0, state.lose_answers - 1)
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        return _json(answer.body, answer.status, answer.headers)

    app = web.Application()
    app.router.add_get("/report", report)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    state.base = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()
