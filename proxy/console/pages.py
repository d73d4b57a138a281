"""What each console page shows, read from the store and the process: plain dicts for the
templates. The operation views are the operations API's (``recovery_views``: the row and its
``next_action``), so the console and the API never disagree."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from proxy.console import explain
from proxy.gate.budgets import Standing, budget_standings, standings
from proxy.gate.lookup import Inconclusive, LookupSubject, fetch, render_lookup
from proxy.gate.preconditions import Failed, Held, judge_answer
from proxy.observe.auditlog.verify import unaccounted_runs, verify
from proxy.observe.observer import audit_key
from proxy.policy.amounts import human_amount
from proxy.policy.budgets import budgets_for
from proxy.policy.currencies import exponent
from proxy.policy.model import Provider, Rule
from proxy.proposals.rules import agent_owners, proposal_view
from proxy.recovery.api import recovery_views
from proxy.runtime import Gateway
from proxy.store.console import ConsoleStore
from proxy.store.operation import STATUS_FILTERS as STATUS_FILTERS  # views.py reads it here
from proxy.store.operation import UNSETTLED, Operation, Status
from proxy.store.proposal import Proposal

# "older than": the age filter's choices, in seconds
AGE_FILTERS: dict[str, float | None] = {
    "": None,
    "5m": 300.0,
    "1h": 3600.0,
    "1d": 86400.0,
    "7d": 7 * 86400.0,
}
# operation events that are reconciliation lookups: their detail is the lookup's evidence
LOOKUP_EVENTS = frozenset({"reconciled", "reconcile_inconclusive", "escalated"})
LIST_LIMIT = 500
# a budget this full is named on the dashboard line
NEAR_LIMIT = 0.8
# A proposal's preconditions are read from the provider when its page opens: never longer than
# this, whatever the provider's own timeout (the page is not held hostage by a slow provider).
PRECONDITION_READ_SECONDS = 5.0


@dataclass(frozen=True)
class Filters:
    status: str = "unsettled"
    tenant: str | None = None
    provider: str | None = None
    age: str = ""


async def summaries(gw: Gateway, ops: list[Operation]) -> list[dict[str, Any]]:
    """Each operation as a list row: the API's view plus what a human scans for."""
    views = await recovery_views(gw, ops)
    for op, view in zip(ops, views, strict=True):
        view["age_seconds"] = (op.read_at - op.created_at).total_seconds()
        view["sentence"] = explain.operation_said(view["operation"])
        if op.escalated_at is not None:
            view["escalated_seconds"] = (op.read_at - op.escalated_at).total_seconds()
    return views


async def operations(gw: Gateway, filters: Filters) -> list[dict[str, Any]]:
    ops = await ConsoleStore(gw.store).operations(
        STATUS_FILTERS[filters.status],
        filters.tenant,
        filters.provider,
        AGE_FILTERS[filters.age],
        LIST_LIMIT,
    )
    return await summaries(gw, ops)


async def escalations(gw: Gateway) -> list[dict[str, Any]]:
    return await summaries(gw, await ConsoleStore(gw.store).escalated(LIST_LIMIT))


