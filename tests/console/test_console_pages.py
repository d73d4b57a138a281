"""The console's pages as a human reads them, in real headless Chromium (issue 29): a proposal
as a sentence with the provider's answer now, an escalation as a decision, amounts in their
currency, errors in the page they came from, the dashboard line, keyboard-only approve and
resolve, and no serious or critical axe-core violation on any page. With
OPGATE_WRITE_DOCS_SCREENSHOTS=1 (docs/screenshots.py) the pages are saved as docs/console-*.png.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest_asyncio

from proxy.gate.identity import token_digest
from tests.console.helpers import (
    NEEDS_BROWSER,
    serious_violations,
    tab_to,
    type_keys,
)
from tests.support.browser import click, in_browser, navigate, sign_in
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.localstripe_server import create_charge
from tests.support.opgate import (
    ADMIN_TOKEN,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
    admin_headers,
    fault_policy,
)
from tests.support.paths import REPO
from tests.support.polling import until

pytestmark = NEEDS_BROWSER
APPROVER_TOKEN = "opg_test_console_pages_approver_0123"
DASHBOARD = "https://fault.example/search?q={operation_id}"


def keep_screenshot(driver: Any, name: str) -> None:
    """docs/console-<name>.png, only when asked (docs/screenshots.py)."""
    if os.environ.get("OPGATE_WRITE_DOCS_SCREENSHOTS") == "1":
        size = driver.get_window_size()
        width, height = size["width"], size["height"]
        tall = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, min(max(tall + 100, height), 1800))
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(str(REPO / "docs" / f"console-{name}.png"))
        driver.set_window_size(width, height)


# --- a proposal --------------------------------------------------------------------------------
@pytest_asyncio.fixture(loop_scope="session")
async def stripe_gate(
    start_opgate: StartOpgate, policy_dir: Path, localstripe_url: str
) -> AsyncIterator[Opgate]:
    """The shipped Stripe policy, four eyes on."""
    shipped = (SHIPPED_POLICIES / "stripe.yaml").read_text()
    (policy_dir / "stripe.yaml").write_text(shipped + "four_eyes: true\n")
    async with start_opgate(
        upstream_overrides={"stripe": localstripe_url},
        approvers=[{"name": "olga@example.com", "token_sha256": token_digest(APPROVER_TOKEN)}],
    ) as running:
        yield running


async def propose(
    gate: Opgate, charge: str, amount: int, reason: str, **more: Any
) -> dict[str, Any]:
    body = {
        "provider": "stripe",
        "action": "refund.create",
        "amount": amount,
        "params": {"charge": charge},
        "reason": reason,
        **more,
    }
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=json.dumps(body), content_type="application/json"
    )
    assert status == 201, raw
    proposed: dict[str, Any] = json.loads(raw)
    return proposed


async def test_a_proposal_reads_as_a_sentence_with_the_providers_answer_now(
    stripe_gate: Opgate, chrome: Any, localstripe_url: str
) -> None:
    """A proposal's page opens with its sentence (the amount in the currency's exponent), then
    the exact request, the policy's checks, the budget, who may approve (four eyes), the expiry
    and the provider's answer to the preconditions now, read through opgate's lookup client
    and timed; a charge the provider does not know reads "could not read" and the page still
    opens. An approver approves with the keyboard only. axe-core finds nothing serious."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    gate = stripe_gate
    charge = await create_charge(localstripe_url, 2000)
    first = await propose(gate, charge, 600, "order 1042 was charged twice")
    unknown = await propose(gate, "ch_nowhere", 100, "a charge Stripe never made")
    base = gate.ops_url

    def read_and_approve() -> dict[str, Any]:
        sign_in(chrome, base, APPROVER_TOKEN, "olga")
        seen: dict[str, Any] = {"dashboard": chrome.find_element(By.ID, "dash-proposals").text}
        chrome.get(f"{base}/console/proposals/{unknown['proposal']['proposal_id']}")
        seen["unknown_now"] = chrome.find_element(By.ID, "precondition-1").text
        click(chrome, chrome.find_element(By.LINK_TEXT, "Proposals"))
        seen["list_sentences"] = [
            e.text for e in chrome.find_elements(By.CSS_SELECTOR, "#proposals td.sentence")
        ]
        seen["axe_list"] = serious_violations(chrome)
        click(chrome, chrome.find_element(By.LINK_TEXT, first["proposal"]["proposal_id"]))
        for name in ("sentence", "approvers", "expires", "budgets", "checks"):
            seen[name] = chrome.find_element(By.ID, name).text
        seen["request"] = json.loads(chrome.find_element(By.ID, "exact-request").text)
        seen["now"] = chrome.find_element(By.ID, "precondition-1").text
        keep_screenshot(chrome, "proposal")
        seen["axe_proposal"] = serious_violations(chrome)
        # keyboard only: Tab to the note, type it, Tab to Approve, Enter
        tab_to(chrome, "note")
        type_keys(chrome, "checked the charge at Stripe")
        tab_to(chrome, "approve")
        navigate(chrome, lambda: type_keys(chrome, Keys.ENTER))
        seen["approved_operation"] = chrome.find_element(By.ID, "operation-id").text
        seen["actors"] = [
            e.get_attribute("textContent")
            for e in chrome.find_elements(By.CSS_SELECTOR, "td.actor")
        ]
        return seen

    seen = await in_browser(read_and_approve)
    sentence = (
        f"Refund 6.00 USD (600 minor units) of charge {charge} at Stripe, asked by agent-a "
        "(tenant t1): "
        "order 1042 was charged twice"
    )
    assert seen["dashboard"] == "2 proposals pending"
    # the list asks the provider nothing: a refund names no currency until its page is opened
    assert (
        "Refund 600 (minor units, no currency) "
        + sentence.removeprefix("Refund 6.00 USD (600 minor units) ")
        in (seen["list_sentences"])
    )
    assert seen["axe_list"] == []
    assert seen["sentence"] == sentence
    assert seen["request"] == first["request"]
    assert "amount must be exactly 6.00 USD (600 minor units)" in seen["checks"]
    assert "only POST /v1/refunds at https://api.stripe.com matches this rule" in seen["checks"]
    assert seen["budgets"] == "No budget applies."
    assert seen["approvers"] == (
        "the admin or an approver (olga@example.com), but not agent-a: four eyes"
    )
    assert seen["expires"].startswith("in ")
    assert f"GET /v1/charges/{charge}, read 20" in seen["now"]  # and its time
    assert 'holds: /status == "succeeded"' in seen["now"]
    assert (
        "/amount_refunded = 0.00 USD (0 minor units), "
        "approved.amount = 6.00 USD (600 minor units), "
        "/amount = 20.00 USD (2000 minor units)" in (seen["now"])
    )
    assert "GET /v1/charges/ch_nowhere, read 20" in seen["unknown_now"]
    assert (
        "could not read: the lookup of /v1/charges/ch_nowhere answered 404" in (seen["unknown_now"])
    )
    assert seen["axe_proposal"] == []
    assert seen["approved_operation"] == first["proposal"]["operation_id"]
    assert "human:olga@example.com (approver)" in seen["actors"]


