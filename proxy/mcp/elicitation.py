"""The human approves where the agent asked (the 2026-07-28 multi round-trip flow, SEP-2322,
with a URL-mode elicitation): ``propose_operation`` from a client that supports URL
elicitation answers ``InputRequiredResult`` asking its user to open the proposal on the
console's approval page (with ``console_url`` set). The approver signs in there: the agent's
token never approves anything, and ``accept`` means only that the user agreed to open the
link. The client retries with the echoed ``requestState`` (the proposal id) and learns the
proposal's state as ``get_proposal`` answers it: the operation id once approved, the decline,
or ``wait`` while nobody has decided. Clients without it keep polling ``get_proposal``.
Pure.
"""

from __future__ import annotations

import unicodedata
from typing import Any
from urllib.parse import quote

import mcp.types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from proxy.policy.amounts import human_amount

_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
APPROVAL = "approval"  # the input request's key
# controls, formats (bidi overrides and isolates, zero-width), line and paragraph separators,
# surrogates and unassigned code points
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def url_elicitation_supported(protocol_version: str, params: Any) -> bool:
    """Whether this request's client declared URL-mode elicitation (per request)."""
    if protocol_version not in MODERN_PROTOCOL_VERSIONS or not isinstance(params, dict):
        return False
    meta = params.get("_meta")
    capabilities = meta.get(_CAPABILITIES) if isinstance(meta, dict) else None
    elicitation = capabilities.get("elicitation") if isinstance(capabilities, dict) else None
    return isinstance(elicitation, dict) and "url" in elicitation


def approval_url(console_url: str, proposal_id: str) -> str:
    # the proposal's own page: the request as a sentence, its checks, and the decision form
    return f"{console_url.rstrip('/')}/proposals/{quote(proposal_id, safe='')}"


def _shown(text: str) -> str:
    """Text from the proposal as the user reads it: a control or format character (a bidi
    override would reorder what follows it) is shown as its escape, never in force."""
    return "".join(
        f"\\u{ord(char):04x}" if unicodedata.category(char) in _HIDDEN else char for char in text
    )


def approval_request(console_url: str, proposal: dict[str, Any]) -> types.ElicitRequest:
    """The URL-mode elicitation that sends the user to the proposal's approval page (the
    retried call's ``inputRequests``, and a proposal task's while it waits). Its message
    names what would be approved: the amount as money (``human_amount``, the one spelling a
    person reads), its currency, and the target (method and path)."""
    amount = proposal.get("amount")
    money = "no amount" if amount is None else human_amount(amount, proposal.get("currency"))
    target = proposal.get("target") or {}
    message = _shown(
        f"The agent asks to {proposal['action']} at {proposal['provider']}: {money}, "
        f"{target.get('method', '?')} {target.get('path', '?')}. An approver reviews the "
        "exact request and approves or declines it on opgate's console."
    )
    url = approval_url(console_url, proposal["proposal_id"])
    return types.ElicitRequest(params=types.ElicitRequestURLParams(message=message, url=url))


def ask_for_approval(console_url: str, view: dict[str, Any]) -> types.InputRequiredResult:
    proposal = view["proposal"]
    return types.InputRequiredResult(
        input_requests={APPROVAL: approval_request(console_url, proposal)},
        request_state=proposal["proposal_id"],
    )
