"""``opgate mcp --url URL --token TOKEN``: MCP over stdio for agent runtimes that spawn their
tools, relayed to an opgate's ``/_opgate/mcp``.

The relay decides nothing and holds nothing: each tool call is one stateless exchange with
opgate, carrying the agent's token, and opgate's answer (or tool error) is handed back as it
is. So a relay outlives an opgate restart, and a replacement agent's relay needs only the
token and the operation id.

Operations as resources pass through it as over HTTP: ``resources/templates/list``,
``resources/list`` and ``resources/read`` of ``opgate://operations/{id}`` are asked of opgate
(the proposal card alone is served here, pure).

The tasks extension passes through it as over HTTP: for a client that declares it, the relay
declares it to opgate on that call too (and URL elicitation, where the client declared it),
hands back opgate's task handle, and relays ``tasks/get``, ``tasks/update`` and
``tasks/cancel`` (opgate's JSON-RPC errors as they are). The tasks are opgate's rows, so the
relay holds none of them either.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib.metadata import version
from typing import Any, Literal, TypeVar, cast

import anyio
import httpx2
import mcp.types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, compose_tool_call_handler
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ConfigDict, Field

from proxy.mcp import apps
from proxy.mcp.capabilities import OpgateServer
from proxy.mcp.elicitation import url_elicitation_supported
from proxy.mcp.endpoint import MCP_PATH
from proxy.mcp.messages import malformed_request
from proxy.mcp.tasks import TASKS, negotiated
from proxy.mcp.tools import TOOLS

_R = TypeVar("_R")

# opgate answers an execution after the provider does: as long as its longest provider timeout
_READ_TIMEOUT_SECONDS = 300.0


def endpoint_url(url: str) -> str:
    """The agent listener's address, or the endpoint's own: both name the endpoint."""
    base = url.rstrip("/")
    return base if base.endswith(MCP_PATH) else base + MCP_PATH


@contextlib.asynccontextmanager
async def _opgate(
    endpoint: str, token: str, extensions: Sequence[ClientExtension] = (), *, url: bool = False
) -> AsyncIterator[Client]:
    """One exchange's client of opgate's endpoint, with the agent's token; ``url``: declare
    URL elicitation (the relaying client did; opgate's own elicitation is never answered
    here, it travels in the task's ``inputRequests``)."""

    async def never(context: Any, params: Any) -> Any:
        raise RuntimeError("the relay answers no elicitation itself")

    timeout = httpx2.Timeout(30.0, read=_READ_TIMEOUT_SECONDS)
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout, trust_env=False) as http,
        Client(
            streamable_http_client(endpoint, http_client=http),
            extensions=list(extensions) or None,
            elicitation_callback=never if url else None,
        ) as opgate,
    ):
        yield opgate


class _Handle(types.Result):
    """opgate's ``CreateTaskResult``, kept whole (every field as opgate sent it)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")


class _Answer(types.Result):
    """opgate's answer to a ``tasks/*`` request, kept whole."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


def _whole(answer: types.Result) -> dict[str, Any]:
    """An answer as opgate sent it (less the SDK's ``_meta`` stamp, which the relay's own
    server stamps again)."""
    sent: dict[str, Any] = answer.model_dump(by_alias=True, mode="json", exclude_unset=True)
    sent.pop("_meta", None)
    return sent


class _DeclaredTasks(ClientExtension):
    """The tasks extension as the relay declares it to opgate: a task handle is handed back
    to the relaying client, never resolved here."""

    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        async def resolve(handle: _Handle, ctx: ClaimContext) -> types.CallToolResult:
            raise RuntimeError("the relay hands task handles back (allow_claimed)")

        return [ResultClaim(result_type="task", model=_Handle, resolve=resolve)]


class _TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId", min_length=1, max_length=255)


class _TaskRequest(types.Request[_TaskParams, str]):
    name_param = "taskId"  # the extension: tasks/* carry Mcp-Name: <taskId>


