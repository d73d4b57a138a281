"""Turning an approval (the operations API's create request) into an operation row. Pure.

The approval is validated against the policy rule it names, so that every operation that exists
can be sent by exactly one well-formed request: the path renders, the amount and currency are
there iff the rule reads them, approved parameters are ones the rule compares, the smallest body
carrying them fits the provider's request limit, and the approval does not outlive the
provider's memory of its idempotency key.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from proxy.gate.bodies import BodyRejected, body_from_fields
from proxy.gate.ids import NEW_OPERATION_ID, IdKind, id_rule, valid_id
from proxy.policy import amounts
from proxy.policy.amounts import AmountFormat
from proxy.policy.approved import approved_fields
from proxy.policy.budgets import budget_problems
from proxy.policy.model import X402_TERMS, BodyKind, OperationRequirement, Provider, Rule
from proxy.policy.set import PolicySet
from proxy.store.operation import Approval, Approved, Operation, Status
from proxy.store.store import NewOperation

_ID = NEW_OPERATION_ID  # the ids opgate creates and accepts to create (proxy/gate/ids.py)


class OperationRequest(BaseModel):
    """The body of ``POST /v1/operations``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operation_id: Annotated[str, Field(pattern=_ID)] | None = None
    tenant: Annotated[str, Field(min_length=1, max_length=128)]
    agent_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    provider: str
    action: str
    path_params: dict[str, str] = Field(default_factory=dict)
    # strict: money is a JSON integer; "100", true and 100.0 are refused, not coerced
    amount: Annotated[int, Field(strict=True, ge=0, le=2**53 - 1)] | None = None
    currency: Annotated[str, Field(pattern=r"^[A-Za-z]{3}$")] | None = None
    # text, numbers and booleans; on a JSON rule also lists and objects (compared exactly), and
    # a `*` parameter takes the list of every element's value
    params: dict[str, JsonValue] = Field(default_factory=dict)
    idempotency_key: str | None = None
    approval_ref: Annotated[str, Field(min_length=1, max_length=256)]
    approved_by: Annotated[str, Field(min_length=1, max_length=256)]
    expires_at: datetime | None = None
    # The operation this one replaces (it failed with no effect, or was never sent and is no
    # longer approved). The link records that the old approval is evidence, not permission.
    supersedes: Annotated[str, Field(pattern=_ID)] | None = None
    ttl_seconds: Annotated[int, Field(strict=True, gt=0, le=30 * 86400)] | None = None

    @field_validator("params")
    @classmethod
    def _sendable_values(cls, params: dict[str, JsonValue]) -> dict[str, JsonValue]:
        for name, value in params.items():
            problem = _unsendable(value)
            if problem:
                raise ValueError(f"parameter {name}: {problem}")
        return params

    @model_validator(mode="after")
    def _one_expiry(self) -> OperationRequest:
        if (self.expires_at is None) == (self.ttl_seconds is None):
            raise ValueError("give exactly one of expires_at and ttl_seconds")
        if self.expires_at is not None and self.expires_at.tzinfo is None:
            raise ValueError("expires_at needs a time zone")
        key = self.idempotency_key
        if key is not None and not valid_id(key, IdKind.IDEMPOTENCY_KEY):
            raise ValueError(id_rule(IdKind.IDEMPOTENCY_KEY))
        return self


def _unsendable(value: object) -> str | None:
    """Why a parameter value could never be sent as JSON exactly: a null (absent is how an
    approval says "not sent"), a NaN or an infinity (bodies.py refuses them)."""
    if value is None:
        return "null is not a value: leave the parameter out"
    if isinstance(value, float) and not math.isfinite(value):
        return "a number must be finite"
    if isinstance(value, list):
        return next((p for v in value if (p := _unsendable(v))), None)
    if isinstance(value, dict):
        return next((p for v in value.values() if (p := _unsendable(v))), None)
    return None


def new_operation_id() -> str:
    return "op_" + secrets.token_hex(12)


def new_idempotency_key() -> str:
    return "opk_" + secrets.token_hex(16)