async def timeline(gw: Gateway, operation_id: str) -> dict[str, Any] | None:
    """Everything known about one operation: the row, every transition, every audit record
    naming it (requests with their trace ids), the provider's stored answer, each
    reconciliation lookup and its evidence, and the escalation notices."""
    op = await gw.store.load(operation_id)
    if op is None:
        return None
    events = await gw.store.events(operation_id)
    console = ConsoleStore(gw.store)
    audit_rows = await console.audit_records(operation_id)
    notices = await console.notifications(operation_id)
    records = [
        {
            "stream": r.stream,
            "seq": r.seq,
            "at": r.at,
            "kind": r.kind,
            "record": json.loads(r.record),
        }
        for r in audit_rows
    ]
    provider = gw.policy.provider_named(op.provider)
    rule = provider.rule_named(op.action) if provider is not None else None
    view = (await summaries(gw, [op]))[0]
    public = op.to_public()
    currency = None
    if op.amount is not None and op.currency is None and op.status in UNSETTLED:
        # a refund names no currency: the charge's, as the provider says now, is shown (as on
        # the proposal's page the approver read it)
        currency = await currency_now(gw, provider, rule, op)
    if currency is not None:
        public = {**public, "currency": currency}
        view = {**view, "operation": {**view["operation"], "currency": currency}}
    return {
        "view": view,
        "currency_from_provider": currency is not None,
        "events": events,
        "attempt_lines": explain.attempts(events),
        "tries": explain.lookup_tries(events, LOOKUP_EVENTS),
        "sentence": explain.operation_said(public),
        "provider_name": explain.provider_words(op.provider),
        # what a human decides while it is unsettled; once settled, how it was, and by whom
        "decision": decision(provider, rule, op)
        if op.status in UNSETTLED
        and (op.escalated_at is not None or op.status is Status.DISPATCHED)
        else None,
        "verdict": explain.verdict(op.to_public(), events)
        if op.escalated_at is not None or op.settled_reason == "human_verdict"
        else None,
        "requests": [r for r in records if r["kind"] == "request"],
        "transitions": [r for r in records if r["kind"] == "transition"],
        "notices": notices,
        # notices are queued whatever the settings; with no webhook configured none is ever
        # sent, and "attempts 0, not delivered" would only alarm
        "webhook": gw.settings.escalation_webhook_url is not None,
    }


def decision(provider: Provider | None, rule: Rule | None, op: Operation) -> dict[str, Any]:
    """What a human needs to decide an escalated operation: where to look at the provider and
    what each verdict does."""
    searches = [] if provider is None else explain.searches(provider, rule, op)
    if not searches and provider is not None and rule is not None:
        searches = explain.value_searches(provider, rule, op)
    return {
        "searches": searches,
        "dashboard_url": None if provider is None else explain.dashboard_url(provider, op),
        "looks_up": explain.looks_up(rule),
        "consequences": explain.CONSEQUENCES,
    }


async def pending_proposals(gw: Gateway) -> list[dict[str, Any]]:
    """Proposals waiting for a human, oldest first, each with the exact request an approval
    lets through (the proposal view the agent reads, so the two never differ)."""
    proposals = await gw.store.list_proposals(None, ["pending"], LIST_LIMIT)
    return [
        {
            "view": (view := proposal_view(gw.policy, p, None)),
            "sentence": explain.proposal_said(view["proposal"]),
            "expires_in": (p.expires_at - p.read_at).total_seconds(),
        }
        for p in proposals
    ]


async def withdrawn_proposals(gw: Gateway) -> list[dict[str, Any]]:
    """Proposals their agents withdrew within the last day, newest first: out of the queue,
    shown apart so that an approver who had one open sees where it went."""
    return [
        {
            "view": (view := proposal_view(gw.policy, p, None)),
            "sentence": explain.proposal_said(view["proposal"]),
        }
        for p in await gw.store.withdrawn_proposals(LIST_LIMIT)
    ]


async def proposal(gw: Gateway, proposal_id: str) -> dict[str, Any] | None:
    """One proposal as a human decides it: the sentence, the exact request, what the policy
    checks, the budgets it would use, who may approve, when it expires, and the provider's
    answer to the rule's preconditions now."""
    found = await gw.store.load_proposal(proposal_id)
    if found is None:
        return None
    view = proposal_view(gw.policy, found, None)
    public = view["proposal"]
    provider = gw.policy.provider_named(found.provider)
    rule = provider.rule_named(found.action) if provider is not None else None
    pending = found.state.value == "pending"
    now: list[dict[str, Any]] = []
    currency = found.currency
    if pending and provider is not None and rule is not None:
        now, seen_currency = await preconditions_now(gw, provider, rule, found)
        # a refund names no currency: the charge's, as the provider says now, is shown
        currency = currency or seen_currency
    shown = {**public, "currency": currency}
    return {
        "view": view,
        "p": shown,
        "currency_from_provider": found.currency is None and currency is not None,
        "provider_name": explain.provider_words(found.provider),
        "pending": pending,
        "sentence": explain.proposal_said(shown),
        "request_text": None
        if view.get("request") is None
        else json.dumps(view["request"], indent=2, ensure_ascii=False),
        "checks": []
        if provider is None or rule is None
        else explain.policy_checks(provider, rule, found.amount, currency),
        "budgets": await _budgets_for(gw, found),
        "approvers": _who_may_approve(gw, provider, rule, found),
        "preconditions": now,
        "expires_in": (found.expires_at - found.read_at).total_seconds(),
    }


