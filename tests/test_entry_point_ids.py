"""Every id an operator or an agent names is read by the one grammar (proxy/gate/ids.py) before
any store call, at every entry point: a NUL, an overlong id, odd Unicode, undecodable bytes or
a prefix of another kind is a 4xx answer (problem+json on the APIs, an error page on the
console, a JSON-RPC or tool error over MCP) with its audit record where the listener keeps
them, never a 500 and never a query. The routes are read from the listeners' own route tables,
the MCP tools from their input schemas and the task methods from the tasks extension, so an
entry point added later is tried without being listed here; one whose id placeholder has no
kind here fails."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from mcp.shared.exceptions import MCPError
from structlog.testing import capture_logs
from yarl import URL

from proxy.console.views import PREFIX as CONSOLE_PREFIX
from proxy.gate.ids import IdKind
from proxy.mcp.tasks import OperationTasks
from proxy.mcp.tools import TOOLS
from proxy.server import agent_app, ops_app
from proxy.transparency import note
from tests.console.helpers import csrf_of, sign_in
from tests.support.fault_provider import FaultProvider
from tests.support.mandate_gate import mandate_settings
from tests.support.mcp_tasks import cancel_task, get_task, tasks_client, update_task
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    Opgate,
    StartOpgate,
    admin_headers,
    fault_policy,
)
from tests.support.pipeline import GOOD_BODY, REFUND
from tests.support.raw_http import exchange, request_bytes

# The kind of id each route placeholder carries; the placeholders that carry none.
ID_PLACEHOLDERS = {
    "operation_id": IdKind.OPERATION,
    "proposal_id": IdKind.PROPOSAL,
    "digest": IdKind.MANDATE,
}
NOT_IDS = {"tail": "the pipeline's catch-all (X-Operation-Id, below)", "verdict": "approve|decline"}
FILLED = {"verdict": "approve"}
TRANSPARENCY = note.Signer.generate("opgate.test/audit")


def bad_segments(kind: IdKind) -> dict[str, str]:
    """Path segments (percent-encoded as sent) that no id of ``kind`` can be."""
    head = {IdKind.PROPOSAL: "prop_", IdKind.MANDATE: "A" * 20}.get(kind, "op_")
    wrong = {
        IdKind.OPERATION: "prop_refund_42",  # a proposal's spelling: no operation has it
        IdKind.PROPOSAL: "op_refund_42",
        IdKind.MANDATE: "sha-256:" + "A" * 35,
    }[kind]
    return {
        "nul": head + "x%00y",
        "overlong": head + "o" * 256,
        "odd unicode": head + "%E2%80%AEx%CC%81",  # a right-to-left override, a combining mark
        "invalid utf-8": head + "%C3%28",
        "wrong prefix": wrong,
    }


def decoded(segment: str) -> str:
    return URL.build(path="/" + segment, encoded=True).path[1:]


def routes(app: web.Application, prefix: str = "") -> Iterator[tuple[str, str, bool]]:
    """(method, canonical path, is the console's) of every route, sub-applications included."""
    for resource in app.router.resources():
        info = resource.get_info()
        if "app" in info:  # a sub-application (the console)
            for method, path, _ in routes(info["app"], prefix + info["prefix"]):
                yield method, path, True
            continue
        for route in resource:
            if route.method != "HEAD":
                yield route.method, prefix + resource.canonical, False


def placeholders(path: str) -> list[str]:
    return [part[1:-1].partition(":")[0] for part in path.split("/") if part.startswith("{")]


def id_routes(app: web.Application) -> list[tuple[str, str, bool]]:
    return [r for r in routes(app) if set(placeholders(r[1])) & set(ID_PLACEHOLDERS)]


def filled(path: str, segment: str) -> str:
    parts = []
    for part in path.split("/"):
        name = part[1:-1].partition(":")[0] if part.startswith("{") else None
        parts.append(part if name is None else FILLED.get(name, segment))
    return "/".join(parts)


class StoreSpy:
    """Every string the store's methods are handed that no id grammar allows (a NUL, a
    character outside printable ASCII, more than 512 characters): none may get there."""

    def __init__(self, gate: Opgate, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached: list[str] = []
        store = gate.running.gateway.store
        for name in dir(type(store)):
            real = getattr(store, name)
            if name.startswith("_") or not callable(real):
                continue
            monkeypatch.setattr(store, name, self._spying(real))

    def _spying(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def spied(*args: Any, **kwargs: Any) -> Any:
            for value in (*args, *kwargs.values()):
                if isinstance(value, str) and not _plausible(value):
                    self.reached.append(value)
            return real(*args, **kwargs)

        return spied


def _plausible(value: str) -> bool:
    return len(value) <= 512 and all(" " <= c <= "~" for c in value)


@pytest_asyncio.fixture
async def gate(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Opgate]:
    """opgate with every entry point served: the mandates API (an issuer), the audit bundle
    (a transparency key), the console."""
    monkeypatch.setenv("OPGATE_SECRET_TRANSPARENCY_KEY", TRANSPARENCY.skey())
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, **mandate_settings(tmp_path)
    ) as running:
        yield running


def request_records(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "request"]


async def test_every_route_placeholder_is_a_known_kind_of_id_or_none(gate: Opgate) -> None:
    """A route added with a placeholder this test does not know fails here, so its id is
    given a kind (and the tries below) before it ships."""
    gateway = gate.running.gateway
    found = {
        name
        for app in (agent_app(gateway), ops_app(gateway))
        for _, path, _ in routes(app)
        for name in placeholders(path)
    }
    assert found <= set(ID_PLACEHOLDERS) | set(NOT_IDS), found
    assert len(id_routes(agent_app(gateway))) >= 4
    assert len(id_routes(ops_app(gateway))) >= 10


async def test_an_agent_route_refuses_each_bad_id_on_record(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each agent-listener route with an id in its path answers each bad id with a 4xx
    problem and one audit record denying it; the id reaches no store call."""
    spy = StoreSpy(gate, monkeypatch)
    tried = 0
    for method, path, _ in id_routes(agent_app(gate.running.gateway)):
        [kind] = [ID_PLACEHOLDERS[n] for n in placeholders(path) if n in ID_PLACEHOLDERS]
        for scenario, segment in bad_segments(kind).items():
            headers: list[tuple[str, bytes | str]] = [("Authorization", f"Bearer {AGENT_TOKEN}")]
            body = b"{}" if method == "POST" else b""
            if body:
                headers.append(("Content-Type", "application/json"))
            with capture_logs() as logs:
                response = await exchange(
                    gate.agent_url, request_bytes(method, filled(path, segment), headers, body)
                )
            where = f"{method} {path}: {scenario}"
            assert 400 <= response.status < 500, (where, response.status, response.body)
            assert response.headers["Content-Type"] == "application/problem+json", where
            [record] = request_records(logs)
            assert record["decision"] == "deny", where
            assert record["response_status"] == response.status, where
            assert record["reason"] == response.problem()["code"], where
            tried += 1
    assert spy.reached == []
    assert tried >= 20


async def test_an_ops_route_refuses_each_bad_id(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each operations-listener route with an id in its path (the API's and the console's)
    answers each bad id with a 4xx (problem+json on the API, an error page on the console);
    the id reaches no store call."""
    spy = StoreSpy(gate, monkeypatch)
    tried = 0
    async with aiohttp.ClientSession(
        cookie_jar=aiohttp.CookieJar(unsafe=True), trust_env=False
    ) as browser:
        await sign_in(gate, browser, ADMIN_TOKEN)
        async with browser.get(f"{gate.ops_url}{CONSOLE_PREFIX}/operations") as page:
            csrf = csrf_of(await page.text())
        for method, path, console in id_routes(ops_app(gate.running.gateway)):
            [kind] = [ID_PLACEHOLDERS[n] for n in placeholders(path) if n in ID_PLACEHOLDERS]
            for scenario, segment in bad_segments(kind).items():
                url = URL(gate.ops_url + filled(path, segment), encoded=True)
                where = f"{method} {path}: {scenario}"
                if console:
                    form = {"csrf_token": csrf, "note": "n", "verdict": "failed"}
                    data = form if method == "POST" else None
                    async with browser.request(
                        method, url, data=data, allow_redirects=False
                    ) as response:
                        assert 400 <= response.status < 500, (where, response.status)
                        assert response.content_type == "text/html", where
                else:
                    async with gate.http.request(
                        method, url, json={} if method == "POST" else None, headers=admin_headers()
                    ) as response:
                        assert 400 <= response.status < 500, (where, await response.text())
                        assert response.content_type == "application/problem+json", where
                tried += 1
    assert spy.reached == []
    assert tried >= 50


BAD_VALUES = {
    "nul": "op\x00x",
    "overlong": "o" * 256,
    "odd unicode": "op_\u202ex\u0301",
    "empty": "",
}


@pytest.mark.parametrize(
    ("path", "field", "extra"),
    [
        pytest.param(
            "/v1/explain", "operation_id", {"method": "POST", "path": REFUND}, id="explain"
        ),
        pytest.param(
            "/v1/operations",
            "operation_id",
            {
                "tenant": "t1",
                "provider": "fault",
                "action": "refund.create",
                "amount": 500,
                "currency": "usd",
                "params": {"charge": "ch_1"},
                "approval_ref": "ticket-1",
                "approved_by": "alice@example.com",
                "ttl_seconds": 600,
            },
            id="create",
        ),
    ],
)
async def test_an_id_in_an_ops_body_is_refused(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch, path: str, field: str, extra: dict[str, Any]
) -> None:
    """An operation id in an operations API body (explain, create, supersedes, idempotency
    key) that no id can be is 400, before the store."""
    spy = StoreSpy(gate, monkeypatch)
    fields = [field] if path == "/v1/explain" else [field, "supersedes", "idempotency_key"]
    for name in fields:
        for scenario, bad in BAD_VALUES.items():
            async with gate.http.post(
                f"{gate.ops_url}{path}", json={**extra, name: bad}, headers=admin_headers()
            ) as response:
                body = await response.json(content_type=None)
                assert response.status == 400, (name, scenario, body)
                assert response.content_type == "application/problem+json"
    assert spy.reached == []


async def test_an_id_in_an_audit_query_is_refused(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit API's ``operation``, ``record`` and ``size`` never reach a query unread: 4xx
    (a record named with a NUL, and a size past a bigint, answered 500)."""
    spy = StoreSpy(gate, monkeypatch)
    for query in ("operation=op%00x", "operation=" + "o" * 256, "operation=%E2%80%AE"):
        url = URL(f"{gate.ops_url}/v1/audit/bundle?{query}", encoded=True)
        async with gate.http.get(url, headers=admin_headers()) as response:
            body = await response.json(content_type=None)
            assert (response.status, body["code"]) == (400, "operation_id_invalid"), body
    for record in ("a%00b:1", "requests%2F%E2%80%AE:1", "policy:99999999999999999999"):
        url = URL(f"{gate.ops_url}/v1/audit/proof?record={record}", encoded=True)
        async with gate.http.get(url, headers=admin_headers()) as response:
            assert response.status == 404, (record, await response.text())
    for size in ("size=9999999999999999999", "size=%D9%A1"):  # past a bigint; an Arabic one
        url = URL(f"{gate.ops_url}/v1/audit/proof?record=policy:1&{size}", encoded=True)
        async with gate.http.get(url, headers=admin_headers()) as response:
            assert response.status == 404, (size, await response.text())
    assert spy.reached == []


@pytest.mark.parametrize("header", ["X-Operation-Id", "Idempotency-Key"])
async def test_an_id_in_a_gate_header_is_refused_on_record(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch, header: str
) -> None:
    """The gate's X-Operation-Id and idempotency key: each bad one a 400 problem with its
    audit record, before any lookup."""
    spy = StoreSpy(gate, monkeypatch)
    values = {"nul": b"op\x00x", "overlong": b"o" * 256, "odd unicode": "op_\u202e".encode()}
    for scenario, value in values.items():
        headers: list[tuple[str, bytes | str]] = [
            ("Authorization", f"Bearer {AGENT_TOKEN}"),
            ("Content-Type", "application/x-www-form-urlencoded"),
            (header, value),
        ]
        with capture_logs() as logs:
            response = await exchange(
                gate.agent_url, request_bytes("POST", REFUND, headers, GOOD_BODY.encode())
            )
        assert response.status == 400, (scenario, response.body)
        [record] = request_records(logs)
        assert (record["decision"], record["response_status"]) == ("deny", 400), scenario
    assert spy.reached == []


def id_arguments() -> list[tuple[str, str]]:
    """(tool, argument) of every MCP tool argument that names an id, from the tools' schemas."""
    return [
        (tool.name, name)
        for tool in TOOLS
        for name in (tool.input_schema.get("properties") or {})
        if name.endswith("_id")
    ]


async def mcp_tool_call(gate: Opgate, tool: str, arguments: dict[str, Any]) -> tuple[int, Any]:
    return await mcp_request(gate, "tools/call", {"name": tool, "arguments": arguments})


async def mcp_request(gate: Opgate, method: str, params: dict[str, Any]) -> tuple[int, Any]:
    """One JSON-RPC request (2025-06-18 framing, the agent's static token)."""
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with gate.http.post(
        f"{gate.agent_url}/_opgate/mcp",
        json=message,
        headers={
            "Authorization": f"Bearer {AGENT_TOKEN}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        },
    ) as response:
        return response.status, await response.json(content_type=None)


async def test_an_mcp_tool_refuses_each_bad_id_on_record(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each MCP tool argument that names an id (from the tools' schemas) answers each bad id
    with an error (a tool error or a JSON-RPC one), and the exchange leaves a record denying
    it; the id reaches no store call."""
    spy = StoreSpy(gate, monkeypatch)
    arguments = id_arguments()
    assert {("get_operation", "operation_id"), ("get_proposal", "proposal_id")} <= set(arguments)
    for tool, name in arguments:
        for scenario, bad in {**BAD_VALUES, "wrong prefix": "op_refund_42"}.items():
            if name == "operation_id" and scenario == "wrong prefix":
                bad = "prop_refund_42"
            with capture_logs() as logs:
                status, answer = await mcp_tool_call(gate, tool, {name: bad})
            where = f"{tool}.{name}: {scenario}"
            assert status == 200, (where, answer)
            refused = "error" in answer or answer["result"].get("isError") is True
            assert refused, (where, answer)
            records = request_records(logs)
            assert [r["decision"] for r in records] == ["deny"], (where, records)
    assert spy.reached == []


async def test_an_mcp_task_method_refuses_each_bad_id_as_not_found(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tasks/get, tasks/update and tasks/cancel (the extension's own methods) answer each bad
    task id -32602, as an unknown task; the id reaches no store call."""
    spy = StoreSpy(gate, monkeypatch)
    methods = {binding.method for binding in OperationTasks(lambda ctx: None).methods()}  # type: ignore[arg-type, return-value]
    assert methods == {"tasks/get", "tasks/update", "tasks/cancel"}
    send = {
        "tasks/get": get_task,
        "tasks/cancel": cancel_task,
        "tasks/update": lambda client, task_id: update_task(client, task_id, {}),
    }
    async with tasks_client(gate.agent_url, AGENT_TOKEN) as client:
        for method in sorted(methods):
            for scenario, bad in {**BAD_VALUES, "wrong prefix": "prop_refund_42"}.items():
                with pytest.raises(MCPError) as refused:
                    await send[method](client, bad)
                assert refused.value.error.code == -32602, (method, scenario, refused.value)
    assert spy.reached == []


async def test_an_mcp_resource_uri_with_a_bad_id_is_not_found_on_record(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resources/read of opgate://operations/{id} with each bad id is a JSON-RPC error (not
    found, or the SDK's own refusal of the URI) and one record; the id reaches no store call."""
    spy = StoreSpy(gate, monkeypatch)
    for scenario, bad in {**BAD_VALUES, "wrong prefix": "prop_refund_42"}.items():
        with capture_logs() as logs:
            status, answer = await mcp_request(
                gate, "resources/read", {"uri": f"opgate://operations/{bad}"}
            )
        assert status == 200, (scenario, answer)
        assert answer["error"]["code"] == -32602, (scenario, answer)
        assert [r["decision"] for r in request_records(logs)] == ["deny"], scenario
    assert spy.reached == []


def test_the_bad_values_are_what_they_say() -> None:
    """The tries hold what their names say: a NUL, 256 characters, a bidi control and a
    combining mark, an empty id."""
    assert "\x00" in BAD_VALUES["nul"]
    assert len(BAD_VALUES["overlong"]) == 256
    assert {unicodedata.category(c) for c in BAD_VALUES["odd unicode"][3:]} >= {"Cf", "Mn"}
    assert decoded(bad_segments(IdKind.OPERATION)["nul"]) == "op_x\x00y"
    assert json.dumps(BAD_VALUES["empty"]) == '""'
