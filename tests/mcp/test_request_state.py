"""The ``requestState`` of ``propose_operation``'s multi round-trip answer, as an agent could
present it back: only the unchanged state, with the arguments it was issued for, by the agent
it was issued to, is read; a retry with other arguments, a tampered, trimmed or foreign state
is a JSON-RPC error (-32602) on record, never an answer about some proposal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import pytest_asyncio
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from structlog.testing import capture_logs

from proxy.gate.checks import Agent
from proxy.mcp.request_state import sealing_boundary
from tests.support.localstripe_server import create_charge
from tests.support.mcp_wire import URL_ELICITATION, call_tool
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    SECOND_AGENT_TOKEN,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
)

CONSOLE = "https://console.example.test/console"
ACCEPTED = {"approval": {"action": "accept"}}


@pytest_asyncio.fixture(loop_scope="session")
async def gate(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[Opgate]:
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES,
        upstream_overrides={"stripe": localstripe_url},
        console_url=CONSOLE,
    ) as gate:
        yield gate


async def approve(gate: Opgate, proposal_id: str) -> None:
    async with gate.http.post(
        f"{gate.ops_url}/v1/proposals/{proposal_id}/approve",
        json={"decided_by": "alice@example.com"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        assert response.status in (200, 201), await response.text()


def refund(charge: str, amount: int) -> dict[str, Any]:
    return {
        "provider": "stripe",
        "action": "refund.create",
        "amount": amount,
        "params": {"charge": charge},
        "reason": "the customer was charged twice",
    }


async def asked(gate: Opgate, token: str, arguments: dict[str, Any]) -> tuple[str, str]:
    """Propose from a client with URL elicitation: the sealed state and the proposal id (from
    the approval page's address)."""
    answer = await call_tool(
        gate.http,
        gate.agent_url,
        token,
        "propose_operation",
        arguments,
        capabilities=URL_ELICITATION,
    )
    result = answer["result"]
    assert result["resultType"] == "input_required", answer
    url = result["inputRequests"]["approval"]["params"]["url"]
    return result["requestState"], url.rpartition("/proposals/")[2]


async def retry(gate: Opgate, token: str, arguments: dict[str, Any], state: Any) -> dict[str, Any]:
    return await call_tool(
        gate.http,
        gate.agent_url,
        token,
        "propose_operation",
        arguments,
        capabilities=URL_ELICITATION,
        requestState=state,
        inputResponses=ACCEPTED,
    )


async def test_a_retry_with_other_arguments_is_a_protocol_error_not_the_earlier_proposal(
    gate: Opgate, localstripe_url: str
) -> None:
    """Proposed at 1.00, approved; the retry carrying that state with amount 9.00 is -32602
    (denied on record), while the retry with the arguments it was issued for is told
    approved, send."""
    charge = await create_charge(localstripe_url, 2000)
    state, proposal_id = await asked(gate, AGENT_TOKEN, refund(charge, 100))
    await approve(gate, proposal_id)
    with capture_logs() as logs:
        other = await retry(gate, AGENT_TOKEN, refund(charge, 900), state)
    same = await retry(gate, AGENT_TOKEN, refund(charge, 100), state)
    assert "result" not in other, other
    assert other["error"]["code"] == -32602
    [record] = [entry for entry in logs if entry["event"] == "request"]
    assert (record["decision"], record["reason"]) == ("deny", "mcp_request_invalid")
    view = same["result"]["structuredContent"]
    assert (view["status"], view["next_action"]) == ("approved", "send")


def _flipped(state: str) -> str:
    middle = len(state) // 2
    return state[:middle] + ("A" if state[middle] != "A" else "B") + state[middle + 1 :]


@pytest.mark.parametrize(
    "presented",
    [
        "tampered",
        "trimmed",
        "extended",
        "another agent's",
        "another tenant's",
        "the bare proposal id",
        "not a string",
    ],
)
async def test_a_state_that_is_not_the_one_issued_is_a_protocol_error(
    gate: Opgate, localstripe_url: str, presented: str
) -> None:
    """Each presentation is -32602, never a tool result naming a proposal."""
    charge = await create_charge(localstripe_url, 2000)
    arguments = refund(charge, 100)
    state, proposal_id = await asked(gate, AGENT_TOKEN, arguments)
    theirs = {
        "another agent's": SECOND_AGENT_TOKEN,  # same tenant, another agent
        "another tenant's": OTHER_TENANT_TOKEN,
    }
    token = AGENT_TOKEN
    sent: Any
    if presented == "tampered":
        sent = _flipped(state)
    elif presented == "trimmed":
        sent = state[:-3]
    elif presented == "extended":
        sent = state + "AA"
    elif presented in theirs:
        sent, token = state, theirs[presented]  # their client presents A's state
    elif presented == "the bare proposal id":
        sent = proposal_id
    else:
        sent = {"proposal_id": proposal_id}
    answer = await retry(gate, token, arguments, sent)
    assert "result" not in answer, answer
    assert answer["error"]["code"] == -32602


# -- the boundary alone, as hypothesis presents it -----------------------------------------

ISSUED_TO = Agent(agent_id="agent-a", tenant="t1")
ISSUED_FOR = {"provider": "stripe", "action": "refund.create", "amount": 100, "reason": "twice"}
PLAINTEXT = "prop_0123456789abcdef01234567"


class _Presented:
    """What the boundary reads a principal from (the endpoint reads the exchange's agent)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent


def _context(params: dict[str, Any], agent: Agent) -> ServerRequestContext[Any, Any]:
    return ServerRequestContext(
        session=cast(Any, None),
        lifespan_context={},
        protocol_version="2026-07-28",
        method="tools/call",
        params=params,
        request=_Presented(agent),
    )


# The states below are issued when the module is imported (collection), and read when the
# property test runs, which in a whole-suite run on a loaded machine came more than 600 s later:
# the states had expired and the test failed. A time to live no run reaches.
_BOUNDARY = sealing_boundary(
    b"k" * 32, 30 * 86400.0, lambda ctx: cast(_Presented, ctx.request).agent
)


def _issue(arguments: dict[str, Any], agent: Agent) -> str:
    """A state as the boundary seals it on the way out (minting, kept apart from checking)."""

    async def handler(ctx: ServerRequestContext[Any, Any]) -> Any:
        return {"resultType": "input_required", "inputRequests": {}, "requestState": PLAINTEXT}

    params = {"name": "propose_operation", "arguments": arguments}
    sealed = asyncio.run(_BOUNDARY(_context(params, agent), handler))
    state: str = sealed["requestState"]
    return state


SAME_TENANT = Agent(agent_id="agent-c", tenant="t1")
OTHER_TENANT = Agent(agent_id="agent-a", tenant="t2")
OTHER_ARGUMENTS = {**ISSUED_FOR, "amount": 900}
ISSUED = _issue(ISSUED_FOR, ISSUED_TO)
FOR_OTHER_ARGUMENTS = _issue(OTHER_ARGUMENTS, ISSUED_TO)
FOR_ANOTHER_AGENT = _issue(ISSUED_FOR, SAME_TENANT)
# each state, and what it was issued for: the only presentation of it that is read
ISSUES = {
    ISSUED: (ISSUED_FOR, ISSUED_TO),
    FOR_OTHER_ARGUMENTS: (OTHER_ARGUMENTS, ISSUED_TO),
    FOR_ANOTHER_AGENT: (ISSUED_FOR, SAME_TENANT),
}


def _read(state: Any, name: str, arguments: Any, agent: Agent) -> dict[str, Any] | None:
    """What the handler sees of the retry (its params), or None: refused with -32602."""
    seen: list[dict[str, Any]] = []

    async def handler(ctx: ServerRequestContext[Any, Any]) -> Any:
        seen.append(dict(ctx.params or {}))
        return {}

    params = {"name": name, "arguments": arguments, "requestState": state}
    try:
        asyncio.run(_BOUNDARY(_context(params, agent), handler))
    except MCPError as exc:
        refused = exc.error.code
    else:
        refused = None
    if refused is not None:
        assert (refused, seen) == (-32602, [])
        return None
    [params_seen] = seen
    return params_seen


_TEXT = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")


@st.composite
def _states(draw: st.DrawFn) -> str:
    """The issued state as it may come back: whole, trimmed, cut, duplicated, with characters
    replaced or inserted, or swapped for a state issued for other arguments or another agent."""
    how = draw(st.sampled_from(["whole", "whole", "trim", "cut", "duplicate", "replace", "swap"]))
    how = "insert" if how == "replace" and draw(st.booleans()) else how
    state = ISSUED
    if how == "trim":
        return state[: draw(st.integers(0, len(state) - 1))]
    if how == "cut":
        start = draw(st.integers(0, len(state) - 1))
        end = draw(st.integers(start + 1, len(state)))
        return state[:start] + state[end:]
    if how == "duplicate":
        return state + state[draw(st.integers(0, len(state) - 1)) :]
    if how in ("replace", "insert"):
        at = draw(st.integers(0, len(state) - 1))
        text = draw(_TEXT.filter(bool).map(lambda t: t[:4]))
        return state[:at] + text + state[at + (how == "replace") * len(text) :]
    if how == "swap":
        return draw(st.sampled_from([FOR_OTHER_ARGUMENTS, FOR_ANOTHER_AGENT]))
    return state


@st.composite
def _arguments(draw: st.DrawFn) -> dict[str, Any]:
    """The arguments of the retry: as issued (in any key order), or with one withheld, one
    changed, or one added."""
    keys = draw(st.permutations(list(ISSUED_FOR)))
    arguments = {key: ISSUED_FOR[key] for key in keys}
    how = draw(st.sampled_from(["same", "same", "withhold", "change", "add"]))
    if how == "withhold":
        del arguments[draw(st.sampled_from(keys))]
    elif how == "change":
        key = draw(st.sampled_from(keys))
        arguments[key] = draw(
            st.one_of(st.integers(), _TEXT).filter(lambda v: v != ISSUED_FOR[key])
        )
    elif how == "add":
        arguments[draw(_TEXT.filter(lambda k: k not in ISSUED_FOR))] = draw(st.integers())
    return arguments


@settings(max_examples=300, deadline=None)
@example(ISSUED, dict(reversed(ISSUED_FOR.items())), "propose_operation", ISSUED_TO)
@example(FOR_ANOTHER_AGENT, ISSUED_FOR, "propose_operation", SAME_TENANT)
@example(FOR_OTHER_ARGUMENTS, ISSUED_FOR, "propose_operation", ISSUED_TO)
@given(
    state=_states(),
    arguments=_arguments(),
    name=st.sampled_from(["propose_operation", "get_proposal"]),
    agent=st.sampled_from([ISSUED_TO, SAME_TENANT, OTHER_TENANT]),
)
def test_only_the_issued_state_with_its_arguments_and_agent_is_read(
    state: str, arguments: dict[str, Any], name: str, agent: Agent
) -> None:
    """A presentation that withholds, trims, duplicates, alters or swaps any part is refused
    -32602; only an issued state, presented with the tool, arguments and agent it was issued
    for, is read as the proposal it names, whatever the order of its arguments."""
    seen = _read(state, name, arguments, agent)
    issued_for = ISSUES.get(state)
    if name != "propose_operation" or issued_for != (arguments, agent):
        event("refused")
        assert seen is None
        return
    event("read")
    assert seen is not None
    assert seen["requestState"] == PLAINTEXT
    assert seen["arguments"] == arguments
