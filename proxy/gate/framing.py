"""Requests aiohttp's HTTP parser refuses before any handler runs: two Content-Length headers,
Transfer-Encoding with Content-Length, a request line that is not HTTP, a control byte in a
header. No middleware sees them and aiohttp answers text/plain; a listener started with
``ProblemAppRunner`` answers them as problem+json ``request_malformed`` instead, through the
``MalformedAnswer`` it is given (the agent listeners' one also leaves the audit record).

aiohttp has no public hook for this (aio-libs/aiohttp#3287, #6463): ``RequestHandler.handle_error``
is public and may be overridden, but the ``web.Server`` that makes the handlers is built inside
``AppRunner._make_server``. ``ProblemAppRunner`` rebuilds that server, with the very arguments
aiohttp gave it, as a ``web.Server`` that makes ``_ProblemRequestHandler``s. That reads the
server's ``_loop`` and ``_kwargs``: an aiohttp upgrade that renames them fails
tests/gate/test_framing.py rather than silently answering text/plain again.

The same server takes ``Expect`` off a ``CONNECT`` before the application sees it (kept in the
request as ``CONNECT_EXPECTATIONS``): aiohttp answers ``Expect`` through the matched route's
expect handler, before any middleware, and a CONNECT matches no route, so its handler is
aiohttp's default, which sends ``100 Continue`` (before the forward listener's proxy
authentication) or a text/plain 417 (with no record). The forward listener decides it instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import (
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
)
from aiohttp.web_request import BaseRequest
from multidict import CIMultiDict

from proxy.gate.problem import problem_response
from proxy.gate.reasons import Reason
from proxy.gate.shutdown import DrainingRequestHandler
from proxy.observe.audit import REQUEST_OBSERVER, AuditRecord, Decision
from proxy.observe.record_life import RecordLife
from proxy.runtime import Gateway

# The answer to a request the parser refused, given the parser's one-line reason.
MalformedAnswer = Callable[[str], web.Response]
RequestHandlerFunction = Callable[[BaseRequest], Awaitable[web.StreamResponse]]
# A CONNECT's Expect header values, taken off the request before the application saw it.
CONNECT_EXPECTATIONS = web.RequestKey("opgate_connect_expectations", tuple[str, ...])


# The parser's errors whose message is, or quotes, the request's own bytes (a line over the
# limit, an unreadable header, a target that is not a URL): said in a sentence of ours.
_QUOTING = (
    (LineTooLong, "a request or header line is longer than the listener accepts"),
    (InvalidHeader, "a header cannot be read"),
    (InvalidURLError, "the request target is not a valid URL"),
)


def parser_reason(exc: HttpProcessingError) -> str:
    """What the parser refused, never quoting the request: those bytes may hold a credential
    (an over-long Authorization header, a token in a query). For the messages that quote them
    a sentence of ours; else the first line of aiohttp's message ("Duplicate Content-Length"),
    without the bytes it quotes on the next lines and after a colon."""
    for kind, sentence in _QUOTING:
        if isinstance(exc, kind):
            return sentence
    first = (exc.message or "").strip().splitlines()[:1]
    line = first[0].rstrip(":").strip() if first else ""
    if isinstance(exc, BadStatusLine) and ("'" in line or '"' in line):
        line = "the request line is not HTTP"  # "Bad status line 'the line'"
    return line or "the request is not well-formed HTTP"


def agent_malformed_answer(gateway: Gateway, listener: str) -> MalformedAnswer:
    """The agent (or forward) listener's answer: problem+json and one audit record, like every
    other refusal. The parser stopped before a method or path could be trusted: none is kept."""

    def answer(reason: str) -> web.Response:
        record = AuditRecord(
            listener=listener,
            policy_version=gateway.policy.version,
        )
        record.decision, record.reason = Decision.DENY, Reason.REQUEST_MALFORMED.value
        response = problem_response(Reason.REQUEST_MALFORMED, reason)
        record.response_status = response.status
        observability = gateway.observability
        token = REQUEST_OBSERVER.set(observability)
        try:
            RecordLife(record).leave()
        finally:
            REQUEST_OBSERVER.reset(token)
        return response

    return answer


class _ProblemRequestHandler(DrainingRequestHandler):
    """aiohttp's connection handler, answering the parser's refusals through ``answer`` (and
    closing at once a connection that a drain caught before its first turn)."""

    def __init__(self, manager: web.Server, *, answer: MalformedAnswer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._answer_malformed = answer

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):  # a handler's failure: aiohttp's own 500
            return super().handle_error(request, status, exc, message)
        self.log_debug("Refused a malformed request from %s", request.remote, exc_info=exc)
        if request.writer.output_size > 0:  # as aiohttp: nothing more can be said on the wire
            raise ConnectionError("a response is already under way")
        response = self._answer_malformed(parser_reason(exc))
        response.force_close()
        return response


class _ProblemServer(web.Server):
    def __init__(self, *args: Any, answer: MalformedAnswer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._answer_malformed = answer

    def __call__(self) -> web.RequestHandler:
        return _ProblemRequestHandler(
            self, loop=self._loop, answer=self._answer_malformed, **self._kwargs
        )


class ProblemAppRunner(web.AppRunner):
    """An ``AppRunner`` whose connections answer parser refusals through ``answer``."""

    def __init__(self, app: web.Application, *, answer: MalformedAnswer, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._answer_malformed = answer

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _ProblemServer(
            _connect_expectations_kept_aside(made.request_handler),
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            answer=self._answer_malformed,
            **made._kwargs,
        )


def _connect_expectations_kept_aside(handler: RequestHandlerFunction) -> RequestHandlerFunction:
    """``handler``, called for a CONNECT with ``Expect`` on a copy of the request without it,
    its values kept as ``request[CONNECT_EXPECTATIONS]`` (the copy shares the connection)."""

    async def handle(request: BaseRequest) -> web.StreamResponse:
        if request.method == hdrs.METH_CONNECT and hdrs.EXPECT in request.headers:
            request[CONNECT_EXPECTATIONS] = tuple(request.headers.getall(hdrs.EXPECT))
            headers = CIMultiDict(request.headers)
            headers.popall(hdrs.EXPECT)
            request = request.clone(headers=headers)
        return await handler(request)

    return handle