@pytest_asyncio.fixture(loop_scope="session")
async def budget_gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> AsyncIterator[Opgate]:
    """The fault provider with a tenant budget of 7.00 USD a day."""
    policy = fault_policy(deduplicates=False)
    budget = "budgets:\n  - {scope: tenant, currency: usd, limit: 700, window: 24h}\n"
    (policy_dir / "fault.yaml").write_text(policy + budget)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as running:
        yield running


async def test_a_refused_approval_stays_on_the_proposals_page_in_words(
    budget_gate: Opgate, chrome: Any
) -> None:
    """With 6.00 of a 7.00 USD budget spent, approving 5.00 USD more is refused in the
    proposal's own page (its URL, its sentence), the reason in words and amounts in the
    currency's exponent, the note kept; the dashboard names the budget near its limit."""
    from selenium.webdriver.common.by import By

    gate = budget_gate
    more = {"provider": "fault", "currency": "usd"}
    first = await propose(gate, "ch_1", 600, "order 1042 was charged twice", **more)
    second = await propose(gate, "ch_2", 500, "order 1043 was charged twice", **more)
    async with gate.http.post(
        f"{gate.ops_url}/v1/proposals/{first['proposal']['proposal_id']}/approve",
        json={},
        headers=admin_headers(),
    ) as response:
        assert response.status in (200, 201), await response.text()
    request = first["request"]
    status, _, raw = await gate.send(
        request["path"], data=urlencode(request["form"]), headers=request["headers"]
    )
    assert status == 200, raw
    second_id = second["proposal"]["proposal_id"]

    def approve_over_budget() -> dict[str, Any]:
        sign_in(chrome, gate.ops_url, ADMIN_TOKEN, "alice@example.com")
        chrome.get(f"{gate.ops_url}/console/proposals/{second_id}")
        seen: dict[str, Any] = {
            "budget_near": chrome.find_element(By.ID, "dash-budgets").text,
            "budgets": chrome.find_element(By.ID, "budgets").text,
        }
        chrome.find_element(By.ID, "note").send_keys("the second one too")
        click(chrome, chrome.find_element(By.ID, "approve"))
        seen["url"] = chrome.current_url
        seen["error"] = chrome.find_element(By.ID, "error").text
        seen["note_kept"] = chrome.find_element(By.ID, "note").get_attribute("value")
        seen["sentence"] = chrome.find_element(By.ID, "sentence").text
        seen["axe_refused"] = serious_violations(chrome)
        return seen

    seen = await in_browser(approve_over_budget)
    assert seen["budget_near"] == (
        "budgets near their limit: fault tenant t1 6.00 USD (600 minor units) of 7.00 USD "
        "(700 minor units)"
    )
    assert seen["budgets"] == (
        "tenant budget of t1: 7.00 USD (700 minor units) per 24h, 6.00 USD (600 minor units) "
        "spent; this uses 5.00 USD (500 minor units), over by 4.00 USD (400 minor units)"
    )
    assert seen["url"] == f"{gate.ops_url}/console/proposals/{second_id}"
    assert seen["error"] == (
        "Not approved. The operation would exceed a spend budget: at approval time: 5.00 USD "
        "would exceed the tenant budget of 7.00 USD per 24h: 1.00 USD remaining "
        "(budget_exceeded)"
    )
    assert seen["note_kept"] == "the second one too"
    assert seen["sentence"] == (
        "Refund 5.00 USD (500 minor units) of charge ch_2 at Fault, asked by agent-a (tenant t1): "
        "order 1043 was charged twice"
    )
    assert seen["axe_refused"] == []