def plan_operation(
    req: OperationRequest, policy: PolicySet, now: datetime
) -> NewOperation | list[str]:
    """The row to insert, or every reason the approval cannot be sent as it stands."""
    provider = policy.provider_named(req.provider)
    if provider is None:
        return [f"no provider {req.provider!r} in the loaded policy"]
    rule = provider.rule_named(req.action)
    if rule is None:
        return [f"provider {req.provider} has no rule {req.action!r}"]
    problems: list[str] = []
    if rule.operation is not OperationRequirement.REQUIRED:
        problems.append(f"rule {rule.name} does not take operations")
    try:
        path = rule.path.render(req.path_params)
    except ValueError as exc:
        problems.append(str(exc))
        path = ""
    if (rule.amount is None) and req.amount is not None:
        problems.append(f"rule {rule.name} reads no amount")
    # On a budgeted provider, a call whose body carries no currency (a Stripe refund is in
    # its charge's) is counted in the currency its approval states (proxy/policy/budgets.py).
    states_currency = bool(provider.budgets) and rule.amount is not None
    if (rule.currency is None) and req.currency is not None and not states_currency:
        problems.append(f"rule {rule.name} reads no currency")
    problems.extend(
        budget_problems(
            provider.budgets,
            reads_amount=rule.amount is not None,
            amount=req.amount,
            currency=req.currency,
            agent_id=req.agent_id,
        )
    )
    if rule.currency is not None and req.amount is not None and req.currency is None:
        problems.append("an amount needs its currency")
    # an x402 rule's payment terms are approved params that no request carries (policy X402_TERMS)
    terms = set(X402_TERMS) if rule.x402 is not None else set()
    unknown = sorted(set(req.params) - set(rule.params) - terms)
    if unknown:
        problems.append(f"rule {rule.name} compares no parameters {unknown}")
    problems.extend(_param_shape_problems(rule, req.params))
    decimal = rule.amount_format is AmountFormat.DECIMAL
    if (
        decimal
        and req.amount is not None
        and amounts.decimal_spelling(req.amount, req.currency) is None
    ):
        problems.append(
            f"rule {rule.name} spells the amount as a decimal, and opgate knows no ISO 4217 "
            f"exponent for currency {req.currency!r}"
        )
    key = req.idempotency_key or new_idempotency_key()
    key_problem = provider.idempotency.key_problem(key)
    if key_problem is not None:
        problems.append(f"{key_problem} ({provider.provider}'s limit)")
    expires_at = req.expires_at or now + timedelta(seconds=req.ttl_seconds or 0)
    if expires_at <= now:
        problems.append("the approval has already expired")
    problems.extend(_outlives_key_retention(provider, expires_at - now))
    if not problems:
        problems.extend(_too_large_to_send(provider, rule, req, key))
    if problems:
        return problems
    params: dict[str, Any] = dict(req.params)
    return NewOperation(
        operation_id=req.operation_id or new_operation_id(),
        tenant=req.tenant,
        agent_id=req.agent_id,
        provider=provider.provider,
        action=rule.name,
        method=rule.method,
        path=path,
        path_params=dict(req.path_params),
        amount=req.amount,
        currency=req.currency.lower() if req.currency else None,
        params=params,
        idempotency_key=key,
        approval_ref=req.approval_ref,
        approved_by=req.approved_by,
        expires_at=expires_at,
        supersedes=req.supersedes,
    )


def _outlives_key_retention(provider: Provider, lifetime: timedelta) -> list[str]:
    """A provider that deduplicates on the key forgets it after ``retention_seconds``: an
    approval standing longer could be re-sent (an unknown outcome, then a retry) when the key
    no longer protects it, and be carried out twice."""
    retention = provider.idempotency.retention_seconds
    if not provider.idempotency.provider_deduplicates or retention is None:
        return []
    seconds = lifetime.total_seconds()
    if seconds <= retention:
        return []
    return [
        f"the approval stands {seconds:g} s, longer than {provider.provider} keeps an "
        f"idempotency key ({retention:g} s): a re-send after that would not be deduplicated"
    ]


