"""The proposal card as an MCP App (io.modelcontextprotocol/ui): the proposal tools name a
ui:// resource, served as text/html;profile=mcp-app, that renders the exact request read-only
(no form, no network, text only) in a host's iframe; approving stays in opgate's console."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp.types import TextResourceContents

from tests.console.helpers import NEEDS_BROWSER
from tests.support.browser import in_browser
from tests.support.localstripe_server import create_charge
from tests.support.mcp_client import http_client
from tests.support.opgate import AGENT_TOKEN, Opgate

UI = "io.modelcontextprotocol/ui"
CARD = "ui://opgate/proposal-card.html"
MIME = "text/html;profile=mcp-app"


async def read_card(gate: Opgate) -> tuple[Any, dict[str, Any], str]:
    """The server's capabilities, the tools by name, and the card's document."""
    async with http_client(gate.agent_url, AGENT_TOKEN) as client:
        capabilities = client.server_capabilities
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        read = await client.read_resource(CARD)
    [contents] = read.contents
    assert isinstance(contents, TextResourceContents)
    assert contents.mime_type == MIME
    return capabilities, tools, contents.text


async def test_the_proposal_tools_name_a_card_that_cannot_act(stripe_gate: Opgate) -> None:
    """The extension is advertised; propose_operation and get_proposal carry
    _meta.ui.resourceUri; the card is the app MIME type and has no form, no button, no
    network call and no HTML injection point."""
    capabilities, tools, html = await read_card(stripe_gate)
    assert capabilities is not None
    assert capabilities.extensions is not None
    assert UI in capabilities.extensions
    for name in ("propose_operation", "get_proposal"):
        assert (tools[name].meta or {})["ui"]["resourceUri"] == CARD
    assert "ui" not in (tools["execute_operation"].meta or {})
    lowered = html.lower()
    for forbidden in ("<form", "<button", "fetch(", "xmlhttprequest", "innerhtml", "websocket"):
        assert forbidden not in lowered, forbidden
    assert "ui/notifications/tool-result" in html


HOST = """<!doctype html><html><body><iframe id="card"></iframe><script>
const frame = document.getElementById("card");
const result = %(result)s;
window.addEventListener("message", (event) => {
  const message = event.data;
  if (event.source !== frame.contentWindow || !message || message.jsonrpc !== "2.0") return;
  if (message.method === "ui/initialize") {
    frame.contentWindow.postMessage({jsonrpc: "2.0", id: message.id, result: {
      protocolVersion: "2026-01-26", hostInfo: {name: "test", version: "1"},
      hostCapabilities: {}, hostContext: {}}}, "*");
  } else if (message.method === "ui/notifications/initialized") {
    frame.contentWindow.postMessage(
      {jsonrpc: "2.0", method: "ui/notifications/tool-result", params: result}, "*");
  }
});
frame.srcdoc = %(card)s;
</script></body></html>"""


@NEEDS_BROWSER
async def test_the_card_renders_the_exact_request_as_text_in_chromium(
    stripe_gate: Opgate, localstripe_url: str, chrome: Any, tmp_path: Path
) -> None:
    """In a host page's iframe, the card shows the proposal's provider, action, amount and
    reason from the tool result, as text: a reason carrying markup stays text and runs
    nothing."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    reason = 'refund <img src=x onerror="window.parent.pwned=1"> twice'
    arguments = {
        "provider": "stripe",
        "action": "refund.create",
        "amount": 500,
        "params": {"charge": await create_charge(localstripe_url, 2000)},
        "reason": reason,
    }
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        proposed = await client.call_tool("propose_operation", arguments)
    _, _, html = await read_card(stripe_gate)
    host = tmp_path / "host.html"
    result = proposed.model_dump(by_alias=True, mode="json", exclude_none=True)
    # as script literals: "</" would end the host page's own script element
    literal = {"result": json.dumps(result), "card": json.dumps(html)}
    host.write_text(HOST % {key: value.replace("</", "<\\/") for key, value in literal.items()})

    def render() -> dict[str, Any]:
        chrome.get(host.as_uri())
        chrome.switch_to.frame(chrome.find_element(By.ID, "card"))
        WebDriverWait(chrome, 15).until(lambda d: d.find_element(By.ID, "reason").text != "")
        shown = {
            key: chrome.find_element(By.ID, key).text
            for key in ("provider", "action", "amount", "reason", "status", "console")
        }
        shown["images"] = len(chrome.find_elements(By.TAG_NAME, "img"))
        chrome.switch_to.default_content()
        shown["pwned"] = chrome.execute_script("return window.pwned === undefined")
        return shown

    shown = await in_browser(render)
    assert (shown["provider"], shown["action"]) == ("stripe", "refund.create")
    assert shown["amount"] == "500"
    assert shown["reason"] == reason
    assert shown["status"] == "pending"
    assert "console" in shown["console"]
    assert shown["images"] == 0
    assert shown["pwned"] is True
