"""What the MCP transport and base protocol require of a server, as the official conformance
suite checks it: a present ``Origin`` not on the allowlist is 403 (absent is allowed); an
unknown tool is the protocol error -32602; the capabilities say the same on both eras and
over stdio; the stdio relay names opgate's version."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError
from structlog.testing import capture_logs

from proxy.mcp.origins import origin_allowed
from tests.support.environment import inherited
from tests.support.mcp_client import stdio_client
from tests.support.mcp_wire import call, post
from tests.support.opgate import AGENT_TOKEN, SHIPPED_POLICIES, Opgate, StartOpgate
from tests.support.paths import REPO

LISTED = "https://agents.example.com"
HANDSHAKE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}


@pytest_asyncio.fixture(loop_scope="session")
async def gate(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[Opgate]:
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES,
        upstream_overrides={"stripe": localstripe_url},
        mcp_allowed_origins=[LISTED],
    ) as gate:
        yield gate


async def test_a_present_origin_not_listed_is_403_on_record_before_the_protocol(
    stripe_gate: Opgate,
) -> None:
    """The conformance suite's case: the agent's token and Origin http://evil.example.com on
    an initialize is 403 problem+json (mcp_origin_refused), denied on record; without
    Origin the same request is answered."""
    with capture_logs() as logs:
        refused = await post(
            stripe_gate.http,
            stripe_gate.agent_url,
            AGENT_TOKEN,
            HANDSHAKE,
            {"Origin": "http://evil.example.com"},
        )
    answered = await post(stripe_gate.http, stripe_gate.agent_url, AGENT_TOKEN, HANDSHAKE)
    status, content_type, problem = refused
    assert (status, content_type) == (403, "application/problem+json"), refused
    assert problem["code"] == "mcp_origin_refused"
    assert "evil.example.com" not in json.dumps(problem)  # request bytes are never echoed
    [record] = [entry for entry in logs if entry["event"] == "request"]
    assert (record["decision"], record["reason"], record["response_status"]) == (
        "deny",
        "mcp_origin_refused",
        403,
    )
    assert answered[0] == 200
    assert answered[2]["result"]["serverInfo"]["name"] == "opgate"


@pytest.mark.parametrize(
    ("origins", "status"),
    [
        ([LISTED], 200),
        ([LISTED.upper()], 200),  # scheme and host are case-insensitive
        ([LISTED + ":443"], 403),  # an origin is compared as sent, not normalised
        ([LISTED + "/"], 403),
        (["null"], 403),
        ([LISTED, LISTED], 403),  # two Origin headers: ambiguous
        (["https://agents.example.com.evil.test"], 403),
    ],
)
async def test_only_a_listed_origin_is_answered(
    gate: Opgate, origins: list[str], status: int
) -> None:
    """With an allowlist, a single listed Origin is answered; anything else present is 403."""
    headers = [("Origin", origin) for origin in origins]
    sent = {
        "Authorization": f"Bearer {AGENT_TOKEN}",
        "Accept": "application/json, text/event-stream",
    }
    async with gate.http.post(
        f"{gate.agent_url}/_opgate/mcp", json=HANDSHAKE, headers=[*sent.items(), *headers]
    ) as response:
        assert response.status == status, await response.text()


_ORIGIN_CHARS = st.sampled_from("ahtps:/.AHTPSgentsxmplco0123456789-")


@given(
    allowed=st.lists(st.text(_ORIGIN_CHARS, min_size=1, max_size=40), max_size=3),
    presented=st.lists(st.text(_ORIGIN_CHARS, max_size=40), max_size=3),
)
def test_an_origin_is_allowed_only_when_absent_or_one_and_listed(
    allowed: list[str], presented: list[str]
) -> None:
    """No Origin: allowed; exactly one that equals a listed origin (ignoring case): allowed;
    anything else (two, an empty one, a trimmed or extended one): refused."""
    listed = {origin.lower() for origin in allowed}
    expected = not presented or (len(presented) == 1 and presented[0].lower() in listed)
    assert origin_allowed(presented, allowed) is expected


@given(st.integers(0, len(LISTED) - 1), st.integers(1, 5))
def test_a_trimmed_or_extended_listed_origin_is_refused(cut: int, extra: int) -> None:
    """Withholding or appending characters of a listed origin never passes."""
    assert origin_allowed([LISTED[:cut]], [LISTED]) is False
    assert origin_allowed([LISTED + "x" * extra], [LISTED]) is False
    assert origin_allowed([LISTED, LISTED], [LISTED]) is False
    assert origin_allowed([LISTED], [LISTED]) is True


@pytest.mark.parametrize("era", ["handshake", "modern"])
async def test_an_unknown_tool_is_the_protocol_error_invalid_params(
    stripe_gate: Opgate, era: str
) -> None:
    """tools/call of a tool opgate does not have is JSON-RPC -32602, not a tool result, and
    denied on record."""
    params = {"name": "no_such_tool", "arguments": {}}
    with capture_logs() as logs:
        if era == "modern":
            answer = await call(
                stripe_gate.http, stripe_gate.agent_url, AGENT_TOKEN, "tools/call", params
            )
        else:
            body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
            headers = {"MCP-Protocol-Version": "2025-06-18"}
            _, _, answer = await post(
                stripe_gate.http, stripe_gate.agent_url, AGENT_TOKEN, body, headers
            )
    assert "result" not in answer, answer
    assert answer["error"]["code"] == -32602
    [record] = [entry for entry in logs if entry["event"] == "request"]
    assert (record["decision"], record["reason"]) == ("deny", "mcp_request_invalid")


async def test_over_stdio_an_unknown_tool_is_the_protocol_error_invalid_params(
    stripe_gate: Opgate,
) -> None:
    """The relay hands opgate's -32602 on as it is."""
    async with stdio_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("no_such_tool", {})
    assert refused.value.error.code == -32602