def _param_shape_problems(rule: Rule, params: dict[str, Any]) -> list[str]:
    """Each approved parameter must be a value a request of this rule can carry: text in a
    form, a list for a ``*`` parameter (one value per element), nested as deep as its stars."""
    problems: list[str] = []
    non_text: list[str] = []
    for name, value in sorted(params.items()):
        depth = name.count("*")
        if not _list_depth_fits(value, depth):
            problems.append(f"parameter {name} takes {depth} nested list(s), one value per element")
        elif rule.body is BodyKind.FORM and not _all_text(value, depth):
            non_text.append(name)
    if non_text:
        problems.append(f"form parameters are text; {non_text} are not strings")
    return problems


def _list_depth_fits(value: Any, depth: int) -> bool:
    if depth == 0:
        return True
    return isinstance(value, list) and all(_list_depth_fits(v, depth - 1) for v in value)


def _all_text(value: Any, depth: int) -> bool:
    if depth == 0:
        return isinstance(value, str)
    return all(_all_text(v, depth - 1) for v in value)


def _too_large_to_send(
    provider: Provider, rule: Rule, req: OperationRequest, key: str
) -> list[str]:
    """The smallest body an agent could send for this approval (the approved fields, nothing
    else) must fit the provider's request-body limit, or no request can ever carry it."""
    fields = approved_fields(
        provider,
        rule,
        amount=req.amount,
        currency=req.currency.lower() if req.currency else None,
        params=req.params,
        idempotency_key=key,
    )
    try:
        size = body_from_fields(rule.body, fields).smallest_size()
    except BodyRejected as exc:
        return [f"the approved fields make no body: {exc}"]
    limit = provider.limits.max_request_body_bytes
    if size <= limit:
        return []
    return [
        f"the smallest request body carrying this approval is {size} bytes, over "
        f"{provider.provider}'s limit of {limit} bytes"
    ]


def supersession_problem(new: NewOperation, old: Operation | None) -> str | None:
    """Why ``new`` may not replace ``old`` (None: it may). Pure."""
    if old is None:
        return f"no operation {new.supersedes} to supersede"
    if old.tenant != new.tenant:
        return "an operation can only be superseded within its tenant"
    if old.status is Status.FAILED:
        return None
    if old.status is Status.CREATED and not old.approval_stands():
        return None
    return (
        f"{old.operation_id} is {old.status.value}: only an operation that failed with no effect "
        "(or was never sent and is no longer approved) can be superseded"
    )


# What a repeated create (the same operation_id) must ask for again to be a repeat: the request
# (its key aside: one left out is generated anew) and the approval's reference. Who approved
# it and until when may differ (a ttl runs from each create).
REPEATED_FIELDS = (
    "tenant",
    "agent_id",
    "provider",
    "action",
    "path",
    "amount",
    "currency",
    "params",
    "approval_ref",
)


def same_approval(new: Approved, existing: Approved) -> bool:
    """Whether a repeated create (same operation_id) asks for what the row already holds."""
    return all(getattr(new, name) == getattr(existing, name) for name in REPEATED_FIELDS)


# The approval's fields that its request does not name: the rule's (its method, and its path
# rendered from path_params).
FROM_THE_RULE = frozenset({"method", "path"})


def request_for(approval: Approval, **given: Any) -> OperationRequest:
    """The request that asks for ``approval`` again (unvalidated: the approval was), with
    ``given``: what an approval adds (approval_ref, approved_by, its expiry, supersedes)."""
    names = [f.name for f in fields(Approval) if f.name not in FROM_THE_RULE]
    values = {name: getattr(approval, name) for name in names}
    values["path_params"], values["params"] = dict(approval.path_params), dict(approval.params)
    return OperationRequest.model_construct(**values, **given)


def holds_nul(value: Any) -> bool:
    """Whether a NUL is anywhere in a JSON value, keys included: PostgreSQL can store one
    neither in text nor in jsonb, so such a document is refused before it reaches the store."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_nul(item) for item in value)
    return False


def validation_errors(exc: ValidationError) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in err['loc']) or '(body)'}: {err['msg']}" for err in exc.errors()
    ]
