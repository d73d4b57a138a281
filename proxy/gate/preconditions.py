"""Before an operation is first sent, ask the provider whether what the approval assumed still
holds: the rule's ``preconditions`` (proxy/policy/model.py, the expressions in
proxy/policy/expressions.py).

An approval is evidence of what was decided then. Between it and the send, a human may have
refunded the charge from the dashboard, or the intent been captured elsewhere. So, when a
recheck is due (``RECHECK_TRIGGERS``), each declared lookup is made with opgate's credential
and its assertions evaluated on the answer:

    every assertion held           -> Held: the claim may go, on the row as it was looked at
    an assertion is false          -> Failed: 409 precondition_failed, nothing sent, the row
                                      stays created; the evidence is audited and kept as an
                                      operation event (the recovery read shows it)
    a lookup failed, timed out, or
    its answer cannot be evaluated -> Unverifiable: 503 precondition_unverifiable, nothing sent

The lookup is a network call, so it cannot run inside the claim's transaction: the claim that
follows a Held requires the row unchanged since it was read for the lookup.

Only a send that nothing of the operation went before is checked: the first, or a re-send after
attempts that all ended before a byte left (not_sent), which may come hours after the approval.
A re-send after an attempt that may have reached the provider would find that attempt's own
effect (a refunded charge), and is settled by reconciliation instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from proxy.gate.decision import Deny
from proxy.gate.lookup import Inconclusive, LookupSubject, fetch, render_lookup
from proxy.gate.reasons import Reason
from proxy.observe.auditlog.storable import storable
from proxy.policy import expressions
from proxy.policy.model import PreconditionLookup, Preconditions, Provider, Rule
from proxy.runtime import Gateway
from proxy.store.operation import Operation
from proxy.store.proposal import PROPOSAL_ID_PREFIX


@dataclass(frozen=True)
class Held:
    evidence: dict[str, Any]


@dataclass(frozen=True)
class Failed:
    evidence: dict[str, Any]


@dataclass(frozen=True)
class Unverifiable:
    why: str
    evidence: dict[str, Any]


Checked = Held | Failed | Unverifiable


# --- when (pure) -----------------------------------------------------------------------------
def _superseding(preconditions: Preconditions, op: Operation) -> str | None:
    """A superseding operation follows a failed one: the world moved at least that much."""
    return "supersedes" if op.supersedes is not None else None


def _approval_aged(preconditions: Preconditions, op: Operation) -> str | None:
    age = op.read_at - op.created_at
    if age >= timedelta(seconds=preconditions.recheck_after_seconds):
        return "approval_age"
    return None


def _from_proposal(preconditions: Preconditions, op: Operation) -> str | None:
    """A proposal was decided on the world as the agent saw it when proposing, maybe hours
    before the approval: its first send is always rechecked. (An approval service's reference
    that merely looks like a proposal id costs one lookup, never a send.)"""
    return "proposal" if op.approval_ref.startswith(PROPOSAL_ID_PREFIX) else None


# Each says why a recheck is due before this operation's first send (None: not for this
# reason). Read in one place (``recheck_due``), before any claim.
RECHECK_TRIGGERS: tuple[Callable[[Preconditions, Operation], str | None], ...] = (
    _superseding,
    _from_proposal,
    _approval_aged,
)


def recheck_due(rule: Rule, op: Operation) -> str | None:
    """Why the rule's preconditions must be checked before ``op`` is sent now, or None: only
    while nothing of it can have reached the provider (a created row, or a dispatched one whose
    every attempt ended not_sent)."""
    if rule.preconditions is None:
        return None
    if not op.nothing_left_yet():
        return None
    return next((why for t in RECHECK_TRIGGERS if (why := t(rule.preconditions, op))), None)


# --- what the answers say (pure) -------------------------------------------------------------
class Approved(LookupSubject, Protocol):
    """What the assertions compare with: an operation's approved values, or a proposal's."""

    @property
    def amount(self) -> int | None: ...
    @property
    def currency(self) -> str | None: ...


def approved_values(op: Approved) -> dict[str, Any]:
    return {
        "amount": op.amount,
        "currency": op.currency,
        "params": op.params,
        "path_params": op.path_params,
    }


def _not_json(constant: str) -> Any:
    """Python's reader takes NaN and Infinity; JSON has neither, and no store would keep them."""
    raise ValueError(f"{constant} is not JSON")


