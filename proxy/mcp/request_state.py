"""The multi round-trip ``requestState`` (SEP-2322), sealed: what ``propose_operation`` hands a
client that can open the approval page, and reads back on the retry.

The specification treats the echoed state as the client's to alter; the SDK's own boundary
(``mcp.server.request_state.RequestStateBoundary``) seals every outgoing state (AES-256-GCM)
in an envelope bound to the method, the tool's name, a digest of its arguments, an expiry and
a principal, and refuses every inbound state that is not that envelope unchanged with the
JSON-RPC error -32602 before any handler runs. opgate gives it:

- the key: the secret ``mcp_state_key`` (``OPGATE_SECRET_MCP_STATE_KEY`` or
  ``<secrets_dir>/mcp_state_key``); else one derived from ``audit_key`` (so that the replicas
  of a deployment, which share that key, read each other's states); else a key of this
  process alone (a retry at another process, or after a restart, is refused and the client
  polls ``get_proposal`` or proposes again);
- the principal: the calling agent, tenant and id (an OAuth token acts as its configured
  agent), so another agent's state is refused as a tampered one is;
- the time to live: the proposal's own (``proposal_pending_seconds``): after it the answer
  would only say "expired".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity

from proxy.gate.checks import Agent
from proxy.settings import Secrets

# The secret's NAME (OPGATE_SECRET_MCP_STATE_KEY or <secrets_dir>/mcp_state_key), not its value.
STATE_KEY_SECRET = "mcp_state_key"  # noqa: S105
_AUDIT_KEY_SECRET = "audit_key"  # noqa: S105 (proxy.observe.observer's; derived from, never used as is)
# Domain separation: a key derived from a secret that has another job is never that secret.
_LABEL = b"opgate/mcp/request-state/v1"
AUDIENCE = "opgate/mcp"  # who minted it: a state of another service under the same key fails


def state_key(credentials: Secrets) -> bytes:
    """The sealing key: from ``mcp_state_key``, else from ``audit_key``, else this process's."""
    for name in (STATE_KEY_SECRET, _AUDIT_KEY_SECRET):
        secret = credentials.secret(name)
        if secret:
            return hmac.new(secret.encode("utf-8"), _LABEL + name.encode(), hashlib.sha256).digest()
    return os.urandom(32)


def principal(agent: Agent) -> str:
    """Who a state is bound to: the agent, within its tenant."""
    return json.dumps([agent.tenant, agent.agent_id], separators=(",", ":"))


def sealing_boundary(
    key: bytes,
    ttl_seconds: float,
    agent_of: Callable[[ServerRequestContext[Any, Any]], Agent],
) -> RequestStateBoundary:
    """The SDK's boundary with opgate's key, time to live and principal (the server's
    middleware: it runs before every handler and interceptor)."""
    security = RequestStateSecurity(
        keys=[key],
        ttl=ttl_seconds,
        bind_principal=lambda ctx: principal(agent_of(ctx)),
        audience=AUDIENCE,
    )
    return RequestStateBoundary(security, default_audience=AUDIENCE)
