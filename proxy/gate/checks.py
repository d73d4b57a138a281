"""The decision core: ordered, pure checks of one request against its operation row.

No IO. ``decide`` starts from *deny* and only returns Forward or Replay once every check has
passed; the first check that fails names the reason. The order matters and is part of the
contract: identity before content, content before state, so that a re-sent request with a
different payload is told "422 mismatch" (IETF Idempotency-Key draft), not "here is the replay".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from proxy.gate import transitions
from proxy.gate.bodies import ABSENT, ParsedBody, reads_as_field
from proxy.gate.decision import ClaimKind, Decision, Deny, Forward, Replay
from proxy.gate.reasons import Reason
from proxy.gate.transitions import ClaimRule
from proxy.policy import amounts
from proxy.policy.amounts import AmountFormat
from proxy.policy.fields import free_matcher, param_matcher
from proxy.policy.model import BodyKind, Mode, OperationRequirement, Provider, Rule
from proxy.store.operation import Operation


@dataclass(frozen=True)
class Agent:
    agent_id: str
    tenant: str


@dataclass(frozen=True)
class RequestFacts:
    """Everything the checks may look at, gathered (and parsed) before any decision."""

    agent: Agent
    provider: Provider
    rule: Rule
    method: str
    path: str  # below the route prefix
    path_params: dict[str, str]
    body: ParsedBody
    named_operation_id: str | None  # from X-Operation-Id
    idempotency_key: str | None  # from the provider's idempotency header or body field
    injected_field: str | None  # the metadata field opgate will set (form key or JSON pointer)
    key_field: str | None = None  # the body field carrying the idempotency key, if any


Check = Callable[[RequestFacts, Operation], Deny | None]


def check_scope(facts: RequestFacts, op: Operation) -> Deny | None:
    if op.tenant != facts.agent.tenant or (
        op.agent_id is not None and op.agent_id != facts.agent.agent_id
    ):
        return Deny(Reason.OPERATION_SCOPE_MISMATCH, "the operation is not approved for this agent")
    return None


def check_target(facts: RequestFacts, op: Operation) -> Deny | None:
    if op.provider != facts.provider.provider or op.action != facts.rule.name:
        return Deny(
            Reason.TARGET_MISMATCH,
            f"approved for {op.provider} {op.action}, "
            f"not {facts.provider.provider} {facts.rule.name}",
        )
    if op.method != facts.method or op.path != facts.path:
        return Deny(
            Reason.TARGET_MISMATCH,
            f"approved for {op.method} {op.path}, not {facts.method} {facts.path}",
        )
    return None


def check_idempotency_key(facts: RequestFacts, op: Operation) -> Deny | None:
    if facts.idempotency_key is not None and facts.idempotency_key != op.idempotency_key:
        return Deny(Reason.IDEMPOTENCY_KEY_MISMATCH, "the idempotency key is not the approved one")
    return None


def check_amount(facts: RequestFacts, op: Operation) -> Deny | None:
    """The amount, in the rule's format, must spell exactly the approved minor units: for a
    decimal amount, in the approved currency's exponent (``"10.99"`` USD, never ``"10.990"``)."""
    rule = facts.rule
    if rule.amount is None:
        return None
    sent = facts.body.value_at(rule.amount)
    if sent is ABSENT and op.amount is None:
        return None
    as_text = facts.body.kind is BodyKind.FORM
    read = amounts.read(rule.amount_format, sent, op.currency, as_text=as_text)
    if op.amount is not None and read == op.amount:
        return None
    approved = _show(op.amount)
    if op.amount is not None and rule.amount_format is AmountFormat.DECIMAL:
        spelt = amounts.spelling(rule.amount_format, op.amount, op.currency, as_text=as_text)
        approved = f"{spelt!r} ({op.amount} minor units of {op.currency})"
    return Deny(Reason.AMOUNT_MISMATCH, f"{rule.amount} is {_show(sent)}, approved {approved}")


