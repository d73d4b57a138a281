"""A first send claimed by the statement that reads its row. Pure.

A request that names its operation (by id, or by the provider's idempotency key) is usually
exactly what was approved. It can then be claimed by the same statement that reads the row
(queries.sql ``claim_operation``, $9), with the approval's terms in that statement's WHERE: one
statement, and one store call, fewer per operation. Nothing here decides. The WHERE only
narrows which rows that statement may claim, and every comparison in it is stricter than the
checks' own (proxy/gate/checks.py):

- scope, target and key are column equalities, as in the checks;
- the amount is compared as the minor units the checks read from the body, in the currency the
  body names (the approved one, in either ASCII case, has the same exponent);
- the currency must be the one sent, in lower or upper case: an approved ``Usd`` is left to the
  checks;
- the approved parameters compare as jsonb texts, which keep ``1`` and ``1.0`` apart. Where the
  checks look only at the rule's parameters, the whole ``params`` object must match.

Where the WHERE does not hold, nothing is claimed: the row comes back as it is, and the request
goes the ordinary way (checks, then the claim). The checks then run on the claimed row as well
(``first_payload_refusal``), so that if the two ever disagree, the claim is withdrawn before
anything leaves.

A rule with preconditions is claimed as sent only when no recheck is due
(proxy/gate/preconditions.py): the WHERE states that the row supersedes nothing, was not
approved from a proposal, and is younger than the rule's ``recheck_after_seconds`` by a
millisecond's margin (PostgreSQL's intervals and Python's timedeltas may round the seconds to
microseconds differently). An older row comes back unclaimed, for its lookup. Should the
pipeline find a recheck due on a row so claimed, the claim is withdrawn and the operation
escalated: withdrawn, the row is dispatched, and a dispatched row is never rechecked.

``as_sent`` gives None, leaving the request to the ordinary way, for whatever that WHERE cannot
state exactly: a request that names no operation, a rule with a spend budget (its claim waits
on a lock) or whose preconditions are always rechecked, a field the checks refuse whatever the
row holds, a decimal amount without the currency that gives its exponent, or a value that jsonb
would store differently (a float written with an exponent, a NUL).
"""

from __future__ import annotations

import json
import math
from typing import Any

from proxy.gate.bodies import ABSENT
from proxy.gate.checks import RequestFacts, injection_conflict, unexpected_field
from proxy.policy import amounts
from proxy.policy.amounts import AmountFormat
from proxy.policy.model import BodyKind, OperationRequirement, Rule
from proxy.store.proposal import PROPOSAL_ID_PREFIX

_BIGINT = 2**63 - 1
_RECHECK_MARGIN_SECONDS = 0.001


def as_sent(facts: RequestFacts) -> str | None:
    """The JSON that ``claim_operation`` compares the row with, or None (see above)."""
    rule, operation_id = facts.rule, facts.named_operation_id
    if rule.operation is OperationRequirement.NONE:
        return None
    if operation_id is None and facts.idempotency_key is None:
        return None  # no operation is named: refused by the checks without a row
    if facts.provider.budgets and rule.amount is not None:
        return None
    fresh_for = _without_recheck_for(rule)
    if rule.preconditions is not None and fresh_for is None:
        return None
    if operation_id is None and facts.injected_field in facts.body.fields():
        return None  # the injected field must hold the operation's id, not yet known here
    if unexpected_field(facts) or injection_conflict(facts, operation_id or ""):
        return None
    request: dict[str, Any] = {
        "tenant": facts.agent.tenant,
        "agent_id": facts.agent.agent_id,
        "provider": facts.provider.provider,
        "action": rule.name,
        "method": facts.method,
        "path": facts.path,
        "idempotency_key": facts.idempotency_key,
    }
    currency = None
    if rule.currency is not None:
        sent = facts.body.value_at(rule.currency)
        if sent is ABSENT:
            request["currency"] = None
        elif isinstance(sent, str) and sent.isascii() and sent.isalpha():
            currency = sent
            request["currency"] = [sent.lower(), sent.upper()]
        else:
            return None
    if rule.amount is not None:
        sent = facts.body.value_at(rule.amount)
        if sent is ABSENT:
            request["amount"] = None
        else:
            if rule.amount_format is AmountFormat.DECIMAL and currency is None:
                return None
            as_text = facts.body.kind is BodyKind.FORM
            read = amounts.read(rule.amount_format, sent, currency, as_text=as_text)
            if read is None or not -_BIGINT <= read <= _BIGINT:
                return None
            request["amount"] = read
    params = {}
    for name in rule.params:
        sent = facts.body.value_at(name)
        if sent is not ABSENT:
            params[name] = sent
    request["params"] = params
    if not all(_stored_as_is(value) for value in request.values()):
        return None
    if fresh_for is not None:
        request["no_recheck"] = {"younger_than": fresh_for, "proposal_prefix": PROPOSAL_ID_PREFIX}
    return json.dumps(request)


def _without_recheck_for(rule: Rule) -> float | None:
    """How many seconds after its approval a row of ``rule`` is claimed as sent without its
    preconditions' lookup, or None: a rule without preconditions, or one whose first sends
    are always rechecked."""
    if rule.preconditions is None:
        return None
    seconds = rule.preconditions.recheck_after_seconds - _RECHECK_MARGIN_SECONDS
    return seconds if seconds > 0 else None


def _stored_as_is(value: object) -> bool:
    """Whether jsonb keeps ``value`` so that its text reads back as the same value and type:
    no NUL (jsonb refuses it), no float that jsonb would write without its exponent (``1e+16``
    reads back as an integer)."""
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, float):
        return math.isfinite(value) and "e" not in repr(value)
    if isinstance(value, list):
        return all(_stored_as_is(item) for item in value)
    if isinstance(value, dict):
        return all(_stored_as_is(k) and _stored_as_is(v) for k, v in value.items())
    return False  # ABSENT inside a list (an element without the field), or anything else
