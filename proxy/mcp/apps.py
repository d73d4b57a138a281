"""The proposal card as an MCP App (``io.modelcontextprotocol/ui``, the SDK's
``mcp.server.apps``): ``propose_operation`` and ``get_proposal`` name a ``ui://`` resource
(``_meta.ui.resourceUri``) that a host which renders apps shows in a sandboxed iframe with the
tool's result: the exact request (provider, action, amount, currency, target, parameters), the
agent's reason and the proposal's state. Pure.

Read-only by construction: the document has no form and no button, asks the host for nothing
but the tool result (``ui/initialize``, then ``ui/notifications/tool-result``), declares no
network origin (``_meta.ui.csp`` empty) and writes every value as text (``textContent``), so a
reason carrying markup stays text. Approving stays in opgate's console, where the approver
signs in: the agent's host never holds anything that approves. Hosts without apps get the
same result as text, as before.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID

APPS = EXTENSION_ID
CARD_URI = "ui://opgate/proposal-card.html"
CARD_META: dict[str, Any] = {"ui": {"resourceUri": CARD_URI}}

CARD = types.Resource(
    name="proposal-card",
    title="A proposal, read-only",
    uri=CARD_URI,
    description=(
        "The exact request a proposal asks a human to approve, rendered for hosts that show "
        "MCP Apps; approving is only on opgate's console."
    ),
    mime_type=APP_MIME_TYPE,
)

# One document, no external resource; values are set with textContent only.
_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<title>opgate proposal</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; padding: 12px; color: #1d2330; }
  h1 { font-size: 15px; margin: 0 0 8px; }
  dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 12px; margin: 0; }
  dt { color: #5b6475; }
  dd { margin: 0; white-space: pre-wrap; word-break: break-word; }
  pre { margin: 0; white-space: pre-wrap; word-break: break-word; }
  p { color: #5b6475; margin: 10px 0 0; }
</style>
</head>
<body>
<h1>Proposal <span id="proposal-id"></span></h1>
<dl>
  <dt>Status</dt><dd id="status"></dd>
  <dt>Provider</dt><dd id="provider"></dd>
  <dt>Action</dt><dd id="action"></dd>
  <dt>Amount</dt><dd id="amount"></dd>
  <dt>Currency</dt><dd id="currency"></dd>
  <dt>Target</dt><dd id="target"></dd>
  <dt>Parameters</dt><dd><pre id="params"></pre></dd>
  <dt>Reason</dt><dd id="reason"></dd>
  <dt>Expires</dt><dd id="expires"></dd>
  <dt>Operation</dt><dd id="operation"></dd>
</dl>
<p id="console">An approver approves or declines this exact request on opgate's console;
this card cannot.</p>
<script>
"use strict";
(function () {
  var initialize = 1;
  function post(message) { window.parent.postMessage(message, "*"); }
  function put(id, value) {
    var shown = value === null || value === undefined ? "" : value;
    document.getElementById(id).textContent =
      typeof shown === "string" ? shown : JSON.stringify(shown, null, 2);
  }
  function render(result) {
    var view = result && result.structuredContent;
    if (!view || !view.proposal) return;
    var proposal = view.proposal;
    put("proposal-id", proposal.proposal_id);
    put("status", view.status);
    put("provider", proposal.provider);
    put("action", proposal.action);
    put("amount", proposal.amount === null ? "" : String(proposal.amount));
    put("currency", proposal.currency);
    put("target", proposal.target ? proposal.target.method + " " + proposal.target.path : "");
    put("params", proposal.params || {});
    put("reason", proposal.reason);
    put("expires", proposal.expires_at);
    put("operation", view.operation_id);
  }
  window.addEventListener("message", function (event) {
    if (event.source !== window.parent) return;
    var message = event.data;
    if (!message || message.jsonrpc !== "2.0") return;
    if (message.id === initialize && message.result) {
      post({jsonrpc: "2.0", method: "ui/notifications/initialized", params: {}});
    } else if (message.method === "ui/notifications/tool-result") {
      render(message.params);
    }
  });
  post({jsonrpc: "2.0", id: initialize, method: "ui/initialize", params: {
    protocolVersion: "2026-01-26",
    appInfo: {name: "opgate-proposal-card", version: "1"},
    appCapabilities: {}
  }});
})();
</script>
</body>
</html>
"""


def card() -> types.ReadResourceResult:
    """``resources/read`` of the card: no origin to reach (``csp`` empty), a border."""
    contents = types.TextResourceContents(
        uri=CARD_URI,
        mime_type=APP_MIME_TYPE,
        text=_HTML,
        _meta={"ui": {"csp": {}, "prefersBorder": True}},
    )
    return types.ReadResourceResult(contents=[contents])
