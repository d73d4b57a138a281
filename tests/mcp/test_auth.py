"""The MCP endpoint as an OAuth 2.1 resource server, against real authorization servers in
the test (RS256 and ES256, serving their JWKS): tokens they issue open it, each bad token is
refused with the right WWW-Authenticate, and the RFC 9728 metadata validates."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken, ProtectedResourceMetadata
from structlog.testing import capture_logs

from proxy.mcp.auth import required_scope, task_scope
from proxy.operations.approvals import OperationRequest, plan_operation
from tests.mcp.conftest import approved_refund
from tests.support.killable_opgate import free_port
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.mcp_client import http_client, structured
from tests.support.mcp_tasks import get_task, tasks_client
from tests.support.mcp_wire import TASKS, modern_request, post
from tests.support.oauth_server import AuthorizationServer, authorization_server, issued_token
from tests.support.opgate import AGENT_TOKEN, SHIPPED_POLICIES, Opgate, StartOpgate

RESOURCE = "https://opgate.example/_opgate/mcp"
METADATA = "https://opgate.example/.well-known/oauth-protected-resource/_opgate/mcp"
ALL_SCOPES = "operations:read operations:execute proposals:write"
TASK_CAPABILITIES = {"extensions": {TASKS: {}}}


@dataclass
class OAuthSetup:
    gate: Opgate
    rs256: AuthorizationServer
    es256: AuthorizationServer
    untrusted: AuthorizationServer


def oauth_settings(*servers: AuthorizationServer, static_tokens: bool = True) -> dict[str, Any]:
    return {
        "resource": RESOURCE,
        "static_tokens": static_tokens,
        "issuers": [
            {
                "issuer": server.issuer,
                "jwks_uri": f"{server.url}/jwks.json",
                "subjects": [{"subject": "client-a", "agent_id": "agent-a"}],
            }
            for server in servers
        ],
    }


@pytest_asyncio.fixture
async def oauth(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[OAuthSetup]:
    async with (
        authorization_server("RS256") as rs256,
        authorization_server("ES256") as es256,
        authorization_server("RS256") as untrusted,
        start_opgate(
            policy_dir=SHIPPED_POLICIES,
            upstream_overrides={"stripe": localstripe_url},
            mcp_oauth=oauth_settings(rs256, es256),
        ) as gate,
    ):
        yield OAuthSetup(gate, rs256, es256, untrusted)


async def post_tool_call(gate: Opgate, token: str, tool: str, arguments: dict[str, Any]) -> Any:
    """One raw tools/call exchange (2025-06-18 framing): status, WWW-Authenticate, body."""
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    async with gate.http.post(
        f"{gate.agent_url}/_opgate/mcp",
        json=message,
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        },
    ) as response:
        body = await response.json(content_type=None)
        return response.status, response.headers.get("WWW-Authenticate"), body


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
async def test_a_token_from_a_trusted_issuer_executes_as_the_agent_its_subject_names(
    oauth: OAuthSetup, localstripe_url: str, algorithm: str
) -> None:
    """The official client with an access token from the authorization server's token
    endpoint: the refund is made once, on record as agent-a, tenant t1."""
    server = oauth.rs256 if algorithm == "RS256" else oauth.es256
    token = await issued_token(server, client_id="client-a", resource=RESOURCE, scope=ALL_SCOPES)
    op = await approved_refund(oauth.gate, localstripe_url)
    with capture_logs() as logs:
        async with http_client(oauth.gate.agent_url, token) as client:
            done = await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
    [refund] = await list_refunds(localstripe_url, charge=op["params"]["charge"])
    assert structured(done)["provider_response"]["body"]["id"] == refund["id"]
    records = [e for e in logs if e["event"] == "request" and e.get("operation_id")]
    assert {(e["agent_id"], e["tenant"]) for e in records} == {("agent-a", "t1")}


async def test_each_bad_token_is_refused_401_invalid_token_with_the_metadata_url(
    oauth: OAuthSetup,
) -> None:
    """Wrong audience, expired, wrong issuer, unknown subject, not a JWT: 401
    agent_unauthenticated, WWW-Authenticate naming resource_metadata and invalid_token."""
    rs = oauth.rs256
    tokens = {
        "wrong audience": rs.token("client-a", "https://elsewhere.example/mcp", ALL_SCOPES),
        "expired": await issued_token(
            rs, client_id="client-a", resource=RESOURCE, scope=ALL_SCOPES, expires_in="-120"
        ),
        "wrong issuer": oauth.untrusted.token("client-a", RESOURCE, ALL_SCOPES),
        "unknown subject": rs.token("client-z", RESOURCE, ALL_SCOPES),
        "not a token": "opg_not_a_real_token",
    }
    for scenario, token in tokens.items():
        status, challenge, body = await post_tool_call(oauth.gate, token, "list_operations", {})
        assert status == 401, scenario
        assert body["code"] == "agent_unauthenticated", scenario
        assert challenge == f'Bearer resource_metadata="{METADATA}", error="invalid_token"'


async def test_a_token_without_the_scope_is_refused_403_insufficient_scope(
    oauth: OAuthSetup, localstripe_url: str
) -> None:
    """A read-only token may read but not execute: 403 naming the scope it lacks; nothing
    is sent."""
    token = oauth.rs256.token("client-a", RESOURCE, "operations:read")
    op = await approved_refund(oauth.gate, localstripe_url)
    read = await post_tool_call(
        oauth.gate, token, "get_operation", {"operation_id": op["operation_id"]}
    )
    status, challenge, body = await post_tool_call(
        oauth.gate, token, "execute_operation", {"operation_id": op["operation_id"]}
    )
    assert read[0] == 200
    assert status == 403
    assert body["code"] == "mcp_scope_insufficient"
    assert challenge == (
        f'Bearer resource_metadata="{METADATA}", error="insufficient_scope", '
        'scope="operations:execute"'
    )
    assert await list_refunds(localstripe_url, charge=op["params"]["charge"]) == []


async def test_no_token_is_told_where_the_metadata_is(oauth: OAuthSetup) -> None:
    """Without a token: 401 with resource_metadata (no error code, per RFC 6750)."""
    async with oauth.gate.http.post(
        f"{oauth.gate.agent_url}/_opgate/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}
    ) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == f'Bearer resource_metadata="{METADATA}"'


async def test_the_protected_resource_metadata_validates(oauth: OAuthSetup) -> None:
    """RFC 9728 at /.well-known/oauth-protected-resource/_opgate/mcp: the SDK's own model
    accepts it; it names the resource, both issuers, the scopes, header bearer tokens."""
    url = f"{oauth.gate.agent_url}/.well-known/oauth-protected-resource/_opgate/mcp"
    async with oauth.gate.http.get(url) as response:
        assert response.status == 200
        document = await response.json()
    metadata = ProtectedResourceMetadata.model_validate(document)
    assert str(metadata.resource) == RESOURCE
    assert [str(s).rstrip("/") for s in metadata.authorization_servers] == [
        oauth.rs256.issuer,
        oauth.es256.issuer,
    ]
    assert metadata.scopes_supported == [
        "operations:read",
        "operations:execute",
        "proposals:write",
    ]
    assert metadata.bearer_methods_supported == ["header"]


async def test_a_rotated_key_is_fetched_and_static_tokens_still_work(oauth: OAuthSetup) -> None:
    """After the issuer rotates its key, a token signed with the new one verifies (opgate
    fetches the JWKS again for the unknown key id); the agent's static token still opens
    the endpoint beside OAuth."""
    before = oauth.rs256.token("client-a", RESOURCE, ALL_SCOPES)
    assert (await post_tool_call(oauth.gate, before, "list_operations", {}))[0] == 200
    fetches = oauth.rs256.jwks_fetches
    oauth.rs256.rotate()
    after = oauth.rs256.token("client-a", RESOURCE, ALL_SCOPES)
    assert (await post_tool_call(oauth.gate, after, "list_operations", {}))[0] == 200
    assert oauth.rs256.jwks_fetches == fetches + 1
    assert (await post_tool_call(oauth.gate, AGENT_TOKEN, "list_operations", {}))[0] == 200


async def test_with_static_tokens_off_only_oauth_tokens_open_the_endpoint(
    start_opgate: StartOpgate,
) -> None:
    """static_tokens: false: the agent's opgate token is refused, an access token is not."""
    async with (
        authorization_server("ES256") as es256,
        start_opgate(
            policy_dir=SHIPPED_POLICIES, mcp_oauth=oauth_settings(es256, static_tokens=False)
        ) as gate,
    ):
        static = await post_tool_call(gate, AGENT_TOKEN, "list_operations", {})
        oauth = await post_tool_call(
            gate, es256.token("client-a", RESOURCE, ALL_SCOPES), "list_operations", {}
        )
    assert static[0] == 401
    assert oauth[0] == 200


