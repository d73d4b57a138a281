"""The request ``execute_operation`` sends: composed by opgate from the approved row, never by
the model. Pure.

It is the request an agent following the recovery protocol would send (``approved_request``):
the rule's method, the approved path, the body from amount, currency and parameters, the
approved key, ``X-Operation-Id``, and the agent's own token. Free fields are merged in as the
agent asked; whether they may be set is the pipeline's checks' question, answered as for any
HTTP request (``parameter_unexpected`` and the rest), so composing never decides anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.gate.bodies import BodyRejected, body_from_fields
from proxy.gate.decision import Deny
from proxy.gate.pipeline import ComposedRequest
from proxy.gate.reasons import Reason
from proxy.policy.approved import approved_fields
from proxy.policy.model import Provider, Rule
from proxy.store.operation import Operation


def compose_request(
    provider: Provider,
    rule: Rule,
    op: Operation,
    agent_token: str,
    free_fields: Mapping[str, Any],
) -> ComposedRequest | Deny:
    fields = approved_fields(
        provider,
        rule,
        amount=op.amount,
        currency=op.currency,
        params=op.params,
        idempotency_key=op.idempotency_key,
    )
    fields.update(free_fields)
    try:
        body = body_from_fields(rule.body, fields)
        serialised = body.serialise()
    except (BodyRejected, ValueError) as exc:  # ValueError: a value JSON cannot carry
        return Deny(Reason.BODY_INVALID, f"free_fields: {exc}")
    headers: CIMultiDict[str] = CIMultiDict()
    # Proxy-Authorization carries opgate's token for every provider (whatever its own header)
    # and is never forwarded.
    headers["Proxy-Authorization"] = f"Bearer {agent_token}"
    headers["X-Operation-Id"] = op.operation_id
    key_header = provider.key_header(rule)
    if key_header is not None:
        headers[key_header] = op.idempotency_key
    if body.media_type is not None:
        headers["Content-Type"] = body.media_type
    return ComposedRequest(
        method=op.method,
        raw_target=provider.route_prefix + op.path,
        headers=CIMultiDictProxy(headers),
        body=serialised,
    )