# --- an escalation -----------------------------------------------------------------------------
@pytest_asyncio.fixture(loop_scope="session")
async def escalating_gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> AsyncIterator[Opgate]:
    """The fault provider, its refunds looked up by a two-parameter list and linked to a
    dashboard search; no escalation webhook; the background loop running."""
    policy = fault_policy(deduplicates=False, grace_seconds=0, max_attempts=2)
    policy = policy.replace(
        "query: {charge: '{charge}'}", "query: {charge: '{charge}', limit: '100'}"
    ).replace(
        "route_prefix: /fault\n", f"route_prefix: /fault\ndashboard_search_url: {DASHBOARD}\n"
    )
    (policy_dir / "fault.yaml").write_text(policy)
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, background_interval_seconds=0.05
    ) as running:
        yield running


async def test_an_escalation_reads_as_a_decision_resolved_with_the_keyboard(
    escalating_gate: Opgate, chrome: Any, fault_provider: FaultProvider
) -> None:
    """A real escalation (the provider answered 500 to the refund and to both lookups): its
    page opens with the decision in the first screen (each attempt and each lookup try once,
    the exact search, the dashboard link, both verdicts with their consequence), the raw
    records collapsed, no notices where no webhook is configured, no ``\\u0026``. "It happened"
    without an object id is refused in the page with the note kept; "It did not happen",
    pressed with the keyboard only, settles it. The dashboard line counts it, and axe-core
    finds nothing serious on the sign-in, list, escalation, audit, budgets and error pages."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    gate = escalating_gate
    op = await gate.approve(amount=2500, approval_ref="INC-2041")
    operation_id = op["operation_id"]
    fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT  # the POST and every lookup: 500
    status, _, _ = await gate.send(
        "/fault/v1/refunds",
        data="amount=2500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": operation_id},
    )
    assert status == 502

    async def escalated() -> bool:
        return (await gate.operation(operation_id))["escalation"] is not None

    await until(escalated, "escalated", seconds=20)
    await gate.approve(tenant="acme", approval_ref="INC-2042", amount=1099, currency="jpy")
    base = gate.ops_url
    page_url = f"{base}/console/operations/{operation_id}"

    def look_and_decide() -> dict[str, Any]:
        chrome.get(f"{base}/console/login")
        seen: dict[str, Any] = {"axe_sign_in": serious_violations(chrome)}
        sign_in(chrome, base, ADMIN_TOKEN, "alice@example.com")
        Select = __import__("selenium.webdriver.support.ui", fromlist=["Select"]).Select
        Select(chrome.find_element(By.ID, "filter-status")).select_by_value("all")
        click(chrome, chrome.find_element(By.ID, "filter"))
        seen["dashboard"] = chrome.find_element(By.ID, "dash-escalations").text
        seen["amounts"] = [e.text for e in chrome.find_elements(By.CSS_SELECTOR, "td .amount")]
        keep_screenshot(chrome, "dashboard")
        seen["axe_operations"] = serious_violations(chrome)
        click(chrome, chrome.find_element(By.LINK_TEXT, "Escalations"))
        seen["axe_escalations"] = serious_violations(chrome)
        click(chrome, chrome.find_element(By.LINK_TEXT, operation_id))
        seen["height"] = chrome.execute_script("return document.documentElement.scrollHeight")
        seen["buttons_bottom"] = chrome.execute_script(
            "return document.getElementById('it-did-not').getBoundingClientRect().bottom"
        )
        seen["viewport"] = chrome.execute_script("return window.innerHeight")
        seen["attempts"] = [
            e.text for e in chrome.find_elements(By.CSS_SELECTOR, "#known .attempt")
        ]
        seen["tries"] = [e.text for e in chrome.find_elements(By.CSS_SELECTOR, "#known .try")]
        seen["searches"] = chrome.find_element(By.ID, "searches").text
        seen["link"] = chrome.find_element(By.ID, "dashboard-link").get_attribute("href")
        seen["consequences"] = chrome.find_element(By.ID, "resolve").text
        seen["target"] = chrome.find_element(By.ID, "target").text
        seen["amount"] = chrome.find_element(By.ID, "amount").text
        seen["notices"] = len(chrome.find_elements(By.ID, "notices-details"))
        seen["raw_shown"] = chrome.find_element(By.ID, "transitions").is_displayed()
        seen["source"] = chrome.page_source
        keep_screenshot(chrome, "escalation")
        seen["axe_escalation"] = serious_violations(chrome)
        # keyboard only: a note, then "It happened" without an object id
        tab_to(chrome, "note")
        type_keys(chrome, "no refund for ch_1 in the dashboard")
        tab_to(chrome, "it-happened")
        navigate(chrome, lambda: type_keys(chrome, Keys.ENTER))
        seen["refused_url"] = chrome.current_url
        seen["error"] = chrome.find_element(By.ID, "error").text
        seen["note_kept"] = chrome.find_element(By.ID, "note").get_attribute("value")
        # then "It did not happen", still with the keyboard only
        tab_to(chrome, "it-did-not")
        navigate(chrome, lambda: type_keys(chrome, Keys.ENTER))
        seen["status_after"] = chrome.find_element(By.ID, "status").text
        seen["verdict"] = chrome.find_element(By.ID, "verdict").text
        seen["decision_after"] = len(chrome.find_elements(By.ID, "decision"))
        seen["axe_resolved"] = serious_violations(chrome)
        seen["dashboard_after"] = chrome.find_element(By.ID, "dash-escalations").text
        chrome.get(f"{base}/console/audit")
        seen["audit_line"] = chrome.find_element(By.ID, "dash-audit").text
        seen["axe_audit"] = serious_violations(chrome)
        chrome.get(f"{base}/console/budgets")
        seen["axe_budgets"] = serious_violations(chrome)
        chrome.get(f"{base}/console/operations/op_nowhere")
        seen["error_page"] = chrome.find_element(By.ID, "error").text
        seen["back"] = chrome.find_element(By.ID, "back").get_attribute("href")
        seen["axe_error"] = serious_violations(chrome)
        return seen

    seen = await in_browser(look_and_decide)
    for page in ("sign_in", "operations", "escalations", "escalation", "audit", "budgets"):
        assert seen[f"axe_{page}"] == [], page
    assert seen["axe_error"] == []
    assert seen["dashboard"].startswith("1 escalation waiting, the oldest for ")
    assert {"25.00 USD (2500 minor units)", "1099 JPY"} <= set(seen["amounts"])
    assert seen["buttons_bottom"] <= seen["viewport"]  # the decision is on the first screen
    assert seen["height"] <= 1400, seen["height"]
    assert len(seen["attempts"]) == 1
    assert seen["attempts"][0].endswith("outcome unknown: the provider answered 500")
    assert [t.split(" at ")[0] for t in seen["tries"]] == ["Lookup try 1", "Lookup try 2"]
    assert all(
        t.endswith("GET /v1/refunds?charge=ch_1&limit=100: could not tell: the lookup answered 500")
        for t in seen["tries"]
    ), seen["tries"]
    assert f"refunds with metadata.operation_id = {operation_id}" in seen["searches"]
    assert seen["link"] == DASHBOARD.format(operation_id=operation_id)
    assert "the agent is told to proceed" in seen["consequences"]
    assert "the agent is told a new approval is required" in seen["consequences"]
    assert seen["target"] == "POST /v1/refunds"
    assert seen["amount"] == "25.00 USD (2500 minor units)"
    assert seen["notices"] == 0
    assert not seen["raw_shown"]
    assert "\\u0026" not in seen["source"]
    assert seen["refused_url"] == page_url
    assert seen["error"] == (
        "Not resolved: to say it happened, give the provider object's id "
        "(what you found at the provider)"
    )
    assert seen["note_kept"] == "no refund for ch_1 in the dashboard"
    assert seen["status_after"] == "failed (human_verdict)"
    # once resolved, the page opens with the verdict and who gave it, and asks nothing
    assert seen["verdict"].startswith(
        "It did not happen: failed by human:alice@example.com (admin) at 20"
    )
    assert "Note: no refund for ch_1 in the dashboard" in seen["verdict"]
    assert seen["decision_after"] == 0
    assert seen["axe_resolved"] == []
    assert seen["dashboard_after"] == "0 escalations waiting"
    assert seen["audit_line"].startswith("audit chain: not verified by this process; ")
    assert seen["error_page"] == "no such operation"
    assert seen["back"].endswith("/console/operations")
    async with gate.http.get(
        f"{base}/v1/operations/{operation_id}", headers=admin_headers()
    ) as response:
        row = await response.json()
    assert (row["status"], row["settled_reason"]) == ("failed", "human_verdict")
    assert shutil.which("chromium") is not None
