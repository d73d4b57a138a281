"""MCP over Streamable HTTP at ``/_opgate/mcp`` on the agent listener.

The official SDK speaks the protocol (both eras: the ``initialize`` handshake and the
2026-07-28 single exchange, JSON-RPC framing, version negotiation, input checks); opgate only
carries its ASGI exchange over aiohttp, in stateless JSON mode: one POST, one JSON answer, no
session to keep or to lose when a process dies. Bridging keeps every protocol rule in the SDK
instead of re-implementing a moving specification here.

The agent's opgate token is checked before the SDK sees a byte; a refused exchange is
problem+json with its audit record. Each exchange leaves exactly one audit record: a tool
call's (``calls``), or the endpoint's own for protocol messages (listing tools, handshakes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, MutableMapping
from importlib.metadata import version
from typing import Any

import aiohttp
import mcp.types as types
from aiohttp import web
from mcp.server.extension import compose_tool_call_handler
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError

from proxy.gate.decision import Deny
from proxy.gate.identity import (
    AgentDirectory,
    AmbiguousCredentials,
    new_token,
    presented_agent_token,
    token_digest,
)
from proxy.gate.problem import problem_response
from proxy.gate.reasons import Reason
from proxy.mcp import apps, resources
from proxy.mcp.auth import (
    WELL_KNOWN,
    Bearer,
    OAuthVerifier,
    TokenRefused,
    challenge,
    metadata_document,
    required_scope,
)
from proxy.mcp.calls import LISTENER, MCP_RULE, McpCall, call_tool
from proxy.mcp.capabilities import OpgateServer
from proxy.mcp.elicitation import ask_for_approval, url_elicitation_supported
from proxy.mcp.messages import malformed_request
from proxy.mcp.origins import origin_allowed
from proxy.mcp.request_state import sealing_boundary, state_key
from proxy.mcp.subscriptions import Listening
from proxy.mcp.tasks import OperationTasks
from proxy.mcp.tools import (
    GET_PROPOSAL,
    PROPOSE_OPERATION,
    TOOL_NAMES,
    TOOLS,
    Answered,
    tool_result,
)
from proxy.observe.audit import REQUEST_OBSERVER, AuditRecord, Decision, request_path
from proxy.observe.observer import OBSERVABILITY
from proxy.observe.record_life import RecordLife
from proxy.runtime import GATEWAY, Gateway

MCP_PATH = "/_opgate/mcp"
MAX_MESSAGE_BYTES = 1 << 20  # one JSON-RPC message; the tools' arguments are small
_SEND_BEARER = "Send your opgate agent token as Authorization: Bearer <token>."
_CALL = "opgate.mcp_call"  # the ASGI scope key the tool handlers find their McpCall under

Scope = MutableMapping[str, Any]


def _call_of(ctx: Any) -> McpCall:
    """The exchange a handler runs in (``McpCall``), put in its ASGI scope by the endpoint
    after the token was checked."""
    call: McpCall = ctx.request.scope[_CALL]
    return call


def mcp_server(
    tasks: OperationTasks,
    stopping: asyncio.Event,
    sealed: RequestStateBoundary,
    name: str = "opgate",
) -> Server[Any]:
    """The SDK server with opgate's tools, and the tasks extension applied as the SDK's
    ``MCPServer`` applies one (its methods, its advertisement, its ``tools/call``
    interceptor), on the low-level server opgate bridges. ``stopping``: ends the listen
    streams (the listener stops); ``sealed``: the ``requestState`` boundary, which reads a
    retry's state (and refuses any other) before the handlers see it."""

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(TOOLS))

    async def on_call_tool(
        ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        call = _call_of(ctx)
        if params.name not in TOOL_NAMES:  # a protocol error, as the specification lists it
            raise MCPError(types.INVALID_PARAMS, "Unknown tool (tools/list names opgate's)")
        if params.name != PROPOSE_OPERATION:
            return tool_result(await call_tool(call, params.name, params.arguments))
        if params.request_state is not None:  # the retry: the proposal it made, as it is now
            state = {"proposal_id": params.request_state}
            return tool_result(await call_tool(call, GET_PROPOSAL, state))
        answer = await call_tool(call, params.name, params.arguments)
        console = call.gateway.settings.console_url
        if (
            console is not None
            and isinstance(answer, Answered)
            and url_elicitation_supported(ctx.protocol_version, ctx.params)
        ):
            return ask_for_approval(console, answer.content)
        return tool_result(answer)

    async def list_templates(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[resources.TEMPLATE])

    async def list_resources(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        listed = await resources.listed(_call_of(ctx))
        listed.resources.append(apps.CARD)
        return listed

    async def read_resource(
        ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if params.uri == apps.CARD_URI:
            return apps.card()
        return await resources.read(_call_of(ctx), params.uri)

    server: Server[Any] = OpgateServer(
        name,
        version=version("opgate"),
        on_list_tools=list_tools,
        on_call_tool=on_call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscriptions_listen=Listening(_call_of, tasks.task_of, stopping),
    )
    for method in tasks.methods():
        server.add_request_handler(method.method, method.params_type, method.handler)
    server.extensions[tasks.identifier] = tasks.settings()
    server.extensions[apps.APPS] = {}  # the proposal card (no settings defined)
    server.add_request_handler(
        "tools/call",
        types.CallToolRequestParams,
        compose_tool_call_handler([tasks], on_call_tool),
    )
    # inside the SDK's OpenTelemetry middleware, as MCPServer installs it: spans see the
    # sealed form, handlers and interceptors only what opgate minted
    server.middleware.append(sealed)
    return server


class McpEndpoint:
    def __init__(self, gw: Gateway) -> None:
        self.tasks = OperationTasks(_call_of)
        self.stopping = asyncio.Event()  # set: the listen streams end
        self.verifier: OAuthVerifier | None = None  # built on first use, from the settings
        self.http: aiohttp.ClientSession | None = None  # fetches the issuers' keys
        sealed = sealing_boundary(
            state_key(gw.credentials),
            gw.settings.proposal_pending_seconds,
            lambda ctx: _call_of(ctx).agent,
        )
        self.manager = StreamableHTTPSessionManager(
            mcp_server(self.tasks, self.stopping, sealed),
            json_response=True,
            stateless=True,
            max_request_body_size=MAX_MESSAGE_BYTES,
        )

    async def running(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: the SDK's task group lives as long as the listener, in a task of
        its own (aiohttp may start and clean up in different tasks; a task group may not)."""
        started, stop = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            async with self.manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(run())
        ready = asyncio.create_task(started.wait())
        await asyncio.wait((task, ready), return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # it could not start: say why, at start-up
            ready.cancel()
            task.result()
        try:
            yield
        finally:
            self.stopping.set()
            await self.tasks.drained()  # executions started as tasks finish sending
            stop.set()
            await task
            if self.http is not None:
                await self.http.close()

    async def ending(self, app: web.Application) -> None:
        """``on_shutdown``: the listen streams end now (aiohttp waits for open requests
        before the cleanup contexts run, and a stream would keep it waiting)."""
        self.stopping.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        gw = request.app[GATEWAY]
        record = AuditRecord(
            source=request.remote,
            method=request.method,
            path=request_path(request.raw_path),
            policy_version=gw.policy.version,
            listener=LISTENER,
            rule=MCP_RULE,
        )
        call: McpCall | None = None
        # one record per exchange: this one, unless a tool or the pipeline writes the request's
        # own (McpCall.exchange.replaced)
        with RecordLife(record) as exchange:
            # DNS rebinding (the transport's MUST): a browser page's request is refused
            # before anything else is read, a token checked or the protocol spoken
            if not origin_allowed(
                request.headers.getall("Origin", []), gw.settings.mcp_allowed_origins
            ):
                detail = "this Origin is not in mcp_allowed_origins"  # never echoed
                return _refuse(record, Reason.MCP_ORIGIN_REFUSED, detail)
            try:
                token = presented_agent_token(request.headers, "Authorization")
            except AmbiguousCredentials as exc:
                return _refuse(record, Reason.AMBIGUOUS_REQUEST, str(exc))
            oauth = gw.settings.mcp_oauth
            bearer = await self._bearer(gw, token)
            if not isinstance(bearer, Bearer):
                detail = bearer.detail if bearer else "no valid agent token"
                error = bearer.error if bearer else None
                told = challenge(oauth, error=error)
                return _refuse(record, Reason.AGENT_UNAUTHENTICATED, detail, challenge=told)
            assert token is not None
            agent = bearer.agent
            record.agent_id, record.tenant = agent.agent_id, agent.tenant
            if request.method != "POST":
                detail = f"{request.method}: the MCP endpoint takes POST only"
                return _refuse(record, Reason.MCP_REQUEST_INVALID, detail, status=405)
            body = await _read_message(request, gw.settings.body_read_timeout_seconds)
            if isinstance(body, Deny):
                return _refuse(record, body.reason, body.detail)
            message = _decoded(body)
            scope = required_scope(message)
            if bearer.scopes is not None and scope is not None and scope not in bearer.scopes:
                told = challenge(oauth, error="insufficient_scope", scope=scope)
                detail = f"the token does not grant {scope}"
                return _refuse(record, Reason.MCP_SCOPE_INSUFFICIENT, detail, challenge=told)
            if bearer.scopes is None:  # a static token: the pipeline identifies it as sent
                call = McpCall(gw, agent, token, request.remote, record.path or MCP_PATH, exchange)
            else:
                # The pipeline identifies an agent by token (stage 1, as for any request). An
                # OAuth agent's token never enters it (no passthrough): the exchange gets a
                # random token that only its own view of the agent directory knows.
                internal = new_token()
                directory = AgentDirectory({token_digest(internal): agent})
                seen_as = dataclasses.replace(gw, agents=directory)
                call = McpCall(
                    seen_as, agent, internal, request.remote, record.path or MCP_PATH, exchange
                )
                call.scopes = bearer.scopes  # a task's scope is known once its id is looked up
            owed = _owed_error(message) if message is not _NOT_JSON else None
            response = owed or await self._exchange(request, body, call)
            if call.lacking is not None:  # a task's scope, known once its id was looked up
                told = challenge(oauth, error="insufficient_scope", scope=call.lacking)
                detail = f"the token does not grant {call.lacking}"
                return _refuse(record, Reason.MCP_SCOPE_INSUFFICIENT, detail, challenge=told)
            record.response_status = response.status
            if response.status >= 400 or _is_error(response):  # a JSON-RPC error answer
                record.decision = Decision.DENY
                record.reason = Reason.MCP_REQUEST_INVALID.value
            else:
                record.decision = Decision.ALLOW
            return response

    async def _bearer(self, gw: Gateway, token: str | None) -> Bearer | TokenRefused | None:
        """Who the token says is calling: a configured agent's static token (unless the
        settings turned those off), else an OAuth access token; None: no token at all."""
        if token is None:
            return None
        oauth = gw.settings.mcp_oauth
        if oauth is None or oauth.static_tokens:
            agent = gw.agents.lookup(token)
            if agent is not None:
                return Bearer(agent, None)
        if oauth is None:
            return TokenRefused("no valid agent token")
        if self.verifier is None:
            agents = {agent.agent_id: agent for agent in gw.agents.by_digest.values()}
            self.verifier = OAuthVerifier(oauth, agents)
        if self.http is None:
            self.http = aiohttp.ClientSession(trust_env=False)
        return await self.verifier.verify(self.http, token)

    async def _exchange(
        self, request: web.Request, body: bytes, call: McpCall
    ) -> web.StreamResponse:
        """The SDK's ASGI exchange over this aiohttp request."""
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": f"{request.version.major}.{request.version.minor}",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.raw_path.partition("?")[0].encode("latin-1"),
            "query_string": request.query_string.encode("latin-1"),
            "root_path": "",
            "headers": [
                (name.lower().encode("latin-1"), value.encode("latin-1"))
                for name, value in request.headers.items()
            ],
            "client": None,
            "server": None,
            _CALL: call,
        }
        bridge = _Bridge(body, request)
        observer = REQUEST_OBSERVER.set(request.app.get(OBSERVABILITY))
        try:
            await self.manager.handle_request(scope, bridge.receive, bridge.send)
        finally:
            REQUEST_OBSERVER.reset(observer)
        return bridge.answer()


class _Bridge:
    """One ASGI request/response over aiohttp. The body is already read; the answer is
    buffered (JSON mode: each answer is one JSON document), so that a refusal that is not
    JSON-RPC can still be answered as problem+json; except a ``subscriptions/listen``
    stream (server-sent events), which is written as the SDK sends it."""

    def __init__(self, body: bytes, request: web.Request) -> None:
        self.body: bytes | None = body
        self.request = request
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []
        self.stream: web.StreamResponse | None = None
        self.gone = asyncio.Event()  # the client of a stream hung up

    async def receive(self) -> dict[str, Any]:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()  # the SDK watches for a hang-up: only a stream's comes
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.get("headers", [])
            ]
            if any(
                name.lower() == "content-type" and value.startswith("text/event-stream")
                for name, value in self.headers
            ):
                self.stream = web.StreamResponse(status=message["status"])
                for name, value in self.headers:
                    if name.lower() != "content-length":
                        self.stream.headers.add(name, value)
                await self.stream.prepare(self.request)
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            if self.stream is None:
                self.chunks.append(chunk)
                return
            try:
                if chunk:
                    await self.stream.write(chunk)
                if not message.get("more_body", False):
                    await self.stream.write_eof()
            except ConnectionError:  # the client left: the SDK ends the stream's handler
                self.gone.set()

    def answer(self) -> web.StreamResponse:
        if self.stream is not None:
            return self.stream
        if self.status is None:  # the SDK ended without an answer: a bug, said as such
            raise web.HTTPInternalServerError(text="the MCP exchange ended without an answer")
        body = b"".join(self.chunks)
        response = web.Response(status=self.status, body=body)
        for name, value in self.headers:
            if name.lower() != "content-length":
                response.headers.add(name, value)
        if self.status >= 400 and response.content_type != "application/json":
            # the SDK refused the HTTP exchange itself (not a JSON-RPC error): opgate's shape
            detail = body.decode("utf-8", errors="replace")[:500]
            return problem_response(Reason.MCP_REQUEST_INVALID, detail, status=self.status)
        return response


_NOT_JSON: Any = object()


def _decoded(body: bytes) -> Any:
    """The message as JSON, or ``_NOT_JSON`` (the SDK answers that with its parse error)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _owed_error(message: Any) -> web.Response | None:
    """The JSON-RPC error for a request the SDK would take for a notification (``"id":
    null``) or drop; None for everything else, which the SDK answers."""
    error = malformed_request(message)
    if error is None:
        return None
    answer = error.model_dump_json(by_alias=True, exclude_none=False, exclude_unset=True)
    return web.Response(status=400, text=answer, content_type="application/json")


def _is_error(response: web.StreamResponse) -> bool:
    """Whether a JSON answer is a JSON-RPC error (the SDK answers some with 200)."""
    if not isinstance(response, web.Response) or response.content_type != "application/json":
        return False
    if not isinstance(response.body, bytes):
        return False
    try:
        answer = json.loads(response.body)
    except ValueError:
        return False
    return isinstance(answer, dict) and "error" in answer


async def _read_message(request: web.Request, deadline_seconds: float) -> bytes | Deny:
    """The whole message, bounded in size and in time (as the pipeline reads a body)."""
    too_large = Deny(Reason.BODY_TOO_LARGE, f"more than {MAX_MESSAGE_BYTES} bytes")
    if request.content_length is not None and request.content_length > MAX_MESSAGE_BYTES:
        return too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(deadline_seconds):
            while chunk := await request.content.read(64 * 1024):
                size += len(chunk)
                if size > MAX_MESSAGE_BYTES:
                    return too_large
                chunks.append(chunk)
    except TimeoutError:
        return Deny(Reason.BODY_TIMEOUT, f"the message did not arrive within {deadline_seconds} s")
    return b"".join(chunks)


def _refuse(
    record: AuditRecord,
    reason: Reason,
    detail: str,
    *,
    status: int | None = None,
    challenge: str | None = None,
) -> web.Response:
    record.decision, record.reason = Decision.DENY, reason.value
    # MCP clients send their token as Authorization: Bearer (not the proxy's header)
    told = {"next_action": _SEND_BEARER} if reason is Reason.AGENT_UNAUTHENTICATED else None
    response = problem_response(reason, detail, status=status, extra=told)
    if challenge is not None:
        response.headers["WWW-Authenticate"] = challenge
    if status == 405:  # stateless: no stream to GET, no session to DELETE
        response.headers["Allow"] = "POST"
    record.response_status = response.status
    return response


async def protected_resource_metadata(request: web.Request) -> web.Response:
    """RFC 9728: where a client learns which authorization server issues tokens for the
    endpoint, and which scopes it knows. Absent (404) when OAuth is not configured."""
    oauth = request.app[GATEWAY].settings.mcp_oauth
    if oauth is None:
        raise web.HTTPNotFound(text="the MCP endpoint takes opgate agent tokens only")
    return web.json_response(metadata_document(oauth))


def add_mcp_route(app: web.Application) -> None:
    endpoint = McpEndpoint(app[GATEWAY])
    app.router.add_route("*", MCP_PATH, endpoint.handle)
    app.router.add_get(WELL_KNOWN + MCP_PATH, protected_resource_metadata)
    app.cleanup_ctx.append(endpoint.running)
    app.on_shutdown.append(endpoint.ending)
