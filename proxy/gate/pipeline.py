"""One agent request, top to bottom:

identify -> load the row (primary) -> decide (pure checks) -> prepare -> preconditions ->
claim -> forward -> classify -> record -> audit -> answer, with exactly one audit record:
emitted before a byte of the answer is written, or in a ``finally`` on every other way out.
A first send that is exactly what was approved is claimed by the statement that loads its row
(proxy/gate/exact.py); the checks and the preparation then run on the claimed row, and a
refusal there withdraws the claim before anything leaves.

Nothing leaves before the claim has committed. Once the claim has committed, the row only
becomes confirmed or failed from the provider's answer; every other ending leaves it dispatched.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.errors import (
    StoreUnavailable,
    UpstreamError,
    UpstreamNotSent,
    UpstreamTimeout,
    UpstreamTruncated,
)
from proxy.gate import upstream
from proxy.gate.bodies import BodyRejected, ParsedBody, inject, with_value
from proxy.gate.budgets import budget_claim, budget_sum
from proxy.gate.checks import (
    RequestFacts,
    concealed,
    decide,
    decide_by_state,
    first_payload_refusal,
    same_currency,
)
from proxy.gate.classify import Settled, Unknown, classify_answer
from proxy.gate.credentials import provider_credential, provider_credential_now
from proxy.gate.cutoff import CutOffClaim, claim_owner
from proxy.gate.decision import ClaimKind, Deny, Forward, Replay
from proxy.gate.dialects import in_dialect
from proxy.gate.exact import as_sent
from proxy.gate.forwarded import FORWARDED
from proxy.gate.gateway import GATEWAY, Gateway
from proxy.gate.headers import outbound_headers, response_headers
from proxy.gate.intake import (
    Target,
    identify,
    identify_request,
    load_operation,
    parse_request_body,
    read_body,
    refuse_before_reading,
    request_facts,
    with_body_key,
)
from proxy.gate.limits import Slot
from proxy.gate.preconditions import (
    Failed,
    check_preconditions,
    recheck_due,
    recheck_due_on_first_send,
    refusal,
)
from proxy.gate.problem import problem_response
from proxy.gate.reasons import Reason
from proxy.gate.resend import ask_before_resend
from proxy.gate.token_exchange import answer_token_request, token_request_provider
from proxy.gate.upstream import OutboundRequest, UpstreamResponse
from proxy.observe.audit import (
    AuditRecord,
    Decision,
    Undelivered,
    emit,
    emit_undelivered,
    request_path,
)
from proxy.policy.model import Mode
from proxy.policy.set import PolicySet
from proxy.settings import Settings
from proxy.store.operation import LastOutcome, Operation, Status
from proxy.store.store import ProviderAnswer

_log = structlog.get_logger("opgate.pipeline")
# An escalated operation is still looked up at the provider now and then (queries.sql
# escalate_operation). One whose claim was withdrawn before anything left has nothing there
# to find: an hour apart is enough.
_UNCHECKED_LOOK_AGAIN_SECONDS = 3600.0


async def handle_agent_request(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    policy = gateway.policy  # this request is decided by the set it started with
    forwarded = request.get(FORWARDED)  # forward-proxy mode: which listener, which origin
    record = AuditRecord(
        source=request.remote,
        method=request.method,
        # as sent: decoded, a path can hold what no log or database should (a NUL)
        path=request_path(forwarded.raw_path if forwarded is not None else request.raw_path),
        policy_version=policy.version,
    )
    if forwarded is not None:
        record.listener, record.destination = "forward", forwarded.origin.authority
    emitted = False
    try:
        response = await _process(gateway, policy, request, record)
        provider = policy.provider_named(record.provider) if record.provider else None
        if provider is not None:  # opgate's refusals in the provider's dialect (errors:)
            response = in_dialect(response, provider.errors)
        record.response_status = response.status
        # 9. audit, before a byte of the answer is written: numbered and queued, the record is
        # on its way to the audit log however long the agent takes to read (or a crash comes
        # meanwhile). It says what opgate answered; an answer that then does not reach the
        # agent in full gets a record of its own (audit.emit_undelivered), never a change.
        emitted = True
        emit(record)
        await _write_answer(request, response, record, gateway.settings)
        return response
    finally:
        if not emitted:  # every other way out: still exactly one record
            emit(record)


async def _write_answer(
    request: web.Request, response: web.StreamResponse, record: AuditRecord, settings: Settings
) -> None:
    """The answer, written within ``answer_write_timeout_seconds`` (aiohttp has no write
    timeout: ``write_eof`` waits for the socket to drain, for ever if the agent never reads).
    Written here rather than by aiohttp once the handler returns, so that the deadline holds;
    a connection that is not taken in time is aborted."""
    try:
        async with asyncio.timeout(settings.answer_write_timeout_seconds):
            await response.prepare(request)
            await response.write_eof()
    except TimeoutError:
        emit_undelivered(record, Undelivered.WRITE_TIMEOUT)
        _log.warning(
            "answer_write_timeout",
            request_id=record.request_id,
            operation_id=record.operation_id,
            seconds=settings.answer_write_timeout_seconds,
        )
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:  # the agent went while its answer was written: aiohttp's too
        emit_undelivered(record, Undelivered.AGENT_DISCONNECTED)


@dataclass(frozen=True)
class ComposedRequest:
    """A request opgate composed itself from an approved row (MCP's ``execute_operation``).
    It enters at stage 1 like one that arrived over HTTP: identified by the same rules, its
    body parsed by the same parser, decided, claimed and forwarded by the same stages."""

    method: str
    raw_target: str  # the path and query, as an agent would have sent them
    headers: CIMultiDictProxy[str]  # the agent's token among them, as an agent sends it
    body: bytes


async def handle_composed_request(
    gateway: Gateway, composed: ComposedRequest, *, listener: str, source: str | None
) -> web.StreamResponse:
    """``composed`` through the pipeline, with its one audit record naming ``listener``.
    Refusals stay opgate's problem+json: the caller is opgate's own front end, not a provider's
    SDK, so no provider dialect applies."""
    policy = gateway.policy
    record = AuditRecord(
        source=source,
        method=composed.method,
        path=request_path(composed.raw_target),
        policy_version=policy.version,
        listener=listener,
    )
    try:
        response = await _process(gateway, policy, composed, record)
        record.response_status = response.status
        return response
    finally:
        emit(record)


async def _process(
    gw: Gateway, policy: PolicySet, incoming: web.Request | ComposedRequest, record: AuditRecord
) -> web.StreamResponse:
    # 1. identify the agent and the operation; read and parse the body strictly. Only `policy`
    # (the set captured at the start) is used: a reload mid-request must not mix two sets.
    if not isinstance(incoming, ComposedRequest) and incoming.get(FORWARDED) is None:
        token_provider = token_request_provider(policy, incoming.method, incoming.raw_path)
        if token_provider is not None:  # the SDK's own token request, answered here
            return await answer_token_request(gw, token_provider, incoming, record)
    if isinstance(incoming, ComposedRequest):
        target = identify_request(
            policy, gw.agents, incoming.method, incoming.raw_target, incoming.headers
        )
    else:
        target = identify(policy, gw.agents, incoming)
    if isinstance(target, Deny):
        return _reject(record, target)
    record.agent_id, record.tenant = target.agent.agent_id, target.agent.tenant
    record.provider, record.rule = target.provider.provider, target.rule.name
    # Requests in flight and request rates (per agent, per tenant) are capped before the body
    # is read or the database is touched, so that no agent can hold the pool (or a slow
    # body's connection) against others, nor flood the provider (proxy/gate/limits.py).
    slot = gw.in_flight.admit(target.agent, target.provider, gw.settings)
    if isinstance(slot, Deny):
        return _reject(record, slot)
    try:
        return await _process_admitted(gw, target, incoming, record, slot)
    finally:
        slot.release()  # a no-op while a forwarded request's outcome is still being recorded


async def _process_admitted(
    gw: Gateway,
    target: Target,
    incoming: web.Request | ComposedRequest,
    record: AuditRecord,
    slot: Slot,
) -> web.StreamResponse:
    if isinstance(incoming, ComposedRequest):  # what read_body refuses, refused alike
        unreadable = refuse_before_reading(target, len(incoming.body))
        body = unreadable or parse_request_body(target, incoming.body)
    else:
        body = await read_body(incoming, target, gw.settings.body_read_timeout_seconds)
    if isinstance(body, Deny):
        response = _reject(record, body)
        if body.reason is Reason.BODY_TIMEOUT:
            response.force_close()  # the rest of a late body is not waited for either
        return response
    keyed = with_body_key(target, body)  # a key the provider reads in the body names it too
    if isinstance(keyed, Deny):
        return _reject(record, keyed)
    target = keyed
    facts = request_facts(target, body)

    # 2. load the authoritative row from the primary; a first send that is exactly what was
    # approved is claimed by the same statement (proxy/gate/exact.py)
    try:
        op, claimed_as_sent, had = await _load(gw, target, facts)
    except StoreUnavailable as exc:
        return _store_unavailable(record, exc)
    if op is not None and claimed_as_sent and had is not None:
        record.operation_id, record.status_before = op.operation_id, Status.CREATED.value
        return await _forward_claimed(gw, target, facts, body, op, had, record, slot)
    if op is not None:
        record.operation_id, record.status_before = op.operation_id, op.status.value

    # 3. decide: ordered pure checks
    lookup_failed = target.named_operation_id is not None
    decision = decide(facts, op, operation_lookup_failed=lookup_failed)
    if not isinstance(decision, Deny) and decision.would_deny is not None:  # shadow mode
        record.would_deny = decision.would_deny.reason.value
    if isinstance(decision, Deny):
        told = concealed(facts, decision, operation_lookup_failed=lookup_failed)
        if told is None and op is not None and _escalation_due(decision, op):
            try:
                op = await _escalate_after_switch(gw, op, decision)
            except StoreUnavailable as exc:
                return _store_unavailable(record, exc)
            record.status_after = op.status.value
        return _reject(record, decision, op, told)
    if isinstance(decision, Replay):
        assert op is not None
        return _replay(record, op)

    # 4. prepare what will leave (pure: it must not fail after the claim), then claim
    provider = target.provider
    base = gw.upstream_base(provider.provider, provider.upstream)
    if had is not None:  # had already, for the claim as sent
        credential: dict[str, str] | Deny = had
    else:
        credential = await provider_credential(gw.credentials, gw.client, provider, base)
    if isinstance(credential, Deny):
        return _reject(record, credential, op)
    outbound = _prepare(gw, target, body, op, credential)
    if isinstance(outbound, Deny):
        return _reject(record, outbound, op)
    if decision.claim is not ClaimKind.NONE:
        assert op is not None
        # 4b. preconditions: ask the provider whether what the approval assumed still holds
        # (a lookup, before and outside the claim, which then needs the row unchanged since)
        try:
            refused = await _check_preconditions(gw, target, op, record)
        except StoreUnavailable as exc:
            return _store_unavailable(record, exc)
        if refused is not None:
            return refused
        unchanged_since = op.updated_at if record.precondition is not None else None
        try:
            claimed = await _claim(gw, target, op, decision, record, unchanged_since)
        except StoreUnavailable as exc:
            return _store_unavailable(record, exc)
        if isinstance(claimed, ClaimConflict):
            return _answer_claim_conflict(record, claimed)
        op = claimed
        record.status_after, record.attempt = op.status.value, op.attempts
    return await _forward(gw, target, outbound, op, record, slot)


async def _load(
    gw: Gateway, target: Target, facts: RequestFacts
) -> tuple[Operation | None, bool, dict[str, str] | None]:
    """The row the request names, read from the primary; whether the same statement claimed
    it as sent; and the provider's credential if it was had for that (else None), which the
    ordinary way then uses too. A credential is had before any claim. Only one that needs no
    IO is had here (a configured secret, an OAuth2 access token cached and fresh): a request
    that then claims nothing must not have made a token endpoint call, and one whose
    credential cannot be had goes the ordinary way, so that it is told what it would be told."""
    exact = as_sent(facts)
    if exact is None:
        return await load_operation(gw.store, target), False, None
    provider = target.provider
    base = gw.upstream_base(provider.provider, provider.upstream)
    credential = provider_credential_now(gw.credentials, provider, base)
    if credential is None:
        return await load_operation(gw.store, target), False, None
    owner = claim_owner(gw.settings.instance_id)
    try:
        op, claimed = await gw.store.claim_as_sent(
            target.named_operation_id,
            exact,
            owner=owner,
            lease_seconds=_lease_seconds(gw, target),
            actor=gw.settings.instance_id,
        )
    except StoreUnavailable:  # it may have claimed a created row: its first attempt
        named = target.named_operation_id
        cut = CutOffClaim(named, provider.provider, target.idempotency_key, 1, owner)
        _remember_cut_off(gw, cut)
        raise
    return op, claimed, credential


async def _forward_claimed(
    gw: Gateway,
    target: Target,
    facts: RequestFacts,
    body: ParsedBody,
    op: Operation,
    credential: dict[str, str],
    record: AuditRecord,
    slot: Slot,
) -> web.StreamResponse:
    """A row claimed as sent: the checks run on it all the same, and if they or the outbound
    request's preparation refuse it, the claim is withdrawn as never sent before anything
    leaves (a later attempt may send it). A row whose preconditions were due for a recheck is
    withdrawn and escalated: a later attempt would send it unchecked."""
    record.status_after, record.attempt = op.status.value, op.attempts
    refused = first_payload_refusal(facts, op)
    recheck = recheck_due_on_first_send(target.rule, op)
    if refused is not None:  # the claim's WHERE admitted what the checks refuse: a bug
        _log.error("claimed as sent, refused by the checks", reason=refused.reason.value)
        outbound: OutboundRequest | Deny = refused
    elif recheck is not None:  # the WHERE admitted a row due for its lookup: a bug too
        _log.error("claimed as sent, due for a recheck", trigger=recheck)
        outbound = Deny(
            Reason.PRECONDITION_UNVERIFIABLE,
            f"the preconditions were not checked ({recheck}): nothing was sent, and the "
            "operation is escalated to a human",
        )
    else:
        outbound = _prepare(gw, target, body, op, credential)
    if isinstance(outbound, Deny):
        try:
            if recheck is not None:  # first: released unescalated, it could be sent unchecked
                await _escalate_unchecked(gw, op, recheck)
            status = await gw.store.release_unknown(
                op.operation_id, op.attempts, LastOutcome.NOT_SENT.value, None,
                gw.settings.instance_id,
            )  # fmt: skip
        except StoreUnavailable:
            status = None  # its lease expires: unknown, as for any claim whose end is unrecorded
        record.status_after = (status or op.status).value
        lookup_failed = target.named_operation_id is not None
        told = concealed(facts, outbound, operation_lookup_failed=lookup_failed)
        return _reject(record, outbound, op, told)
    return await _forward(gw, target, outbound, op, record, slot)


def _escalation_due(decision: Deny, op: Operation) -> bool:
    """The checks refuse it as escalated, and it is not yet: a row in doubt after a timeline
    switch that no lookup can clear (checks.unverifiable_after_switch). It is escalated now,
    so that a human sees it before anyone sends it."""
    return decision.reason is Reason.OPERATION_ESCALATED and op.escalated_at is None


async def _escalate_after_switch(gw: Gateway, op: Operation, decision: Deny) -> Operation:
    """The row as escalated (or as another request escalated it meanwhile)."""
    escalated = await gw.store.escalate(
        op.operation_id,
        None,
        decision.detail,
        {"timeline_switch_seen_at": op.lookup_before_send.isoformat()}
        if op.lookup_before_send is not None
        else {},
        look_again_seconds=_UNCHECKED_LOOK_AGAIN_SECONDS,
        actor=gw.settings.instance_id,
    )
    return escalated or await gw.store.load(op.operation_id) or op


async def _escalate_unchecked(gw: Gateway, op: Operation, trigger: str) -> None:
    """A claim withdrawn before its preconditions' lookup leaves the row dispatched, where it
    is never rechecked: a human decides whether it may still be sent."""
    await gw.store.escalate(
        op.operation_id,
        None,
        "claimed as sent while its preconditions were due for a recheck; nothing was sent",
        {"trigger": trigger, "attempt": op.attempts},
        look_again_seconds=_UNCHECKED_LOOK_AGAIN_SECONDS,
        actor=gw.settings.instance_id,
    )


async def _forward(
    gw: Gateway,
    target: Target,
    outbound: OutboundRequest,
    op: Operation | None,
    record: AuditRecord,
    slot: Slot,
) -> web.StreamResponse:
    # 5-8. forward, classify, record; shielded so that an agent hanging up cannot stop the
    # outcome of a request that has already left from being recorded (nor free its slot)
    record.decision = Decision.ALLOW
    record.forwarded_body_sha256 = hashlib.sha256(outbound.body).hexdigest()
    forwarding = _forward_and_record(gw, target, outbound, op, record)
    return await asyncio.shield(slot.held_through(forwarding))


async def _forward_and_record(
    gw: Gateway,
    target: Target,
    outbound: OutboundRequest,
    op: Operation | None,
    record: AuditRecord,
) -> web.StreamResponse:
    # 6. forward
    try:
        client = gw.egress_client(target.forwarded)  # forward mode: addresses are re-checked
        answer: UpstreamResponse | UpstreamError = await upstream.send(client, outbound)
    except UpstreamError as exc:
        answer = exc
    if op is None:  # a read without an operation: nothing to record
        return _pass_through(record, answer, None, None)

    # 7. classify the provider's answer
    if isinstance(answer, UpstreamError):
        outcome: Settled | Unknown = Unknown(_unknown_outcome(answer))
    else:
        record.provider_status = answer.status
        classification = target.provider.classification_for(target.rule)
        outcome = classify_answer(classification, answer.status, answer.body)

    # 8. record the outcome
    actor = gw.settings.instance_id
    try:
        if isinstance(outcome, Settled):
            assert isinstance(answer, UpstreamResponse)
            stored = ProviderAnswer(
                answer.status, outcome.object_id, answer.headers.get("Content-Type"), answer.body
            )
            recorded = await gw.store.settle(op.operation_id, outcome.status, stored, actor)
        else:
            status = None if isinstance(answer, UpstreamError) else answer.status
            recorded = await gw.store.release_unknown(
                op.operation_id, op.attempts, outcome.outcome.value, status, actor
            )
    except StoreUnavailable:
        # The provider has answered but the row could not be updated: it stays dispatched with
        # a lease that will expire, i.e. unknown, which is true from the row's point of view.
        recorded = None
    status_now = recorded or op.status
    record.status_after = status_now.value
    if isinstance(outcome, Unknown):
        record.decision, record.reason = Decision.ERROR, outcome.outcome.value
    return _pass_through(record, answer, op.operation_id, status_now)


def _prepare(
    gw: Gateway,
    target: Target,
    body: ParsedBody,
    op: Operation | None,
    credential: dict[str, str],
) -> OutboundRequest | Deny:
    provider = target.provider
    injected = dict(credential)
    if body.media_type is not None:
        injected["Content-Type"] = body.media_type
    if op is not None:
        injected["X-Operation-Id"] = op.operation_id
        key_header = provider.key_header(target.rule)
        if key_header is not None:
            injected[key_header] = op.idempotency_key
        key_field = provider.key_field(target.rule)
        if key_field is not None:  # the approved key leaves where the provider reads it
            try:
                body = inject(body, key_field, op.idempotency_key)
            except BodyRejected as exc:
                return Deny(Reason.INJECTION_CONFLICT, str(exc))
        currency = target.rule.currency
        if currency and same_currency(body.fields().get(currency), op.currency):
            assert op.currency is not None
            # the approved spelling leaves, in the provider's case
            body = with_value(body, currency, provider.currency_spelling(op.currency))
        field = provider.metadata_field(target.rule)
        if field is not None:
            try:
                body = inject(body, field, op.operation_id)
            except BodyRejected as exc:
                return Deny(Reason.INJECTION_CONFLICT, str(exc))
    url = gw.upstream_base(provider.provider, provider.upstream) + target.path
    if target.query:
        url += "?" + target.query
    return OutboundRequest(
        method=target.rule.method,
        url=url,
        headers=outbound_headers(target.headers, provider.forward_headers, injected),
        body=body.serialise(),
        connect_timeout=provider.timeouts.connect_seconds,
        total_timeout=provider.timeouts.total_seconds,
        max_response_bytes=provider.limits.max_response_body_bytes,
    )


@dataclass(frozen=True)
class ClaimConflict:
    """The claim found the row changed: what it is now, and what that means for this request."""

    outcome: Deny | Replay
    current: Operation


async def _check_preconditions(
    gw: Gateway, target: Target, op: Operation, record: AuditRecord
) -> web.Response | None:
    """The rule's preconditions, when a recheck is due (proxy/gate/preconditions.py): None to
    go on to the claim, else the refusal. In report mode a refusal is only ``would_deny``."""
    trigger = recheck_due(target.rule, op)
    if trigger is None:
        return None
    checked = await check_preconditions(gw, target.provider, target.rule, op, trigger)
    record.precondition = checked.evidence
    deny = refusal(checked)
    if deny is None:
        return None
    if target.provider.mode_for(target.rule) is Mode.REPORT:
        record.would_deny = record.would_deny or deny.reason.value
        return None
    if isinstance(checked, Failed):
        await gw.store.record_precondition_failed(
            op.operation_id, gw.settings.instance_id, checked.evidence
        )
    return _reject(record, deny, op, extra={"precondition": checked.evidence})


async def _claim(
    gw: Gateway,
    target: Target,
    op: Operation,
    decision: Forward,
    record: AuditRecord,
    unchanged_since: datetime | None = None,
) -> Operation | ClaimConflict:
    """The conditional UPDATE (a re-send after an unknown outcome asks the provider first),
    under the locks of the spend budgets it counts against; on zero rows, re-read the row and
    say why."""
    provider = target.provider
    budgets = budget_claim(provider, target.rule, op)
    if isinstance(budgets, Deny):
        return ClaimConflict(budgets, op)
    lookup_owner = None
    if decision.claim is ClaimKind.RESEND_AFTER_LOOKUP and target.rule.reconcile is not None:
        asked = await ask_before_resend(gw, provider, target.rule.reconcile, op, unchanged_since)
        if isinstance(asked, Operation):  # the provider has the effect: settled, replayed
            return ClaimConflict(Replay(), asked)
        if isinstance(asked, Deny):
            return ClaimConflict(asked, op)
        lookup_owner = asked.lookup_owner
        if lookup_owner is not None and unchanged_since is not None:
            # the lease was taken on the row unchanged since the preconditions' lookup; the
            # claim needs it unchanged since the lease (whose own write moved updated_at)
            unchanged_since = asked.leased_at
    owner, lease = claim_owner(gw.settings.instance_id), _lease_seconds(gw, target)
    actor = gw.settings.instance_id
    dedup_window = provider.idempotency.dedup_window_seconds
    try:
        if budgets is None:  # the single unlocked statement
            claimed = await gw.store.claim(
                op.operation_id,
                owner=owner,
                lease_seconds=lease,
                expected_attempts=op.attempts,
                dedup_window_seconds=dedup_window,
                after_lookup_by=lookup_owner,
                unchanged_since=unchanged_since,
                actor=actor,
            )
        else:
            made = await gw.store.claim_within_budgets(
                op.operation_id,
                [budget_sum(key) for key in budgets.keys],
                budgets.admits,
                owner=owner,
                lease_seconds=lease,
                expected_attempts=op.attempts,
                dedup_window_seconds=dedup_window,
                after_lookup_by=lookup_owner,
                unchanged_since=unchanged_since,
                actor=actor,
            )
    except StoreUnavailable:  # it may have committed: the attempt after op.attempts
        cut = CutOffClaim(op.operation_id, op.provider, op.idempotency_key, op.attempts + 1, owner)
        _remember_cut_off(gw, cut)
        raise
    if budgets is not None:
        refusal, would_deny = budgets.judge(made.spent)
        if refusal is not None:
            if lookup_owner is not None:
                await gw.store.release_reconcile(op.operation_id, lookup_owner)
            return ClaimConflict(refusal, op)
        if would_deny is not None and record.would_deny is None:  # shadow mode
            record.would_deny = would_deny.reason.value
        claimed = made.operation
    if claimed is not None:
        return claimed
    if lookup_owner is not None:
        await gw.store.release_reconcile(op.operation_id, lookup_owner)
    # Operations are never deleted, so the row is there; fall back on the old one regardless.
    current = await gw.store.load(op.operation_id) or op
    explained = decide_by_state(target.provider, current)
    if isinstance(explained, Forward):
        # It was claimable a moment ago and is again: another attempt won and already ended.
        explained = Deny(Reason.OPERATION_IN_FLIGHT, "another attempt claimed it first", 1)
    return ClaimConflict(explained, current)


def _remember_cut_off(gw: Gateway, claim: CutOffClaim) -> None:
    """A claim cut off before anything left: released as not_sent once the store answers
    (proxy/gate/cutoff.py), so that the operation can be sent, not burned by reconciliation."""

    async def release(cut: CutOffClaim) -> bool:
        operation_id = cut.operation_id
        if operation_id is None:  # a claim as sent named by its key
            if cut.idempotency_key is None:
                return False
            row = await gw.store.load_by_key(cut.provider, cut.idempotency_key)
            if row is None:
                return False
            operation_id = row.operation_id
        released = await gw.store.release_unknown(
            operation_id,
            cut.attempt,
            LastOutcome.NOT_SENT.value,
            None,
            gw.settings.instance_id,
            owner=cut.owner,
        )
        return released is not None

    gw.cut_off.remember(claim, release)


def _lease_seconds(gw: Gateway, target: Target) -> float:
    """How long a claim's lease lasts: the provider's whole timeout, and a margin."""
    return target.provider.timeouts.total_seconds + gw.settings.lease_margin_seconds


def _answer_claim_conflict(record: AuditRecord, conflict: ClaimConflict) -> web.StreamResponse:
    """Answer from the row as it is now: a replay must carry the answer that won the race."""
    if isinstance(conflict.outcome, Replay):
        return _replay(record, conflict.current)
    return _reject(record, conflict.outcome, conflict.current)


def _reject(
    record: AuditRecord,
    deny: Deny,
    op: Operation | None = None,
    told: Deny | None = None,
    extra: dict[str, Any] | None = None,
) -> web.Response:
    """Refuse with ``deny``, or answer ``told`` instead (checks.concealed): the audit record
    keeps the real reason and operation, the agent learns neither, nor the operation's status."""
    record.decision, record.reason = Decision.DENY, deny.reason.value
    if told is not None:  # nothing of the real refusal is told, its evidence neither
        deny, op, extra = told, None, None
    extra = {**(deny.extra or {}), **(extra or {})} or None
    if op is not None and deny.reason is Reason.OPERATION_FAILED and op.provider_status:
        extra = {"provider_response": op.to_public()["provider_response"]}
    return problem_response(
        deny.reason,
        deny.detail,
        operation_id=op.operation_id if op else None,
        operation_status=op.status.value if op else None,
        retry_after=deny.retry_after_seconds,
        extra=extra,
    )


def _replay(record: AuditRecord, op: Operation) -> web.Response:
    record.decision, record.status_after = Decision.REPLAY, op.status.value
    response = web.Response(
        status=op.provider_status or 200,
        body=op.response_body or b"",
        headers={
            "X-Operation-Id": op.operation_id,
            "X-Operation-Status": op.status.value,
            "Idempotent-Replayed": "true",
        },
    )
    if op.response_content_type:
        response.headers["Content-Type"] = op.response_content_type
    return response


def _store_unavailable(record: AuditRecord, exc: StoreUnavailable) -> web.Response:
    record.decision, record.reason = Decision.ERROR, Reason.STORE_UNAVAILABLE.value
    return problem_response(Reason.STORE_UNAVAILABLE, f"nothing was sent: {exc}")


def _unknown_outcome(error: UpstreamError) -> LastOutcome:
    if isinstance(error, UpstreamNotSent):
        return LastOutcome.NOT_SENT
    if isinstance(error, UpstreamTimeout):
        return LastOutcome.UNKNOWN_TIMEOUT
    if isinstance(error, UpstreamTruncated):
        return LastOutcome.UNKNOWN_TRUNCATED
    return LastOutcome.UNKNOWN_DROPPED


def _pass_through(
    record: AuditRecord,
    answer: UpstreamResponse | UpstreamError,
    op_id: str | None,
    status: Status | None,
) -> web.Response:
    """The agent's answer once something was (or may have been) sent: for an operation, its
    id and its status now."""
    op_status = status.value if status else None
    if isinstance(answer, UpstreamError):
        record.decision = Decision.ERROR
        if isinstance(answer, UpstreamNotSent):
            record.reason = record.reason or LastOutcome.NOT_SENT.value
            return problem_response(
                Reason.UPSTREAM_UNAVAILABLE,
                f"nothing was sent: {answer}",
                operation_id=op_id,
                operation_status=op_status,
            )
        return problem_response(
            Reason.OUTCOME_UNKNOWN,
            str(answer),
            status=504 if isinstance(answer, UpstreamTimeout) else 502,
            operation_id=op_id,
            operation_status=op_status,
        )
    if op_id is not None and record.decision == Decision.ERROR:
        # The provider answered, but not in a way that settles the operation (e.g. a 5xx).
        return problem_response(
            Reason.OUTCOME_UNKNOWN,
            f"the provider answered {answer.status}",
            operation_id=op_id,
            operation_status=op_status,
            extra={"provider_status": answer.status},
        )
    headers = response_headers(answer.headers)
    if op_id is not None and op_status is not None:
        headers["X-Operation-Id"] = op_id
        headers["X-Operation-Status"] = op_status
    return web.Response(
        status=answer.status, reason=answer.reason, headers=headers, body=answer.body
    )