async def _budgets_for(gw: Gateway, found: Proposal) -> list[dict[str, Any]]:
    """Each budget the proposal would count against: spent, this amount, what would remain."""
    declared = gw.policy.provider_named(found.provider)
    if declared is None or found.currency is None or found.amount is None:
        return []
    keys = budgets_for(
        declared.provider,
        declared.budgets,
        tenant=found.tenant,
        agent_id=found.agent_id,
        currency=found.currency,
    )
    return [_budget_line(s, found.amount) for s in await standings(gw.store, keys)]


def _budget_line(standing: Standing, amount: int) -> dict[str, Any]:
    budget = standing.key.budget
    after = standing.remaining - amount

    def shown(minor_units: int) -> str:
        return human_amount(minor_units, budget.currency, with_minor_units=True)

    whose = standing.key.agent_id or standing.key.tenant or standing.key.provider
    return {
        "text": (
            f"{budget.scope.value} budget of {whose}: {shown(budget.limit)} per {budget.window}, "
            f"{shown(standing.spent)} spent; this uses {shown(amount)}, "
            + (f"{shown(after)} would remain" if after >= 0 else f"over by {shown(-after)}")
        ),
        "over": after < 0,
        "mode": budget.mode.value,
    }


def _who_may_approve(
    gw: Gateway, provider: Provider | None, rule: Rule | None, found: Proposal
) -> str:
    names = [a.name for a in gw.settings.approvers]
    anyone = "the admin" + (f" or an approver ({', '.join(names)})" if names else "")
    if provider is None or rule is None or not provider.four_eyes_for(rule):
        return anyone
    owner = agent_owners(gw.settings).get(found.agent_id)
    bound = found.agent_id + (f" and its owner {owner}" if owner else "")
    return f"{anyone}, but not {bound}: four eyes"


async def preconditions_now(
    gw: Gateway, provider: Provider, rule: Rule, found: Proposal
) -> tuple[list[dict[str, Any]], str | None]:
    """The provider's answer to each of the rule's precondition lookups now, through opgate's
    own lookup client, with its time; a lookup that fails says why and never fails the page.
    Also the currency an answer names (a charge's), for a proposal that names none."""
    if rule.preconditions is None:
        return [], None
    shown = []
    currency = found.currency
    for lookup in rule.preconditions.lookups:
        target = render_lookup(lookup, found)
        if target is None:  # the proposal lacks a value it names: the gate skips it too
            continue
        at = datetime.now(UTC)
        try:
            async with asyncio.timeout(PRECONDITION_READ_SECONDS):
                answer = await fetch(gw, provider, target)
        except TimeoutError:
            answer = Inconclusive(f"no answer within {PRECONDITION_READ_SECONDS:g} s")
        line: dict[str, Any] = {"path": target, "at": at, "error": None, "assertions": []}
        if isinstance(answer, Inconclusive):
            line["error"] = answer.why
        else:
            currency = currency or _currency_of(answer.status, answer.body)
            checked = judge_answer(lookup, target, answer.status, answer.body, found)
            line["assertions"] = [
                {
                    "require": a["require"],
                    "held": a.get("held"),
                    "read": _shown_values(a.get("values", {}), currency),
                }
                for a in checked.evidence.get("assertions", [])
            ]
            line["held"] = isinstance(checked, Held)
            line["failed"] = isinstance(checked, Failed)
            if not line["assertions"]:
                line["error"] = getattr(checked, "why", f"the provider answered {answer.status}")
        shown.append(line)
    return shown, currency


