"""The console in a real headless browser: Debian's chromium driven by Selenium through
Debian's chromium-driver (its path given, so Selenium Manager downloads nothing). Sign in,
filter, open a timeline, resolve an escalation, and a reviewer refused a resolve; the
stylesheet is the console's own and loads under the CSP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from tests.console.helpers import (
    NEEDS_BROWSER,
    REVIEWER_DIGEST,
    REVIEWER_TOKEN,
    TRACE_TEMPLATE,
    escalated,
)
from tests.support.browser import click, in_browser, navigate, sign_in
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import ADMIN_TOKEN, Opgate, StartOpgate, fault_policy

pytestmark = NEEDS_BROWSER
GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> AsyncIterator[Opgate]:
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url},
        reviewer_token_sha256=REVIEWER_DIGEST,
        trace_url_template=TRACE_TEMPLATE,
    ) as running:
        yield running


async def test_sign_in_filter_timeline_resolve_and_reviewer_refused(
    gate: Opgate, chrome: Any, tmp_path: Path
) -> None:
    """In Chromium: an admin signs in, filters by tenant, opens an escalated operation's
    timeline and resolves it; a reviewer sees no resolve form and a resolve it posts anyway
    is refused with 403."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    base = gate.ops_url
    sent = await gate.approve(approval_ref="INC-2041", amount=1250)  # agent-a's tenant t1
    status, _, _ = await gate.send(
        "/fault/v1/refunds",
        data="amount=1250&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": sent["operation_id"]},
    )
    assert status == 200
    waiting = await escalated(gate, tenant="acme", approval_ref="INC-2042", amount=900)
    await gate.approve(tenant="acme", approval_ref="INC-2043", amount=4200, currency="eur")
    await gate.approve(tenant="acme", approval_ref="INC-2045", approved_by="carol@example.com")
    await gate.approve(tenant="globex", approval_ref="INC-7", approved_by="carol@example.com")
    await gate.running.gateway.observability.writer.flush()  # type: ignore[union-attr]

    def admin_flow() -> dict[str, Any]:
        sign_in(chrome, base, ADMIN_TOKEN, "alice@example.com")
        seen: dict[str, Any] = {"who": chrome.find_element(By.ID, "who").text}
        # the stylesheet is served by the console itself and applied under the CSP
        header = chrome.find_element(By.TAG_NAME, "header")
        seen["header_colour"] = header.value_of_css_property("background-color")
        Select(chrome.find_element(By.ID, "filter-status")).select_by_value("all")
        tenant = chrome.find_element(By.ID, "filter-tenant")
        tenant.clear()
        tenant.send_keys("acme")
        click(chrome, chrome.find_element(By.ID, "filter"))
        seen["tenants"] = {e.text for e in chrome.find_elements(By.CSS_SELECTOR, "td.tenant")}
        seen["rows"] = len(chrome.find_elements(By.CSS_SELECTOR, "#operations tbody tr"))
        chrome.save_screenshot(str(tmp_path / "operations.png"))
        click(chrome, chrome.find_element(By.LINK_TEXT, waiting["operation_id"]))
        seen["timeline_id"] = chrome.find_element(By.ID, "operation-id").text
        seen["next_action"] = chrome.find_element(By.ID, "next-action").text
        chrome.save_screenshot(str(tmp_path / "timeline.png"))
        chrome.find_element(By.ID, "note").send_keys("no refund in the provider's dashboard")
        click(chrome, chrome.find_element(By.ID, "it-did-not"))
        seen["status_after"] = chrome.find_element(By.ID, "status").text
        seen["actors"] = [
            e.get_attribute("textContent")
            for e in chrome.find_elements(By.CSS_SELECTOR, "td.actor")
        ]
        chrome.save_screenshot(str(tmp_path / "resolved.png"))
        click(chrome, chrome.find_element(By.CSS_SELECTOR, "header form button"))  # sign out
        seen["after_sign_out"] = chrome.current_url
        return seen

    seen = await in_browser(admin_flow)
    assert seen["who"] == "alice@example.com · admin"
    assert seen["header_colour"] == "rgba(27, 42, 58, 1)"
    assert seen["tenants"] == {"acme"}
    assert seen["rows"] == 3
    assert seen["timeline_id"] == waiting["operation_id"]
    assert seen["next_action"].startswith("escalated")
    assert seen["status_after"] == "failed (human_verdict)"
    assert "human:alice@example.com (admin)" in seen["actors"]
    assert seen["after_sign_out"].endswith("/console/login")

    second = await escalated(gate, tenant="acme", approval_ref="INC-2044", amount=300)

    def reviewer_flow() -> dict[str, Any]:
        sign_in(chrome, base, REVIEWER_TOKEN, "rita@example.com")
        chrome.get(f"{base}/console/escalations")
        seen: dict[str, Any] = {
            "listed": second["operation_id"] in chrome.page_source,
            "forms": len(chrome.find_elements(By.CSS_SELECTOR, "form.resolve")),
        }
        chrome.save_screenshot(str(tmp_path / "reviewer-escalations.png"))
        # a resolve posted anyway, as a crafted page would: the browser's own form submission,
        # with the reviewer's session and its valid CSRF token
        csrf = chrome.find_element(By.CSS_SELECTOR, "header input[name=csrf_token]")
        script = (
            """
            const form = document.createElement('form');
            form.method = 'post';
            form.action = arguments[0];
            for (const [name, value] of Object.entries(arguments[1])) {
              const input = document.createElement('input');
              input.name = name; input.value = value; form.appendChild(input);
            }
            document.body.appendChild(form);
            form.submit();
            """,
            f"/console/operations/{second['operation_id']}/resolve",
            {
                "csrf_token": csrf.get_attribute("value"),
                "verdict": "failed",
                "note": "reviewer",
            },
        )
        navigate(chrome, lambda: chrome.execute_script(*script))
        seen["refusal"] = chrome.find_element(By.ID, "error").text
        chrome.save_screenshot(str(tmp_path / "reviewer-refused.png"))
        return seen

    seen = await in_browser(reviewer_flow)
    assert seen["listed"]
    assert seen["forms"] == 0
    assert "reviewer role can see everything, change nothing" in seen["refusal"]
    row = await gate.operation(second["operation_id"])
    assert row["status"] == "dispatched"
    for name in ("operations", "timeline", "resolved", "reviewer-escalations", "reviewer-refused"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