class MemoryTokens:
    """The client's token storage (TokenStorage), in memory for the test."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def test_the_official_clients_oauth_discovers_the_server_and_gets_a_bound_token(
    start_opgate: StartOpgate, localstripe_url: str
) -> None:
    """The mcp client's own OAuth (client credentials) starts from the 401: it follows
    resource_metadata to the metadata, the authorization server's metadata to its token
    endpoint, asks with resource = the endpoint (RFC 8707) and then lists the tools."""
    port = free_port()
    resource = f"http://127.0.0.1:{port}/_opgate/mcp"
    async with authorization_server("ES256") as es256:
        es256.clients["client-a"] = "s3cret"
        settings = oauth_settings(es256)
        settings["resource"] = resource
        async with start_opgate(
            policy_dir=SHIPPED_POLICIES,
            upstream_overrides={"stripe": localstripe_url},
            agent_listen=f"127.0.0.1:{port}",
            mcp_oauth=settings,
        ) as gate:
            auth = ClientCredentialsOAuthProvider(
                server_url=resource,
                storage=MemoryTokens(),
                client_id="client-a",
                client_secret="s3cret",
                scope=ALL_SCOPES,
                issuer=es256.issuer,
            )
            async with (
                httpx2.AsyncClient(auth=auth, trust_env=False, timeout=30.0) as http,
                Client(streamable_http_client(resource, http_client=http)) as client,
            ):
                tools = await client.list_tools()
    assert gate.agent_url.endswith(str(port))
    assert "execute_operation" in {tool.name for tool in tools.tools}
    [issued] = es256.issued
    assert (issued["sub"], issued["aud"]) == ("client-a", resource)


async def stored_refund(gate: Opgate, localstripe_url: str, operation_id: str) -> None:
    """A refund operation with ``operation_id`` written as the store writes any (as one created
    before ids spelled as another kind's were refused at the operations API)."""
    approval = OperationRequest(
        operation_id=operation_id,
        tenant="t1",
        agent_id="agent-a",
        provider="stripe",
        action="refund.create",
        amount=500,
        params={"charge": await create_charge(localstripe_url, 2000)},
        approval_ref="ticket-1",
        approved_by="alice@example.com",
        ttl_seconds=600,
    )
    gateway = gate.running.gateway
    planned = plan_operation(approval, gateway.policy, datetime.now(UTC))
    assert not isinstance(planned, list), planned
    assert await gateway.store.create(planned, actor="admin") is not None


async def test_a_task_that_is_an_operation_needs_the_operations_scope_whatever_its_spelling(
    oauth: OAuthSetup, localstripe_url: str
) -> None:
    """An operation whose id starts like a proposal's (prop_refund_42) is neither read nor
    cancelled with only proposals:write: the scope follows what the id names, looked up, and
    the refusal is 403 insufficient_scope naming the scope it needs, with one record; a token
    with operations:read reads it."""
    await stored_refund(oauth.gate, localstripe_url, "prop_refund_42")
    token = oauth.rs256.token("client-a", RESOURCE, "proposals:write")
    for method, scope in (("tasks/get", "operations:read"), ("tasks/cancel", "operations:execute")):
        body, headers = modern_request(method, {"taskId": "prop_refund_42"}, TASK_CAPABILITIES)
        with capture_logs() as logs:
            status, _, answer = await post(
                oauth.gate.http, oauth.gate.agent_url, token, body, headers
            )
        assert (status, answer["code"]) == (403, "mcp_scope_insufficient"), (method, answer)
        records = [e for e in logs if e["event"] == "request"]
        assert [(r["decision"], r["reason"]) for r in records] == [
            ("deny", "mcp_scope_insufficient")
        ], method
        assert scope in answer["detail"]
    operation = await oauth.gate.operation("prop_refund_42")
    assert (operation["status"], operation["approval"]["revoked_at"]) == ("created", None)
    reader = oauth.rs256.token("client-a", RESOURCE, "operations:read")
    async with tasks_client(oauth.gate.agent_url, reader) as client:
        task = await get_task(client, "prop_refund_42")
    assert (task["taskId"], task["status"]) == ("prop_refund_42", "working")


async def test_a_scope_found_lacking_after_the_lookup_is_told_as_a_step_up(
    oauth: OAuthSetup, localstripe_url: str
) -> None:
    """The 403 of a task's scope carries the same WWW-Authenticate as one known up front, so
    a client can ask for that scope."""
    await stored_refund(oauth.gate, localstripe_url, "prop_refund_43")
    token = oauth.rs256.token("client-a", RESOURCE, "proposals:write")
    body, headers = modern_request("tasks/get", {"taskId": "prop_refund_43"}, TASK_CAPABILITIES)
    async with oauth.gate.http.post(
        f"{oauth.gate.agent_url}/_opgate/mcp",
        json=body,
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
    ) as response:
        assert response.status == 403
        assert response.headers["WWW-Authenticate"] == (
            f'Bearer resource_metadata="{METADATA}", error="insufficient_scope", '
            'scope="operations:read"'
        )


@pytest.mark.parametrize(
    ("method", "task_id", "before_lookup", "if_operation", "if_proposal"),
    [
        pytest.param("tasks/get", "op_1", "operations:read", "operations:read", None, id="get-op"),
        pytest.param("tasks/get", "prop_1", None, "operations:read", "proposals:write", id="get"),
        pytest.param(
            "tasks/cancel", "prop_1", None, "operations:execute", "proposals:write", id="cancel"
        ),
        pytest.param(
            "tasks/update", "prop_1", None, "operations:execute", "proposals:write", id="update"
        ),
        pytest.param(
            "tasks/cancel", "op_1", "operations:execute", "operations:execute", None, id="op"
        ),
    ],
)
def test_a_tasks_scope_is_chosen_from_what_its_id_names(
    method: str,
    task_id: str,
    before_lookup: str | None,
    if_operation: str,
    if_proposal: str | None,
) -> None:
    """Before the lookup, an id only a proposal's can have defers the choice (None); after it,
    the scope is the operation's or the proposal's, whatever the spelling."""
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"taskId": task_id}}
    assert required_scope(message) == before_lookup
    assert task_scope(method, proposal=False) == if_operation
    if if_proposal is not None:
        assert task_scope(method, proposal=True) == if_proposal
