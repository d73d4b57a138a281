"""A proposal approved in the console, in real headless Chromium, then sent by the official
stripe SDK through opgate to localstripe: exactly one refund, and a re-planned amount after
the approval is refused before Stripe sees it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import requests
import stripe

from proxy.gate.identity import token_digest
from tests.console.helpers import NEEDS_BROWSER
from tests.support.browser import click, in_browser, sign_in
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import AGENT_TOKEN, SHIPPED_POLICIES, Opgate, StartOpgate

pytestmark = NEEDS_BROWSER
APPROVER_TOKEN = "opg_test_console_approver_0123456789"


@pytest_asyncio.fixture(loop_scope="session")
async def gate(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[Opgate]:
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES,
        upstream_overrides={"stripe": localstripe_url},
        approvers=[{"name": "olga@example.com", "token_sha256": token_digest(APPROVER_TOKEN)}],
    ) as running:
        yield running


async def read_proposal(gate: Opgate, proposal_id: str) -> dict[str, Any]:
    status, _, raw = await gate.send(
        f"/_opgate/v1/proposals/{proposal_id}", method="GET", data=None, content_type=None
    )
    assert status == 200
    view: dict[str, Any] = json.loads(raw)
    return view


async def test_a_proposal_approved_in_the_console_is_sent_once_by_the_stripe_sdk(
    gate: Opgate, chrome: Any, localstripe_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The approver sees the exact request on the Proposals page and approves it; the agent is
    told send; the SDK refunding another amount is refused (amount_mismatch, no refund), the
    approved one makes exactly one refund carrying the operation id."""
    from selenium.webdriver.common.by import By

    charge = await create_charge(localstripe_url, 2000)
    body = {
        "provider": "stripe",
        "action": "refund.create",
        "amount": 500,
        "params": {"charge": charge},
        "reason": "order 1042 was charged twice",
    }
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=json.dumps(body), content_type="application/json"
    )
    assert status == 201, raw
    proposed = json.loads(raw)
    proposal_id = proposed["proposal"]["proposal_id"]
    operation_id = proposed["proposal"]["operation_id"]

    def approve_in_console() -> dict[str, Any]:
        # the name typed is not who an approver is: their token says it
        sign_in(chrome, gate.ops_url, APPROVER_TOKEN, "someone else")
        seen: dict[str, Any] = {"who": chrome.find_element(By.ID, "who").text}
        click(chrome, chrome.find_element(By.LINK_TEXT, "Proposals"))
        click(chrome, chrome.find_element(By.LINK_TEXT, proposal_id))
        seen["request"] = json.loads(chrome.find_element(By.ID, "exact-request").text)
        seen["sentence"] = chrome.find_element(By.ID, "sentence").text
        chrome.save_screenshot(str(tmp_path / "proposals.png"))
        chrome.find_element(By.ID, "note").send_keys("checked")
        click(chrome, chrome.find_element(By.ID, "approve"))
        seen["operation"] = chrome.find_element(By.ID, "operation-id").text
        seen["next_action"] = chrome.find_element(By.ID, "next-action").text
        seen["actors"] = [
            e.get_attribute("textContent")
            for e in chrome.find_elements(By.CSS_SELECTOR, "td.actor")
        ]
        chrome.save_screenshot(str(tmp_path / "approved.png"))
        return seen

    seen = await in_browser(approve_in_console)
    assert seen["who"] == "olga@example.com · approver"
    assert seen["request"] == proposed["request"]  # the page shows what the agent was shown
    assert seen["request"]["form"] == {"amount": "500", "charge": charge}
    assert seen["sentence"] == (
        f"Refund 5.00 USD (500 minor units) of charge {charge} at Stripe, asked by agent-a "
        "(tenant t1): "
        "order 1042 was charged twice"
    )
    assert seen["operation"] == operation_id
    assert seen["next_action"].startswith("send")
    assert "human:olga@example.com (approver)" in seen["actors"]

    view = await read_proposal(gate, proposal_id)
    assert (view["status"], view["next_action"]) == ("approved", "send")
    key = view["request"]["headers"]["Idempotency-Key"]

    monkeypatch.setattr(stripe, "enable_telemetry", False)
    session = requests.Session()
    session.trust_env = False
    sdk = stripe.StripeClient(
        AGENT_TOKEN,
        base_addresses={"api": f"{gate.agent_url}/stripe"},
        http_client=stripe.RequestsClient(session=session),
        max_network_retries=0,
    )
    try:
        with pytest.raises(stripe.InvalidRequestError) as refused:
            await asyncio.to_thread(
                sdk.v1.refunds.create,
                params={"charge": charge, "amount": 1500},
                options={"idempotency_key": key},
            )
        assert refused.value.code == "amount_mismatch"
        assert await list_refunds(localstripe_url, charge=charge) == []
        refund = await asyncio.to_thread(
            sdk.v1.refunds.create,
            params={"charge": charge, "amount": 500},
            options={"idempotency_key": key},
        )
    finally:
        session.close()
    [at_stripe] = await list_refunds(localstripe_url, charge=charge)
    assert (at_stripe["id"], at_stripe["amount"]) == (refund.id, 500)
    assert at_stripe["metadata"]["operation_id"] == operation_id
    row = await gate.operation(operation_id)
    assert (row["status"], row["approval"]["ref"]) == ("confirmed", proposal_id)
    assert (tmp_path / "proposals.png").stat().st_size > 10_000
