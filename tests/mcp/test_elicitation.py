"""The human approves where the agent asked: the official client, which supports URL-mode
elicitation, proposes a refund over MCP; opgate asks it to open the proposal's approval page;
the approver approves it there in real headless Chromium; the client's retry learns the
operation id. A client without it gets the pending proposal, as before."""

from __future__ import annotations

from typing import Any

import httpx2
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from proxy.gate.identity import token_digest
from proxy.mcp.elicitation import approval_request
from tests.console.helpers import NEEDS_BROWSER
from tests.support.browser import click, in_browser, sign_in
from tests.support.killable_opgate import free_port
from tests.support.localstripe_server import create_charge
from tests.support.mcp_client import http_client, structured
from tests.support.opgate import AGENT_TOKEN, SHIPPED_POLICIES, StartOpgate

APPROVER_TOKEN = "opg_test_console_approver_0123456789"


def _proposal(**changed: Any) -> dict[str, Any]:
    return {
        "proposal_id": "prop_0123",
        "provider": "stripe",
        "action": "refund.create",
        "target": {"method": "POST", "path": "/v1/refunds", "path_params": {}},
        "amount": 600,
        "currency": "usd",
        **changed,
    }


@pytest.mark.parametrize(
    ("proposal", "named"),
    [
        (_proposal(), ["6.00 USD", "POST /v1/refunds", "refund.create", "stripe"]),
        (_proposal(currency="jpy", amount=1099), ["1099 JPY"]),
        (_proposal(currency=None, amount=500), ["500 (minor units, no currency)"]),
        (_proposal(currency=None, amount=None), ["no amount"]),
        (
            _proposal(target={"method": "POST", "path": "/v1/refunds/re_\u202e1/cancel"}),
            ["POST /v1/refunds/re_\\u202e1/cancel"],
        ),
    ],
)
def test_the_approval_prompt_names_the_amount_as_money_its_currency_and_the_target(
    proposal: dict[str, Any], named: list[str]
) -> None:
    """The user who is asked to open the approval page reads what it approves: the amount as
    money with its currency, the method and path, the action and the provider; text a
    client's user would read backwards (bidi controls) is shown escaped."""
    message = approval_request("https://console.example.test", proposal).params.message
    for text in named:
        assert text in message, message
    assert "\u202e" not in message


@NEEDS_BROWSER
async def test_a_proposal_over_mcp_is_approved_on_the_page_the_client_was_sent_to(
    start_opgate: StartOpgate, localstripe_url: str, chrome: Any
) -> None:
    """URL elicitation names the console's page of this proposal; approving it in Chromium
    completes the retried call with the operation id and next_action send."""
    from selenium.webdriver.common.by import By

    port = free_port()
    ops = f"http://127.0.0.1:{port}"
    charge = await create_charge(localstripe_url, 2000)
    asked: list[types.ElicitRequestParams] = []
    seen: dict[str, Any] = {}

    def approve_in_console(url: str, proposal_id: str) -> None:
        sign_in(chrome, ops, APPROVER_TOKEN, "olga")
        chrome.get(url)
        assert chrome.find_element(By.ID, "proposal-id").text == proposal_id
        chrome.find_element(By.ID, "note").send_keys("ok")
        click(chrome, chrome.find_element(By.ID, "approve"))
        seen["operation"] = chrome.find_element(By.ID, "operation-id").text

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        assert isinstance(params, types.ElicitRequestURLParams)
        proposal_id = params.url.rpartition("/proposals/")[2]
        await in_browser(lambda: approve_in_console(params.url, proposal_id))
        return types.ElicitResult(action="accept")

    arguments = {
        "provider": "stripe",
        "action": "refund.create",
        "amount": 500,
        "params": {"charge": charge},
        "reason": "order 1042 was charged twice",
    }
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES,
        upstream_overrides={"stripe": localstripe_url},
        approvers=[{"name": "olga@example.com", "token_sha256": token_digest(APPROVER_TOKEN)}],
        ops_listen=f"127.0.0.1:{port}",
        console_url=f"{ops}/console",
    ) as gate:
        async with (
            httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {AGENT_TOKEN}"}, trust_env=False, timeout=60
            ) as http,
            Client(
                streamable_http_client(f"{gate.agent_url}/_opgate/mcp", http_client=http),
                elicitation_callback=on_elicit,
            ) as client,
        ):
            answer = await client.call_tool("propose_operation", arguments)
        async with http_client(gate.agent_url, AGENT_TOKEN) as plain:
            pending = structured(await plain.call_tool("propose_operation", arguments))
    [request] = asked
    assert isinstance(request, types.ElicitRequestURLParams)
    assert request.url.startswith(f"{ops}/console/proposals/")
    view = structured(answer)
    assert (view["status"], view["next_action"]) == ("approved", "send")
    assert view["operation_id"] == seen["operation"]
    assert (pending["status"], pending["next_action"]) == ("pending", "wait")