def check_currency(facts: RequestFacts, op: Operation) -> Deny | None:
    if facts.rule.currency is None:
        return None
    sent = facts.body.value_at(facts.rule.currency)
    expected = op.currency
    if (sent is ABSENT and expected is None) or same_currency(sent, expected):
        return None
    return Deny(
        Reason.CURRENCY_MISMATCH,
        f"{facts.rule.currency} is {_show(sent)}, approved {_show(expected)}",
    )


def same_currency(sent: object, approved: str | None) -> bool:
    """ASCII letters compared without case, nothing else: Unicode case mapping would equate
    the Kelvin sign with k (``\u212aes`` lowers to ``kes``). The approved spelling is what
    leaves (pipeline), never the agent's."""
    return (
        isinstance(sent, str)
        and approved is not None
        and sent.isascii()
        and sent.lower() == approved.lower()
    )


def check_params(facts: RequestFacts, op: Operation) -> Deny | None:
    """Each approved parameter exactly: a list or object as a whole (order included, no
    element more or less), a ``*`` pattern as the list of every element's value."""
    for name in facts.rule.params:
        sent, approved = facts.body.value_at(name), op.params.get(name, ABSENT)
        if not same_value(sent, approved):
            return Deny(
                Reason.PARAMETER_MISMATCH, f"{name} is {_show(sent)}, approved {_show(approved)}"
            )
    return None


def check_no_unexpected_fields(facts: RequestFacts, op: Operation) -> Deny | None:
    return unexpected_field(facts)


def unexpected_field(facts: RequestFacts) -> Deny | None:
    """Fail closed on fields nobody approved: the agent may only set what the rule lets it."""
    rule = facts.rule
    json = facts.body.kind is BodyKind.JSON
    named = {f for f in (rule.amount, rule.currency, facts.injected_field, facts.key_field) if f}
    for field in facts.body.fields():
        if field in named:
            continue
        if any(param_matcher(p, json=json).fullmatch(field) for p in rule.params):
            continue
        if any(free_matcher(p, json=json).fullmatch(field) for p in rule.free):
            continue
        return Deny(Reason.PARAMETER_UNEXPECTED, f"{field} is neither approved nor free to set")
    return None


def check_injected_field(facts: RequestFacts, op: Operation) -> Deny | None:
    return injection_conflict(facts, op.operation_id)


def injection_conflict(facts: RequestFacts, operation_id: str) -> Deny | None:
    """The injected field is opgate's: the agent may only send it holding the operation's id,
    and may not send a field a provider's parser could read as it (or as something inside it:
    ``metadata[operation_id][x]``, ``metadata.operation_id``), whatever that field holds."""
    injected = facts.injected_field
    if injected is None:
        return None
    fields = facts.body.fields()
    sent = fields.get(injected)
    if sent is not None and sent != operation_id:
        return Deny(Reason.INJECTION_CONFLICT, f"{injected} is set by opgate")
    for field in fields:
        if reads_as_field(facts.body.kind, field, injected):
            return Deny(
                Reason.INJECTION_CONFLICT, f"{field} may be read as {injected}, set by opgate"
            )
    return None


# The payload checks: any difference from the approved operation is a 422.
PAYLOAD_CHECKS: tuple[Check, ...] = (
    check_scope,
    check_target,
    check_idempotency_key,
    check_amount,
    check_currency,
    check_params,
    check_injected_field,
    check_no_unexpected_fields,
)


# Shadow mode (``mode: report``) relaxes only these: how the payload differs from the approval.
# Never who may act on which operation (scope, target, key), never the field opgate injects, and
# never the state machine: a request in report mode still needs its row, and still claims it.
RELAXED_IN_REPORT_MODE: frozenset[Check] = frozenset(
    {check_amount, check_currency, check_params, check_no_unexpected_fields}
)


@dataclass(frozen=True)
class CheckResult:
    check: str  # the check's name without its ``check_`` prefix, e.g. "amount"
    denied: Deny | None  # None: passed
    relaxed: bool = False  # failed, but the rule is in report mode and this check may be relaxed


