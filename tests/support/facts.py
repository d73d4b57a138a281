"""The pure checks' inputs: a policy, an agent, request facts and an operation row, to order."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.gate.bodies import ParsedBody
from proxy.gate.checks import (
    Agent,
    RequestFacts,
)
from proxy.policy.load import parse_policy_text
from proxy.policy.model import BodyKind, Provider
from proxy.store.operation import Operation, Status

POLICY = """
version: 1
provider: pay
route_prefix: /pay
upstream: https://pay.example
idempotency:
  provider_deduplicates: {dedup}
metadata_injection:
  kind: form_field
  field: metadata[operation_id]
rules:
  - name: refund.create
    method: POST
    path: /v1/refunds
    amount: amount
    currency: currency
    params: [charge, reverse]
    free: [reason, "metadata[*]"]
  - name: charge.cancel
    method: POST
    path: /v1/charges/{{charge}}/cancel
    inject_metadata: false
  - name: read
    method: GET
    path: /v1/{{rest...}}
    operation: none
    body: none
"""


JSON_POLICY = """
version: 1
provider: jpay
route_prefix: /jpay
upstream: https://jpay.example
metadata_injection:
  kind: json_pointer
  pointer: /metadata/operation_id
rules:
  - name: transfer.create
    method: POST
    path: /v1/transfers
    body: json
    amount: /amount
    currency: /currency
    params: [/destination, /instant, /count]
    free: ["/description"]
"""


def load_provider(text: str) -> Provider:
    provider, problems = parse_policy_text(text, "inline.yaml")
    assert problems == []
    assert provider is not None
    return provider


PAY = load_provider(POLICY.format(dedup="false"))


JPAY = load_provider(JSON_POLICY)


NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


AGENT = Agent(agent_id="agent-1", tenant="acme")


def make_operation(**overrides: Any) -> Operation:
    """A created, unexpired refund of 500 usd on ch_1, read at NOW; overrides replace fields.

    Columns the checks never read (recovery bookkeeping) default to None, so the builder
    survives new columns; a misspelt override still fails, as Operation() rejects it."""
    fields: dict[str, Any] = {field.name: None for field in dataclasses.fields(Operation)}
    fields |= {
        "operation_id": "op_1",
        "tenant": "acme",
        "agent_id": "agent-1",
        "provider": "pay",
        "action": "refund.create",
        "method": "POST",
        "path": "/v1/refunds",
        "path_params": {},
        "amount": 500,
        "currency": "usd",
        "params": {"charge": "ch_1"},
        "idempotency_key": "opk_1",
        "approval_ref": "ticket-1",
        "approved_by": "alice",
        "expires_at": NOW + timedelta(hours=1),
        "status": Status.CREATED,
        "revoked_at": None,
        "revoked_reason": None,
        "attempts": 0,
        "unsent_attempts": 0,
        "dispatched_at": None,
        "lease_owner": None,
        "lease_until": None,
        "last_outcome": None,
        "provider_status": None,
        "provider_object_id": None,
        "response_content_type": None,
        "response_body": None,
        "settled_at": None,
        "created_at": NOW - timedelta(minutes=5),
        "updated_at": NOW - timedelta(minutes=5),
        "read_at": NOW,
    }
    fields.update(overrides)
    return Operation(**fields)


def make_facts(
    form: dict[str, str] | None = None,
    *,
    provider: Provider = PAY,
    rule: str = "refund.create",
    method: str = "POST",
    path: str = "/v1/refunds",
    path_params: dict[str, str] | None = None,
    json: dict[str, Any] | None = None,
    agent: Agent = AGENT,
    named_operation_id: str | None = "op_1",
    idempotency_key: str | None = None,
) -> RequestFacts:
    """The request matching make_operation(), with a form (or JSON) body as given."""
    matched = provider.rule_named(rule)
    assert matched is not None
    if json is not None:
        body = ParsedBody(BodyKind.JSON, json=json)
    elif matched.body is BodyKind.NONE:
        body = ParsedBody(BodyKind.NONE)
    else:
        sent = {"amount": "500", "currency": "usd", "charge": "ch_1"} if form is None else form
        body = ParsedBody(BodyKind.FORM, form=tuple(sent.items()))
    return RequestFacts(
        agent=agent,
        provider=provider,
        rule=matched,
        method=method,
        path=path,
        path_params=path_params or {},
        body=body,
        named_operation_id=named_operation_id,
        idempotency_key=idempotency_key,
        injected_field=provider.metadata_field(matched),
    )
