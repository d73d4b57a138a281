"""The body fields an approval implies: what the one well-formed request for it carries. Pure.

Used where opgate must know that request without an agent having sent it: when an approval is
created (can it be sent at all?) and when a replacement agent asks how to re-send it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.policy import amounts
from proxy.policy.model import X402_TERMS, BodyKind, Provider, Rule


def approved_fields(
    provider: Provider,
    rule: Rule,
    *,
    amount: int | None,
    currency: str | None,
    params: Mapping[str, Any],
    idempotency_key: str,
) -> dict[str, Any]:
    """Field name (form key or JSON pointer, ``*`` fields as lists) -> value, as sent."""
    # an x402 rule's payment terms are approved, and carried by no request (model.X402_TERMS)
    terms = X402_TERMS if rule.x402 is not None else ()
    fields: dict[str, Any] = {name: value for name, value in params.items() if name not in terms}
    as_text = rule.body is BodyKind.FORM
    if rule.amount is not None and amount is not None:
        fmt = rule.amount_format
        fields[rule.amount] = amounts.spelling(fmt, amount, currency, as_text=as_text)
    if rule.currency is not None and currency is not None:
        fields[rule.currency] = provider.currency_spelling(currency)
    key_field = provider.key_field(rule)
    if key_field is not None:
        fields[key_field] = idempotency_key
    return fields