def _said(capabilities: dict[str, Any]) -> dict[str, Any]:
    """What a capability object promises of change notifications (absent reads as false)."""
    return {
        kind: bool((capabilities.get(kind) or {}).get("listChanged"))
        for kind in ("tools", "resources", "prompts")
    }


async def _stdio_capabilities(agent_url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The relay's initialize answer (capabilities and serverInfo), raw."""
    env = inherited()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "proxy", "mcp", "--url", agent_url, "--token", AGENT_TOKEN),
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        child.stdin.write(json.dumps(HANDSHAKE).encode() + b"\n")
        await child.stdin.drain()
        async with asyncio.timeout(20):
            answer = json.loads(await child.stdout.readline())
    finally:
        child.stdin.close()
        if child.returncode is None:
            child.terminate()
        await child.wait()
    result: dict[str, Any] = answer["result"]
    return result["capabilities"], result["serverInfo"]


async def test_capabilities_say_the_same_on_both_eras_and_over_stdio(
    stripe_gate: Opgate,
) -> None:
    """server/discover, initialize and the stdio relay's initialize promise the same list
    change notifications: none, since opgate never sends them."""
    discovered = await call(stripe_gate.http, stripe_gate.agent_url, AGENT_TOKEN, "server/discover")
    _, _, handshake = await post(stripe_gate.http, stripe_gate.agent_url, AGENT_TOKEN, HANDSHAKE)
    relayed, _ = await _stdio_capabilities(stripe_gate.agent_url)
    nothing = {"tools": False, "resources": False, "prompts": False}
    assert _said(discovered["result"]["capabilities"]) == nothing, discovered
    assert _said(handshake["result"]["capabilities"]) == nothing
    assert _said(relayed) == nothing


async def test_the_stdio_relay_names_opgate_and_its_version(stripe_gate: Opgate) -> None:
    """The relay's serverInfo is opgate's name and version, as the HTTP endpoint's is."""
    _, server_info = await _stdio_capabilities(stripe_gate.agent_url)
    assert server_info == {"name": "opgate", "version": version("opgate")}