def judge_answer(
    lookup: PreconditionLookup, path: str, status: int, body: bytes, op: Approved
) -> Checked:
    """One lookup's answer against its assertions."""
    evidence: dict[str, Any] = {"path": path, "provider_status": status}
    if not 200 <= status < 300:
        return Unverifiable(f"the lookup of {path} answered {status}", evidence)
    try:
        answer = json.loads(body, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError):
        return Unverifiable(f"the lookup of {path} answered no JSON", evidence)
    outcomes = [
        expressions.evaluate(assertion, answer, approved_values(op))
        for assertion in lookup.assertions()
    ]
    # The values come from the provider: made storable (no NUL, no lone surrogate) before
    # they reach the audit log, the operation's event or the agent.
    evidence["assertions"] = storable([o.as_evidence() for o in outcomes])
    if any(o.held is False for o in outcomes):
        return Failed(evidence)
    unevaluated = next((o for o in outcomes if o.held is None and not o.skipped), None)
    if unevaluated is not None:
        return Unverifiable(f"{unevaluated.text!r}: {unevaluated.why}", evidence)
    return Held(evidence)


# A lookup's answer as the provider gave it (status, body), or why there was none.
LookupAnswer = tuple[int, bytes] | Inconclusive


def planned_lookups(rule: Rule, op: Operation) -> list[tuple[PreconditionLookup, str | None]]:
    """Each declared lookup with its path and query for ``op`` (None: skipped, the operation
    lacks a value its template names)."""
    assert rule.preconditions is not None
    return [(lookup, render_lookup(lookup, op)) for lookup in rule.preconditions.lookups]


def judge(
    trigger: str,
    op: Operation,
    planned: list[tuple[PreconditionLookup, str | None]],
    answers: Mapping[str, LookupAnswer],
) -> Checked:
    """Every planned lookup's answer (``answers``, by target) as one verdict. A false
    assertion anywhere fails the whole: it is a fact about the world, whatever another lookup
    could not tell."""
    results: list[Checked] = []
    lookups: list[dict[str, Any]] = []
    for lookup, target in planned:
        if target is None:
            lookups.append({"path": lookup.path, "skipped": "the operation lacks a value it names"})
            continue
        answer = answers[target]
        if isinstance(answer, Inconclusive):
            result: Checked = Unverifiable(answer.why, {"path": target, "error": answer.why})
        else:
            result = judge_answer(lookup, target, answer[0], answer[1], op)
        results.append(result)
        lookups.append(result.evidence)
    evidence = {"trigger": trigger, "lookups": lookups}
    if any(isinstance(r, Failed) for r in results):
        return Failed(evidence)
    unverifiable = next((r for r in results if isinstance(r, Unverifiable)), None)
    if unverifiable is not None:
        return Unverifiable(unverifiable.why, evidence)
    return Held(evidence)


def precondition_refusal(checked: Checked) -> Deny | None:
    """What the agent is told when the preconditions do not hold (None: they do)."""
    if isinstance(checked, Failed):
        return Deny(Reason.PRECONDITION_FAILED, failed_detail(checked.evidence))
    if isinstance(checked, Unverifiable):
        return Deny(Reason.PRECONDITION_UNVERIFIABLE, f"nothing was sent: {checked.why}", 1)
    return None


def failed_detail(evidence: dict[str, Any]) -> str:
    """The sentence the agent reads: which assertion no longer holds, on which values."""
    for lookup in evidence.get("lookups", []):
        for assertion in lookup.get("assertions", []):
            if assertion.get("held") is False:
                values = json.dumps(assertion["values"], allow_nan=False, sort_keys=True)
                return (
                    f"{lookup['path']}: {assertion['require']} no longer holds ({values}); "
                    "nothing was sent"
                )
    return "a precondition no longer holds; nothing was sent"


# --- the lookups (IO) ------------------------------------------------------------------------
async def check_preconditions(
    gw: Gateway, provider: Provider, rule: Rule, op: Operation, trigger: str
) -> Checked:
    """Each declared lookup, in order, then their verdict; every lookup is made (each says
    something the evidence should show), and each is bounded by the provider's timeouts."""
    planned = planned_lookups(rule, op)
    answers: dict[str, LookupAnswer] = {}
    for _, target in planned:
        if target is None or target in answers:
            continue
        got = await fetch(gw, provider, target)
        answers[target] = got if isinstance(got, Inconclusive) else (got.status, got.body)
    return judge(trigger, op, planned, answers)
