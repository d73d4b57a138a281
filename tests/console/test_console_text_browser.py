"""Agent-written text as Chromium renders it on the console: a reason cannot reorder what an
approver reads (bidirectional controls are shown as visible escapes and agent text is isolated),
and a long unbroken run of characters wraps instead of widening the page."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from proxy.gate.identity import token_digest
from tests.console.helpers import NEEDS_BROWSER
from tests.support.browser import in_browser, sign_in
from tests.support.opgate import Opgate, StartOpgate, fault_policy

pytestmark = NEEDS_BROWSER
APPROVER_TOKEN = "opg_test_console_text_approver_0123"
# U+202E RIGHT-TO-LEFT OVERRIDE: what follows it is drawn right to left, so these logical
# characters read "refund 1000.00 USD" on the screen
LYING_REASON = "order 1042 \u202eDSU 00.0001 dnufer"
# Each character's box, in the order the screen shows them: lines top to bottom, then left
# to right (zero-width characters, such as combining marks, are left out).
VISUAL_ORDER = """
const root = document.getElementById(arguments[0]);
const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
const boxes = [];
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  for (let i = 0; i < node.length; i++) {
    const range = document.createRange();
    range.setStart(node, i);
    range.setEnd(node, i + 1);
    const rect = range.getBoundingClientRect();
    if (rect.width > 0) boxes.push([Math.round(rect.top), rect.left, node.data[i]]);
  }
}
boxes.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
return boxes.map((b) => b[2]).join('');
"""
_AMOUNT = re.compile(r"[0-9][0-9.,]*\s*USD")


@pytest_asyncio.fixture(loop_scope="session")
async def gate(start_opgate: StartOpgate, policy_dir: Path) -> AsyncIterator[Opgate]:
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        approvers=[{"name": "olga", "token_sha256": token_digest(APPROVER_TOKEN)}],
    ) as running:
        yield running


async def propose(gate: Opgate, amount: int, reason: str) -> dict[str, Any]:
    body = {
        "provider": "fault",
        "action": "refund.create",
        "amount": amount,
        "currency": "usd",
        "params": {"charge": "ch_1"},
        "reason": reason,
    }
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=json.dumps(body), content_type="application/json"
    )
    assert status == 201, raw
    proposal: dict[str, Any] = json.loads(raw)["proposal"]
    return proposal


async def test_a_reason_cannot_reorder_the_amount_an_approver_reads(
    gate: Opgate, chrome: Any
) -> None:
    """A 20.00 USD proposal whose reason holds U+202E: on the proposal page and in the list,
    the only amount the screen shows, read in the order its glyphs are drawn, is 20.00 USD,
    and the control itself is shown as <U+202E>."""
    proposal = await propose(gate, 2000, LYING_REASON)

    def read() -> dict[str, str]:
        from selenium.webdriver.common.by import By

        sign_in(chrome, gate.ops_url, APPROVER_TOKEN, "olga")
        chrome.get(f"{gate.ops_url}/console/proposals/{proposal['proposal_id']}")
        seen = {
            "page": chrome.execute_script(VISUAL_ORDER, "sentence"),
            "page_text": chrome.find_element(By.ID, "sentence").text,
        }
        chrome.get(f"{gate.ops_url}/console/proposals")
        seen["list"] = chrome.execute_script(VISUAL_ORDER, f"proposal-{proposal['proposal_id']}")
        return seen

    seen = await in_browser(read)
    assert _AMOUNT.findall(seen["page"]) == ["20.00 USD"], seen["page"]
    assert _AMOUNT.findall(seen["list"]) == ["20.00 USD"], seen["list"]
    assert "<U+202E>" in seen["page_text"]


async def test_a_long_unbroken_run_wraps_instead_of_widening_the_page(
    gate: Opgate, chrome: Any
) -> None:
    """A reason of 1,999 combining marks (and one of 1,999 letters without a space): the proposal
    page and the list are no wider than the window."""
    marks = "".join(chr(0x0300 + i % 0x70) for i in range(1999))
    first = await propose(gate, 2000, marks)
    second = await propose(gate, 2000, "x" * 1999)

    def widths() -> dict[str, tuple[int, int]]:
        sign_in(chrome, gate.ops_url, APPROVER_TOKEN, "olga")
        measure = "return [document.documentElement.scrollWidth, window.innerWidth];"
        seen = {}
        for name, url in (
            ("marks", f"/console/proposals/{first['proposal_id']}"),
            ("letters", f"/console/proposals/{second['proposal_id']}"),
            ("list", "/console/proposals"),
        ):
            chrome.get(f"{gate.ops_url}{url}")
            scroll, window = chrome.execute_script(measure)
            seen[name] = (scroll, window)
        return seen

    seen = await in_browser(widths)
    for name, (scroll, window) in seen.items():
        assert scroll <= window, f"{name}: the page is {scroll} px wide in a {window} px window"
