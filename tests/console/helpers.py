"""Console test helpers: operations in the states the console shows, and a signed-in client."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.gate.identity import token_digest
from proxy.store.store import Claim
from tests.support.opgate import Opgate

REVIEWER_TOKEN = "opg_test_reviewer_token_0123456789"
REVIEWER_DIGEST = token_digest(REVIEWER_TOKEN)
TRACE_TEMPLATE = "https://jaeger.example/trace/{trace_id}"
# Debian's chromium driven by Selenium through Debian's chromium-driver (its path given, so
# Selenium Manager downloads nothing).
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None
)
# for the browser tests' modules: pytestmark = NEEDS_BROWSER
NEEDS_BROWSER = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed"
    " (apt-get install -y chromium chromium-driver; .ci/run installs them)",
)
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


async def escalated(gate: Opgate, **approval: Any) -> dict[str, Any]:
    """An approved operation sent once with an unknown outcome and escalated to a human (through
    the store's own transitions, as the background loop would)."""
    op = await gate.approve(**approval)
    store = gate.running.gateway.store
    operation_id = op["operation_id"]
    assert await store.claim(
        Claim(operation_id, owner="test", lease_seconds=60, expected_attempts=0)
    )
    assert await store.end_attempt(operation_id, 1, "timeout", None, "test")
    if not await store.escalate(
        operation_id, None, "lookups inconclusive 2 times", {"lookups": []}, look_again_seconds=3600
    ):
        # A gate started with a short background interval may have escalated it first (its
        # reconciler saw the unknown outcome between the two statements): escalated either way.
        row = await store.load(operation_id)
        assert row is not None
        assert row.escalated_at is not None, row
    return op


def csrf_of(html: str) -> str:
    match = _CSRF.search(html)
    assert match is not None, html
    return match.group(1)


async def sign_in(
    gate: Opgate, session: aiohttp.ClientSession, token: str, identity: str = "alice@example.com"
) -> aiohttp.ClientResponse:
    """Sign in as a browser does: get the form (and its CSRF cookie), post it."""
    async with session.get(f"{gate.ops_url}/console/login") as form:
        csrf = csrf_of(await form.text())
    async with session.post(
        f"{gate.ops_url}/console/login",
        data={"csrf_token": csrf, "identity": identity, "token": token},
        allow_redirects=False,
    ) as response:
        await response.read()
        return response


def serious_violations(driver: Any) -> list[str]:
    """axe-core's serious and critical violations on the page the browser shows (axe-core as
    axe-selenium-python ships it, injected by the test: the console's CSP allows no script)."""
    from axe_selenium_python import Axe

    axe = Axe(driver)
    axe.inject()
    results = axe.run()
    return [
        f"{v['id']} ({v['impact']}): {v['help']}: {[n['target'] for n in v['nodes']][:3]}"
        for v in results["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def tab_to(driver: Any, element_id: str, limit: int = 80) -> None:
    """Press Tab, as a keyboard-only user does, until the element ``element_id`` has focus."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    for _ in range(limit):
        if driver.switch_to.active_element.get_attribute("id") == element_id:
            return
        ActionChains(driver).send_keys(Keys.TAB).perform()
    raise AssertionError(f"{limit} presses of Tab never reached #{element_id}")


def type_keys(driver: Any, *keys: str) -> None:
    """Keys typed into whatever has focus."""
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(*keys).perform()