async def currency_now(
    gw: Gateway, provider: Provider | None, rule: Rule | None, subject: LookupSubject
) -> str | None:
    """The currency the rule's precondition lookups find at the provider now (a refund's
    charge's), for an amount that names none; None if none says, or none answers in time."""
    if provider is None or rule is None or rule.preconditions is None:
        return None
    for lookup in rule.preconditions.lookups:
        target = render_lookup(lookup, subject)
        if target is None:
            continue
        try:
            async with asyncio.timeout(PRECONDITION_READ_SECONDS):
                answer = await fetch(gw, provider, target)
        except TimeoutError:
            continue
        if not isinstance(answer, Inconclusive):
            currency = _currency_of(answer.status, answer.body)
            if currency is not None:
                return currency
    return None


def _currency_of(status: int, body: bytes) -> str | None:
    """The ``currency`` an answer's top level names, if it is a currency code."""
    if not 200 <= status < 300:
        return None
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    code = document.get("currency") if isinstance(document, dict) else None
    return code if isinstance(code, str) and exponent(code) is not None else None


def _shown_values(values: dict[str, Any], currency: str | None) -> str:
    """What each pointer read, amounts in the currency's exponent ("/amount = 20.00 USD")."""
    parts = []
    for name, value in values.items():
        is_amount = "amount" in name and isinstance(value, int) and not isinstance(value, bool)
        text = (
            human_amount(value, currency, with_minor_units=True) if is_amount else json.dumps(value)
        )
        parts.append(f"{name} = {text}")
    return ", ".join(parts)


async def dashboard(gw: Gateway, state: ChainState) -> dict[str, Any]:
    """The line atop every page: escalations waiting and the oldest, pending proposals,
    budgets near their limit, the audit chain's state."""
    waiting = await ConsoleStore(gw.store).dashboard()
    near = [
        s
        for s in await budget_standings(gw.store, list(gw.policy.providers))
        if s.spent >= NEAR_LIMIT * s.key.budget.limit
    ]
    return {
        "escalations": waiting.escalations,
        "oldest_escalation_seconds": waiting.oldest_escalation_seconds,
        "pending_proposals": waiting.pending_proposals,
        "budgets_near_limit": [_near_limit(s) for s in near],
        "last_checkpoint_at": waiting.last_checkpoint_at,
        "verification": state,
    }


def _near_limit(standing: Standing) -> str:
    """ "fault tenant t1 6.00 USD (600 minor units) of 7.00 USD (700 minor units)"."""
    budget = standing.key.budget
    spent = human_amount(standing.spent, budget.currency, with_minor_units=True)
    limit = human_amount(budget.limit, budget.currency, with_minor_units=True)
    whose = " ".join(filter(None, (standing.key.provider, budget.scope.value, standing.key.tenant)))
    return f"{whose} {spent} of {limit}"


@dataclass
class ChainState:
    """The last verification this process ran (on demand: it reads the whole log)."""

    verified_at: datetime | None = None
    intact: bool | None = None
    summary: str = ""
    problems: list[str] = field(default_factory=list)


async def run_verification(gw: Gateway, state: ChainState) -> None:
    key = audit_key(gw.credentials)
    report = await gw.store.run(
        lambda conn: verify(
            conn,
            datetime(1970, 1, 1, tzinfo=UTC),
            datetime(9999, 1, 1, tzinfo=UTC),
            key=key,
            whole_log=True,
        )
    )
    first = report.first_break()
    state.verified_at = datetime.now(UTC)
    state.intact = first is None
    signed = (
        "signatures verified"
        if report.checkpoints_authenticated
        else "signatures NOT verified (no audit key)"
    )
    state.summary = f"{report.records} records, {report.checkpoints} seals ({signed})"
    state.problems = [p.describe() for p in report.breaks[:50]]


async def chain(gw: Gateway, state: ChainState) -> dict[str, Any]:
    checkpoint = await ConsoleStore(gw.store).last_checkpoint()
    unaccounted, _ = await gw.store.run(unaccounted_runs)  # instances that ended unclean
    observability = gw.observability
    writer = observability.writer if observability is not None else None
    return {
        "checkpoint": None
        if checkpoint is None
        else {**checkpoint, "mac": checkpoint["mac"].hex()},
        "writer": None
        if writer is None
        else {
            "pending": writer.pending,
            "oldest_pending_seconds": writer.oldest_pending_seconds,
            "dropped": writer.dropped,
            "stalled": writer.stalled,
        },
        "verification": state,
        "unaccounted": unaccounted,
    }