@dataclass(frozen=True)
class Verdict:
    """Every check's result, in order, and the decision they make together."""

    mode: Mode
    results: tuple[CheckResult, ...]  # empty when no payload check applies (no operation)
    state: Decision | None  # what the operation's state allows, once the payload checks pass
    decision: Decision


def evaluate(
    facts: RequestFacts, op: Operation | None, *, operation_lookup_failed: bool
) -> Verdict:
    """All checks for one request (``decide`` is its decision; explain shows the rest)."""
    mode = facts.provider.mode_for(facts.rule)
    if facts.rule.operation is OperationRequirement.NONE:
        return Verdict(mode, (), None, Forward(ClaimKind.NONE))
    if op is None:
        if operation_lookup_failed:
            missing = Deny(Reason.OPERATION_UNKNOWN, f"no operation {facts.named_operation_id}")
        else:
            missing = Deny(Reason.OPERATION_REQUIRED, "no approved operation is named")
        return Verdict(mode, (), None, missing)
    results = tuple(
        _result(check, check(facts, op), mode is Mode.REPORT) for check in PAYLOAD_CHECKS
    )
    enforced = next((r.denied for r in results if r.denied and not r.relaxed), None)
    if enforced is not None:
        return Verdict(mode, results, None, enforced)
    state = decide_by_state(facts.provider, op)
    shadowed = next((r.denied for r in results if r.denied), None)
    decision = state
    if shadowed is not None and isinstance(state, Forward | Replay):
        decision = replace(state, would_deny=shadowed)
    return Verdict(mode, results, state, decision)


def decide(facts: RequestFacts, op: Operation | None, *, operation_lookup_failed: bool) -> Decision:
    """The verdict for one request. ``op`` is the row read from the primary, or None."""
    return evaluate(facts, op, operation_lookup_failed=operation_lookup_failed).decision


def concealed(facts: RequestFacts, deny: Deny, *, operation_lookup_failed: bool) -> Deny | None:
    """What the agent is told instead of ``deny`` when ``deny`` would confirm that an operation
    outside its scope exists: exactly what ``decide`` answers when no row is found (by id, 404
    operation_unknown; by key alone, 400 operation_required), so that no agent can probe other
    tenants' ids, keys or statuses. None: ``deny`` is told as it is. The audit keeps the truth."""
    if deny.reason is not Reason.OPERATION_SCOPE_MISMATCH:
        return None
    absent = decide(facts, None, operation_lookup_failed=operation_lookup_failed)
    assert isinstance(absent, Deny)  # a rule that takes no operation never loads one
    return absent


def _result(check: Check, denied: Deny | None, report_mode: bool) -> CheckResult:
    relaxed = denied is not None and report_mode and check in RELAXED_IN_REPORT_MODE
    return CheckResult(check.__name__.removeprefix("check_"), denied, relaxed)


def decide_by_state(provider: Provider, op: Operation) -> Decision:
    """For a request identical to the approval: what the operation's state allows
    (proxy/gate/transitions.py decides it, for recovery too)."""
    return transitions.decision(transitions.transition(op, ClaimRule.of(provider, op.action)), op)


def reconcile_required(provider: Provider, op: Operation, retry_after: int | None = None) -> Deny:
    """A re-send could duplicate the effect: the outcome must be settled by the provider."""
    reason = transitions.reconcile_reason(ClaimRule.of(provider, op.action), op)
    return Deny(Reason.RECONCILE_REQUIRED, reason, retry_after)


def same_value(sent: object, approved: object) -> bool:
    """Equal and of the same JSON types all the way down: True never matches an approved 1,
    1.0 never matches 1, and lists compare in order."""
    if type(sent) is not type(approved):
        return False
    if isinstance(sent, list):
        assert isinstance(approved, list)
        return len(sent) == len(approved) and all(
            same_value(a, b) for a, b in zip(sent, approved, strict=True)
        )
    if isinstance(sent, dict):
        assert isinstance(approved, dict)
        return sent.keys() == approved.keys() and all(
            same_value(sent[k], approved[k]) for k in sent
        )
    return bool(sent == approved)


def _show(value: object) -> str:
    return "absent" if value is None else repr(value)
