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

from typing import Any
from urllib.parse import quote

import mcp.types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
APPROVAL = "approval"  # the input request's key


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


def approval_request(console_url: str, proposal: dict[str, Any]) -> types.ElicitRequest:
    """The URL-mode elicitation that sends the user to the proposal's approval page (the
    retried call's ``inputRequests``, and a proposal task's while it waits)."""
    message = (
        f"The agent asks to {proposal['action']} at {proposal['provider']}. An approver "
        "reviews the exact request and approves or declines it on opgate's console."
    )
    url = approval_url(console_url, proposal["proposal_id"])
    return types.ElicitRequest(params=types.ElicitRequestURLParams(message=message, url=url))


def ask_for_approval(console_url: str, view: dict[str, Any]) -> types.InputRequiredResult:
    proposal = view["proposal"]
    return types.InputRequiredResult(
        input_requests={APPROVAL: approval_request(console_url, proposal)},
        request_state=proposal["proposal_id"],
    )