class RelayedTasks(Extension):
    """The tasks extension on the relay: each call and each ``tasks/*`` request relayed."""

    identifier = TASKS

    def __init__(self, endpoint: str, token: str) -> None:
        self.endpoint, self.token = endpoint, token

    def methods(self) -> Sequence[MethodBinding]:
        return tuple(
            MethodBinding(method, _TaskParams, self._relayed(method))
            for method in ("tasks/get", "tasks/update", "tasks/cancel")
        )

    def _client(
        self, ctx: ServerRequestContext[Any, Any]
    ) -> contextlib.AbstractAsyncContextManager[Client]:
        url = url_elicitation_supported(ctx.protocol_version, ctx.params)
        return _opgate(self.endpoint, self.token, [_DeclaredTasks()], url=url)

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if not negotiated(ctx):
            return await call_next(ctx)
        async with self._client(ctx) as opgate:
            answer = await opgate.session.call_tool(
                params.name, params.arguments, allow_claimed=True
            )
        return _whole(answer) if isinstance(answer, _Handle) else answer

    def _relayed(self, method: str) -> Any:
        async def relay(ctx: ServerRequestContext[Any, Any], params: _TaskParams) -> HandlerResult:
            # tasks/* from a client that did not declare the extension: opgate refuses it
            # (-32021) when the relay's own request does not declare it either
            sent = params.model_dump(by_alias=True, mode="json", exclude_none=True)
            sent.pop("_meta", None)
            request = _TaskRequest(method=method, params=_TaskParams.model_validate(sent))
            extensions = [_DeclaredTasks()] if negotiated(ctx) else []
            refused: MCPError | None = None
            async with _opgate(self.endpoint, self.token, extensions) as opgate:
                try:
                    answer = await opgate.session.send_request(request, _Answer)
                except MCPError as exc:  # raised out here: the client's task group wraps it
                    refused = exc
            if refused is not None:  # opgate's JSON-RPC error, handed on as it is
                raise MCPError(refused.error.code, refused.error.message, refused.error.data)
            return _whole(answer)

        return relay


async def _asked_of_opgate(endpoint: str, token: str, ask: Callable[[Client], Awaitable[_R]]) -> _R:
    """A request asked of opgate (the tools and the operations are its own), its JSON-RPC
    error handed on as it is: an unknown tool is -32602 here as over HTTP, another tenant's
    operation "Resource not found"."""
    refused: MCPError | None = None
    async with _opgate(endpoint, token) as opgate:
        try:
            return await ask(opgate)
        except MCPError as exc:  # raised out here: the client's task group wraps it
            refused = exc
    assert refused is not None  # the exchange either answered or was refused
    raise MCPError(refused.error.code, refused.error.message, refused.error.data)


def relay_server(url: str, token: str) -> Server[Any]:
    endpoint = endpoint_url(url)
    tasks = RelayedTasks(endpoint, token)

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(TOOLS))

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await _asked_of_opgate(
            endpoint, token, lambda opgate: opgate.call_tool(params.name, params.arguments)
        )

    async def list_templates(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return await _asked_of_opgate(
            endpoint, token, lambda opgate: opgate.session.list_resource_templates()
        )

    async def list_resources(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        # opgate lists the agent's unsettled operations, and the card beside them
        return await _asked_of_opgate(endpoint, token, lambda c: c.session.list_resources())

    async def read_resource(
        ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        # the proposal tools name the card: it is served here (pure), not relayed
        if params.uri == apps.CARD_URI:
            return apps.card()
        return await _asked_of_opgate(
            endpoint, token, lambda opgate: opgate.session.read_resource(params.uri)
        )

    server: Server[Any] = OpgateServer(
        "opgate",
        version=version("opgate"),
        instructions=(
            "opgate's approved operations as tools. Never compose a mutating request: "
            "execute_operation sends exactly the approved one. Follow next_action."
        ),
        on_list_tools=list_tools,
        on_call_tool=on_call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )
    for method in tasks.methods():  # applied as endpoint.mcp_server applies opgate's own
        server.add_request_handler(method.method, method.params_type, method.handler)
    server.extensions[tasks.identifier] = tasks.settings()
    server.extensions[apps.APPS] = {}
    server.add_request_handler(
        "tools/call",
        types.CallToolRequestParams,
        compose_tool_call_handler([tasks], on_call_tool),
    )
    return server


class _CheckedLines:
    """stdin's lines for the SDK's reader, less the requests it would drop in silence (it
    skips a line that does not validate, and the client waits forever on that id): those
    are answered here with their JSON-RPC error, on the SDK's own writer."""

    def __init__(self) -> None:
        # UTF-8 whatever the locale says, as the SDK's own reader decodes
        cast(io.TextIOWrapper, sys.stdin).reconfigure(encoding="utf-8", errors="replace")
        self.lines = anyio.wrap_file(sys.stdin)
        self.write: MemoryObjectSendStream[SessionMessage] | None = None
        self.ready = anyio.Event()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[str]:
        async for line in self.lines:
            try:
                error = malformed_request(json.loads(line))
            except (ValueError, RecursionError):  # not JSON: the SDK's to refuse
                error = None
            if error is None:
                yield line
                continue
            await self.ready.wait()
            assert self.write is not None
            await self.write.send(SessionMessage(error))


async def serve_stdio(url: str, token: str) -> None:
    server = relay_server(url, token)
    lines = _CheckedLines()
    async with stdio_server(stdin=cast(anyio.AsyncFile[str], lines)) as (read, write):
        lines.write = cast(MemoryObjectSendStream[SessionMessage], write)
        lines.ready.set()
        await server.run(read, write, server.create_initialization_options())
