"""One agent request, top to bottom (``_outcome``):

identify -> load the row (primary) -> decide (pure checks) -> prepare -> preconditions ->
claim -> forward -> classify -> record -> audit -> answer.

Each stage ends in a value: the request's ``RequestOutcome`` (the decision and its reason, the
row before and after, the provider's answer, the precondition evidence). From that value alone
``answer`` makes the agent's answer and ``audited`` the audit record: exactly one record,
emitted before a byte of the answer is written, or when the handler's block ends on every
other way out (from the outcome known so far, ``Progress``); one object owns that record's
life for every entry point (observe/record_life.py). The record of a request that claimed its
operation is handed to the statement that records the outcome (stage 7, migration 0022), so it
commits with it; only if that statement fails is it emitted to the batch writer, as every
other record is.
A store that fails before anything was sent is answered in one place, as "nothing was sent".

Nothing leaves before the claim has committed. Once the claim has committed, the row only
becomes confirmed or failed from the provider's answer; every other ending leaves it dispatched.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.errors import (
    StoreUnavailable,
    UpstreamError,
    UpstreamNotSent,
    UpstreamTimeout,
    UpstreamTruncated,
)
from proxy.gate import upstream, x402_pay
from proxy.gate.bodies import BodyRejected, ParsedBody, inject, with_value
from proxy.gate.budgets import budget_claim, budget_sum
from proxy.gate.checks import (
    concealed,
    decide,
    decide_by_state,
    same_currency,
)
from proxy.gate.classify import Classified, Settled, Unknown, classify_answer
from proxy.gate.credentials import provider_credential
from proxy.gate.cutoff import CutOffClaim, claim_owner
from proxy.gate.decision import ClaimKind, Deny, Forward, Replay
from proxy.gate.dialects import in_dialect
from proxy.gate.forwarded import FORWARDED
from proxy.gate.headers import credential_forms, outbound_headers, response_headers
from proxy.gate.intake import (
    Target,
    identify,
    identify_request,
    load_operation,
    parse_request_body,
    query_sha256,
    read_body,
    refuse_before_reading,
    request_facts,
    with_body_key,
)
from proxy.gate.limits import Slot
from proxy.gate.preconditions import (
    Checked,
    Failed,
    check_preconditions,
    precondition_refusal,
    recheck_due,
)
from proxy.gate.problem import problem_response
from proxy.gate.reasons import Reason
from proxy.gate.resend import ask_before_resend
from proxy.gate.signatures import signed_headers
from proxy.gate.token_exchange import answer_token_request, token_request_provider
from proxy.gate.transitions import ClaimRule, commit_guard, stale_reason, transition
from proxy.gate.upstream import OutboundRequest, UpstreamResponse
from proxy.observe.audit import (
    AuditRecord,
    Decision,
    Sealed,
    Undelivered,
    emit_undelivered,
    request_path,
)
from proxy.observe.record_life import RecordLife
from proxy.policy.model import DEFAULT_RESPONSE_HEADERS, Mode, Provider
from proxy.policy.set import PolicySet
from proxy.runtime import GATEWAY, Gateway
from proxy.settings import Settings
from proxy.store.operation import LastOutcome, Operation, Status
from proxy.store.store import Claim, ProviderAnswer

_log = structlog.get_logger("opgate.pipeline")
# An operation escalated here (in doubt after a timeline switch, which no lookup can clear) is
# still looked up at the provider now and then (queries.sql escalate_operation): hourly.
_ESCALATED_LOOK_AGAIN_SECONDS = 3600.0


@dataclass(frozen=True)
class RequestOutcome:
    """What one request came to, as far as it went. The agent's answer (``answer``) and the
    audit record (``audited``) are both made from this value, and from nothing else."""

    target: Target | None = None  # who asks for what (None: refused before that was known)
    before: Operation | None = None  # the row as loaded from the primary
    decision: str = Decision.DENY  # deny until proven otherwise (observe.audit.Decision)
    refusal: Deny | None = None  # why it was refused: the truth, kept by the audit record
    shown: Deny | None = None  # the refusal the agent is shown instead (checks.concealed)
    row: Operation | None = None  # the row the answer names, when not ``before``
    status_after: Status | None = None  # the row's status as this request left or replayed it
    attempt: int | None = None  # the attempt this request claimed
    would_deny: str | None = None  # shadow mode: the code an enforcing rule would refuse with
    evidence: dict[str, Any] | None = None  # the precondition lookups and what they read
    payment: dict[str, Any] | None = None  # the x402 payment sent for it (x402_pay.Paid)
    sent_sha256: str | None = None  # the bytes that left for the provider, hashed
    provider_answer: UpstreamResponse | UpstreamError | None = None
    provider_status: int | None = None  # the provider's status (an operation's, a read's)
    unsettled: LastOutcome | None = None  # forwarded, and not settled by the answer: why
    store_error: str | None = None  # the store failed before anything was sent
    close_connection: bool = False  # the rest of a late body is not waited for
    # the provider's answer headers dropped for carrying the injected credential (headers.py)
    credential_echoes: tuple[str, ...] = ()

    def updated(self, **changes: Any) -> RequestOutcome:
        """This outcome with ``changes``: ``dataclasses.replace`` without its per-field
        introspection and ``__init__``, which cost as much as building the audit record
        (47 us against 9 us for this copy, on the shared bench machine)."""
        if not changes.keys() <= _OUTCOME_FIELDS:
            raise TypeError(f"not outcome fields: {sorted(changes.keys() - _OUTCOME_FIELDS)}")
        outcome = object.__new__(RequestOutcome)
        outcome.__dict__.update(self.__dict__)
        outcome.__dict__.update(changes)
        return outcome


_OUTCOME_FIELDS = frozenset(field.name for field in fields(RequestOutcome))
_NOTHING_KNOWN = RequestOutcome()  # where every request's outcome starts


class Progress:
    """The outcome known so far: each stage replaces it with a fuller value. A request that
    ends by an exception (an agent that hangs up cancels its handler) is audited from it: the
    request's record (begun at intake) lives in ``life``, which sends it exactly once, from
    the outcome known when the request ends unless a stage sent it before. Also how the
    handler answers an outcome (``respond``: the record names the answer's status), and the
    answer the record handed to the outcome's statement names (``handed``)."""

    def __init__(
        self, record: AuditRecord, respond: Callable[[RequestOutcome], web.StreamResponse]
    ) -> None:
        self.known = _NOTHING_KNOWN
        self.life = RecordLife(record, last=lambda r: audited(r, self.known))
        self.respond = respond
        self.handed: Handed | None = None

    def answer(self, outcome: RequestOutcome) -> web.StreamResponse:
        """The answer to ``outcome``: the one its stored record names, if it was made."""
        handed = self.handed
        if handed is not None and handed.outcome is outcome:
            return handed.answer
        return self.respond(outcome)

    def answered(self, outcome: RequestOutcome, response: web.StreamResponse) -> None:
        """The record of ``outcome`` answered by ``response`` sent, unless it has left."""
        self.life.leave(lambda r: audited(r, outcome, response.status))


@dataclass(frozen=True)
class Handed:
    """A claimed request's record sealed for the statement that records its outcome, and the
    answer (to ``outcome``) whose status it names."""

    outcome: RequestOutcome
    sealed: Sealed
    answer: web.StreamResponse


@dataclass(frozen=True)
class ReadyToSend:
    """Stages 1-4 passed: the request to send, and the row it claimed (None: a read)."""

    outbound: OutboundRequest
    claimed: Operation | None
    credential: frozenset[str]  # its spellings: no answer header carrying one reaches the agent


async def handle_agent_request(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    policy = gateway.policy  # this request is decided by the set it started with
    forwarded = request.get(FORWARDED)  # forward-proxy mode: which listener, which origin
    raw_target = forwarded.raw_path if forwarded is not None else request.raw_path
    record = AuditRecord(
        source=request.remote,
        method=request.method,
        # as sent: decoded, a path can hold what no log or database should (a NUL)
        path=request_path(raw_target),
        query_sha256=query_sha256(raw_target),
        policy_version=policy.version,
    )
    if forwarded is not None:
        record.listener, record.destination = "forward", forwarded.origin.authority
    else:
        token_provider = token_request_provider(policy, request.method, request.raw_path)
        if token_provider is not None:  # the SDK's own token request, answered here
            return await _token_request(gateway, token_provider, request, record)
    progress = Progress(record, _answer_in_dialect)
    with progress.life:  # every other way out: still exactly one record, from what is known
        outcome = progress.known = await _outcome(gateway, policy, request, progress)
        response: web.StreamResponse = progress.answer(outcome)
        # 8. audit, before a byte of the answer is written: numbered and queued (or stored by
        # the outcome's statement already), the record is on its way to the audit log however
        # long the agent takes to read (or a crash comes meanwhile). It says what opgate
        # answered; an answer that then does not reach the agent in full gets a record of its
        # own (audit.emit_undelivered), never a change.
        progress.answered(outcome, response)
        await _write_answer(request, response, record, gateway.settings)
        return response


def _answer_in_dialect(outcome: RequestOutcome) -> web.StreamResponse:
    """``answer``, with opgate's refusals in the provider's dialect (its ``errors:``)."""
    response = answer(outcome)
    if outcome.target is not None:
        return in_dialect(response, outcome.target.provider.errors)
    return response


async def _token_request(
    gw: Gateway, provider: Provider, request: web.Request, record: AuditRecord
) -> web.StreamResponse:
    """An SDK's OAuth token request answered at the boundary (token_exchange.py), in the
    provider's dialect, its record queued before the answer is written, as every request's."""
    with RecordLife(record) as life:
        response = in_dialect(
            await answer_token_request(gw, provider, request, record), provider.errors
        )
        record.response_status = response.status
        life.leave()
        await _write_answer(request, response, record, gw.settings)
        return response


async def _write_answer(
    request: web.Request, response: web.StreamResponse, record: AuditRecord, settings: Settings
) -> None:
    """The answer, written within ``answer_write_timeout_seconds`` (aiohttp has no write
    timeout: ``write_eof`` waits for the socket to drain, for ever if the agent never reads).
    Written here rather than by aiohttp once the handler returns, so that the deadline holds;
    a connection that is not taken in time is aborted.

    ``write_eof`` returning is not enough to say the answer went: a write that fails in the
    transport (the agent's reset reached the socket before the event loop read it) closes the
    transport and drops the bytes without raising, and ``write_eof`` waits only for a paused
    transport. So the transport is asked afterwards, by aiohttp's own test before every write:
    gone or closing, the agent went while its answer was written (on uvloop this was the usual
    way an agent's reset showed, bench/opgate-process-cpu.md). An agent that half-closes its
    side while its answer is flushed counts as gone here too, as aiohttp counts it for any
    write after its FIN."""
    try:
        async with asyncio.timeout(settings.answer_write_timeout_seconds):
            await response.prepare(request)
            await response.write_eof()
        transport = request.transport
        if transport is None or transport.is_closing():
            emit_undelivered(record, Undelivered.AGENT_DISCONNECTED)
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
        query_sha256=query_sha256(composed.raw_target),
        policy_version=policy.version,
        listener=listener,
    )
    progress = Progress(record, answer)
    with progress.life:
        outcome = progress.known = await _outcome(gateway, policy, composed, progress)
        response = progress.answer(outcome)
        progress.answered(outcome, response)
        return response


async def _outcome(
    gw: Gateway, policy: PolicySet, incoming: web.Request | ComposedRequest, progress: Progress
) -> RequestOutcome:
    # 1. identify the agent and the operation. Only `policy` (the set captured at the start)
    # is used: a reload mid-request must not mix two sets.
    if isinstance(incoming, ComposedRequest):
        target = identify_request(
            policy, gw.agents, incoming.method, incoming.raw_target, incoming.headers
        )
    else:
        target = identify(policy, gw.agents, incoming)
    if isinstance(target, Deny):
        return _NOTHING_KNOWN.updated(refusal=target)
    progress.known = _NOTHING_KNOWN.updated(target=target)
    # Requests in flight and request rates (per agent, per tenant) are capped before the body
    # is read or the database is touched, so that no agent can hold the pool (or a slow
    # body's connection) against others, nor flood the provider (proxy/gate/limits.py).
    slot = gw.in_flight.admit(target.agent, target.provider, gw.settings)
    if isinstance(slot, Deny):
        return progress.known.updated(refusal=slot)
    try:
        # 1b. read and parse the body strictly
        if isinstance(incoming, ComposedRequest):  # what read_body refuses, refused alike
            unreadable = refuse_before_reading(target, len(incoming.body))
            body = unreadable or parse_request_body(target, incoming.body)
        else:
            body = await read_body(incoming, target, gw.settings.body_read_timeout_seconds)
        if isinstance(body, Deny):
            late = body.reason is Reason.BODY_TIMEOUT  # the rest of a late body: not waited for
            return progress.known.updated(refusal=body, close_connection=late)
        keyed = with_body_key(target, body)  # a key the provider reads in the body names it too
        if isinstance(keyed, Deny):
            return progress.known.updated(refusal=keyed)
        # 2-4. load, decide, prepare, claim: nothing has left yet, so a store that fails here
        # is answered here, and only here, as "nothing was sent"
        try:
            ready = await _decide_and_claim(gw, keyed, body, progress)
        except StoreUnavailable as exc:
            return progress.known.updated(decision=Decision.ERROR, store_error=str(exc))
        if isinstance(ready, RequestOutcome):
            return ready
        # 5-7. forward, classify, record (8, audit, is the caller's)
        return await _forward(gw, keyed, ready, slot, progress)
    finally:
        slot.release()  # a no-op while a forwarded request's outcome is still being recorded


async def _decide_and_claim(
    gw: Gateway, target: Target, body: ParsedBody, progress: Progress
) -> RequestOutcome | ReadyToSend:
    """Stages 2-4: the outcome of a request answered without sending, or what to send."""
    facts = request_facts(target, body)
    # 2. load the authoritative row from the primary
    op = await load_operation(gw.store, target)
    progress.known = progress.known.updated(before=op)

    # 3. decide: ordered pure checks
    lookup_failed = target.named_operation_id is not None
    decision = decide(facts, op, operation_lookup_failed=lookup_failed)
    if isinstance(decision, Deny):
        shown = concealed(facts, decision, operation_lookup_failed=lookup_failed)
        if shown is None and op is not None and _escalation_due(decision, op):
            escalated = await _escalate_after_switch(gw, op, decision)
            return progress.known.updated(
                refusal=decision, row=escalated, status_after=escalated.status
            )
        return progress.known.updated(refusal=decision, shown=shown)
    if decision.would_deny is not None:  # shadow mode
        progress.known = progress.known.updated(would_deny=decision.would_deny.reason.value)
    if isinstance(decision, Replay):
        assert op is not None
        return progress.known.updated(decision=Decision.REPLAY, row=op, status_after=op.status)

    # 4. prepare what will leave (pure: it must not fail after the claim)
    provider = target.provider
    base = gw.upstream_base(provider.provider, provider.upstream)
    credential = await provider_credential(gw.credentials, gw.client, provider, base)
    if isinstance(credential, Deny):
        return progress.known.updated(refusal=credential)
    outbound = _prepare(gw, target, body, op, credential)
    if isinstance(outbound, Deny):
        return progress.known.updated(refusal=outbound)
    spellings = credential_forms(*credential.values())
    if decision.claim is ClaimKind.NONE:
        return ReadyToSend(outbound, None, spellings)
    assert op is not None

    # 4b. preconditions: ask the provider whether what the approval assumed still holds (a
    # lookup, before and outside the claim, which then needs the row unchanged since)
    checked = await _look_up_preconditions(gw, target, op)
    if checked is not None:
        progress.known = progress.known.updated(evidence=checked.evidence)
        refused = precondition_refusal(checked)
        if refused is not None and provider.mode_for(target.rule) is Mode.REPORT:
            would_deny = progress.known.would_deny or refused.reason.value
            progress.known = progress.known.updated(would_deny=would_deny)
        elif refused is not None:
            if isinstance(checked, Failed):
                await gw.store.record_precondition_failed(
                    op.operation_id, gw.settings.instance_id, checked.evidence
                )
            shown_extra = {**(refused.extra or {}), "precondition": checked.evidence}
            return progress.known.updated(refusal=replace(refused, extra=shown_extra))

    # 4c. claim: the row becomes dispatched in one conditional statement, on the row as read
    claimed = await _claim(gw, target, op, decision, progress)
    if isinstance(claimed, ClaimConflict):  # answered from the row as it is now
        current = claimed.current
        if isinstance(claimed.outcome, Replay):  # it carries the answer that won the race
            return progress.known.updated(
                decision=Decision.REPLAY, row=current, status_after=current.status
            )
        return progress.known.updated(refusal=claimed.outcome, row=current)
    return ReadyToSend(outbound, claimed, spellings)


def _escalation_due(decision: Deny, op: Operation) -> bool:
    """The checks refuse it as escalated, and it is not yet: a row in doubt after a timeline
    switch that no lookup can clear (transitions.py in_doubt_unverifiable). It is escalated now,
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
        look_again_seconds=_ESCALATED_LOOK_AGAIN_SECONDS,
        actor=gw.settings.instance_id,
    )
    return escalated or await gw.store.load(op.operation_id) or op


async def _forward(
    gw: Gateway, target: Target, ready: ReadyToSend, slot: Slot, progress: Progress
) -> RequestOutcome:
    """Shielded, so that an agent hanging up cannot stop the outcome of a request that has
    already left from being recorded (nor free its slot)."""
    claimed = ready.claimed
    sending = progress.known.updated(
        decision=Decision.ALLOW,
        sent_sha256=hashlib.sha256(ready.outbound.body).hexdigest(),
        row=claimed,
        status_after=claimed.status if claimed else None,
        attempt=claimed.attempts if claimed else None,
    )
    progress.known = sending
    forwarding = _send_and_record(gw, target, ready, sending, progress)
    return await asyncio.shield(slot.held_through(forwarding))


async def _send_and_record(
    gw: Gateway, target: Target, ready: ReadyToSend, sending: RequestOutcome, progress: Progress
) -> RequestOutcome:
    # 5. forward (5b for a rule whose upstream asks an x402 payment, in its place)
    # 5b. x402: paid once for the operation, the payment kept on it before it leaves
    # (gate/x402_pay.py); a refusal is shown, the answer still classified (or settled as the
    # payment's evidence says: ``paid_as``). Before the headers are filtered: the payment is
    # negotiated in headers the agent may not see.
    client = gw.egress_client(target.forwarded)  # forward mode: addresses are re-checked
    op = ready.claimed
    payment_refused, paid_as = None, None
    if op is not None and target.rule.x402 is not None:
        paid = await x402_pay.send(
            gw.store,
            gw.credentials,
            client,
            target.rule.x402,
            op,
            ready.outbound,
            target.headers,
            target.x402_limits,
        )
        answered, payment_refused, paid_as = paid.answered, paid.refusal, paid.settled_as
        sending = sending.updated(payment=paid.evidence)
    else:
        try:
            answered = await upstream.send(client, ready.outbound)
        except UpstreamError as exc:
            answered = exc
    if isinstance(answered, UpstreamResponse):  # only what the agent may see is kept
        answered, echoes = _shown_headers(target.provider, answered, ready.credential)
        sending = sending.updated(credential_echoes=echoes)
    if op is None:  # a read without an operation: nothing to record
        if isinstance(answered, UpstreamError):
            not_sent = LastOutcome.NOT_SENT if isinstance(answered, UpstreamNotSent) else None
            return sending.updated(
                decision=Decision.ERROR, provider_answer=answered, unsettled=not_sent
            )
        # no row to settle, but the record still says what the provider answered
        return sending.updated(provider_answer=answered, provider_status=answered.status)

    # 6. classify the provider's answer
    provider_status = None
    if isinstance(answered, UpstreamError):
        classified: Classified = Unknown(_unknown_outcome(answered))
    else:
        provider_status = answered.status
        classification = target.provider.classification_for(target.rule)
        classified = classify_answer(classification, answered.status, answered.body)
    if paid_as is not None:  # 5b's evidence decides: paid (answer lost), or never done (402)
        classified = paid_as

    # 7. record the outcome, and in the same statement the request's record (8. audit): the
    # outcome as it will be once that statement has committed
    outcome = sending.updated(provider_answer=answered, provider_status=provider_status)
    if isinstance(classified, Unknown) and paid_as is None:  # 5b's 402 for the agent: shown
        outcome = outcome.updated(decision=Decision.ERROR, unsettled=classified.outcome)
    if payment_refused is not None:
        outcome = outcome.updated(refusal=payment_refused)
    recorded_as = classified.status if isinstance(classified, Settled) else op.status
    outcome = outcome.updated(status_after=recorded_as)
    handed = _hand_over(progress, outcome)
    request = handed.sealed.text if handed is not None else None
    actor = gw.settings.instance_id
    try:
        if isinstance(classified, Settled):
            assert isinstance(answered, UpstreamResponse)
            stored = ProviderAnswer(
                answered.status,
                classified.object_id,
                answered.headers.get("Content-Type"),
                answered.body,
            )
            recorded = await gw.store.settle(
                op.operation_id, classified.status, stored, actor, request=request
            )
        else:
            recorded = await gw.store.end_attempt(
                op.operation_id,
                op.attempts,
                classified.outcome.value,
                provider_status,
                actor,
                request=request,
            )
    except StoreUnavailable:
        # The provider has answered but the row could not be updated: it stays dispatched with
        # a lease that will expire, i.e. unknown, which is true from the row's point of view.
        recorded = None
    if recorded is None:
        outcome = outcome.updated(status_after=op.status)
    if handed is not None:
        if recorded is not None:  # the record committed with the outcome
            progress.handed = handed
            progress.life.stored(handed.sealed)
        else:  # the statement failed, or found the row changed: the batch writer, as before
            status = progress.respond(outcome).status
            progress.life.not_stored(lambda r: audited(r, outcome, status))
    return outcome


def _shown_headers(
    provider: Provider, answered: UpstreamResponse, credential: frozenset[str]
) -> tuple[UpstreamResponse, tuple[str, ...]]:
    """The provider's answer with only the headers its policy lets the agent see, and the
    names of those dropped for carrying the credential (headers.response_headers)."""
    allowed = (*DEFAULT_RESPONSE_HEADERS, *provider.response_headers)
    shown = response_headers(answered.headers, allowed, credential)
    headers = CIMultiDictProxy(shown.headers)
    return replace(answered, headers=headers), shown.credential_echoes


def _hand_over(progress: Progress, outcome: RequestOutcome) -> Handed | None:
    """The record of a claimed request whose outcome is about to be recorded, sealed for that
    statement to store (RecordLife.hand_over), with the answer it names; None if it has left
    already (the agent hung up meanwhile: the handler sent it) or cannot go that way."""
    if progress.life.gone:
        return None
    response = progress.respond(outcome)
    sealed = progress.life.hand_over(lambda r: audited(r, outcome, response.status))
    return None if sealed is None else Handed(outcome, sealed, response)


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
    headers = outbound_headers(target.headers, provider.forward_headers, injected)
    raw = body.serialise()
    if provider.agent_signature is not None:  # the agent's identity, signed by opgate
        key = gw.signing_keys.get(target.agent.agent_id)
        if key is None:
            return Deny(Reason.AGENT_SIGNING_KEY_MISSING, f"no key for {target.agent.agent_id}")
        now = datetime.now(UTC)
        headers = signed_headers(
            target.rule.method,
            url,
            headers,
            raw,
            key,
            provider.agent_signature,
            now,
            gw.settings.signature_agent,
        )
    return OutboundRequest(
        method=target.rule.method,
        url=url,
        headers=headers,
        body=raw,
        connect_timeout=provider.timeouts.connect_seconds,
        total_timeout=provider.timeouts.total_seconds,
        max_response_bytes=provider.limits.max_response_body_bytes,
    )


@dataclass(frozen=True)
class ClaimConflict:
    """The claim found the row changed: what it is now, and what that means for this request."""

    outcome: Deny | Replay
    current: Operation


async def _look_up_preconditions(gw: Gateway, target: Target, op: Operation) -> Checked | None:
    """The rule's preconditions, looked up at the provider when a recheck is due
    (proxy/gate/preconditions.py); None when none is."""
    trigger = recheck_due(target.rule, op)
    if trigger is None:
        return None
    return await check_preconditions(gw, target.provider, target.rule, op, trigger)


async def _claim(
    gw: Gateway,
    target: Target,
    op: Operation,
    decision: Forward,
    progress: Progress,
) -> Operation | ClaimConflict:
    """The conditional UPDATE (a re-send after an unknown outcome asks the provider first),
    under the locks of the spend budgets it counts against, committing the decision made on
    ``op`` only on the row unchanged since and before the decision's deadline
    (transitions.commit_guard); on zero rows, re-read the row and say why."""
    provider = target.provider
    budgets = budget_claim(provider, target.rule, op)
    if isinstance(budgets, Deny):
        return ClaimConflict(budgets, op)
    lookup_owner = None
    lifetime = _decision_seconds(gw, target)
    guard = commit_guard(op, lifetime)
    if decision.claim is ClaimKind.RESEND_AFTER_LOOKUP and target.rule.reconcile is not None:
        asked = await ask_before_resend(gw, provider, target.rule.reconcile, op)
        if isinstance(asked, Operation):  # the provider has the effect: settled, replayed
            return ClaimConflict(Replay(), asked)
        if isinstance(asked, Deny):
            return ClaimConflict(asked, op)
        lookup_owner = asked.lookup_owner
        # the claim rests on the row as the lookup last wrote it (the lease's own write moved
        # updated_at), and on the lookup's lease while it lasts
        leased = asked.decided_on.reconcile_lease_until if lookup_owner is not None else None
        guard = commit_guard(asked.decided_on, lifetime, leased)
    rule = ClaimRule.of(provider, target.rule.name)  # the rule the request matched
    claim = Claim(
        op.operation_id,
        owner=claim_owner(gw.settings.instance_id),
        lease_seconds=_lease_seconds(gw, target),
        expected_attempts=op.attempts,
        dedup_window_seconds=rule.dedup_window_seconds,
        after_lookup_by=lookup_owner,
        read_version=guard.read_version,
        decided_before=guard.decided_before,
        actor=gw.settings.instance_id,
    )
    try:
        if budgets is None:  # the single unlocked statement
            # the loaded row's decoded params are reused (store.operation_from_record)
            claimed = await gw.store.claim(claim, loaded=op)
        else:
            sums = [budget_sum(key) for key in budgets.keys]
            made = await gw.store.claim_within_budgets(claim, sums, budgets.admits, loaded=op)
    except StoreUnavailable:  # it may have committed: the attempt after op.attempts
        _remember_cut_off(gw, CutOffClaim(op.operation_id, op.attempts + 1, claim.owner))
        raise
    if budgets is not None:
        over_budget, would_deny = budgets.judge(made.spent)
        if over_budget is not None:
            if lookup_owner is not None:
                await gw.store.release_reconcile(op.operation_id, lookup_owner)
            return ClaimConflict(over_budget, op)
        if would_deny is not None:  # shadow mode; an earlier stage's code stays first
            known = progress.known
            progress.known = known.updated(would_deny=known.would_deny or would_deny.reason.value)
        claimed = made.operation
    if claimed is not None:
        return claimed
    # Operations are never deleted, so the row is there; fall back on the old one regardless.
    current = await gw.store.load(op.operation_id) or op
    stale = stale_reason(guard, current)  # read before the lookup's lease is given back
    if lookup_owner is not None:
        await gw.store.release_reconcile(op.operation_id, lookup_owner)
        current = await gw.store.load(op.operation_id) or current
    explained = decide_by_state(target.provider, current)
    if isinstance(explained, Forward) and current.attempts != op.attempts:
        # It was claimable a moment ago and is again: another attempt won and already ended.
        explained = Deny(Reason.OPERATION_IN_FLIGHT, "another attempt claimed it first", 1)
    elif isinstance(explained, Forward) and stale is not None:
        # A writer moved the row since the decision read it, or the decision outlived its
        # deadline: what was decided is not committed; the next request decides afresh.
        explained = Deny(Reason.DECISION_STALE, f"{stale}: nothing was sent", 1)
    elif isinstance(explained, Forward):
        # No attempt came between, the row is as decided, the deadline holds, and the row
        # still allows the send: the statement refused what the checks allow. Named, never
        # sent; the next request decides again.
        _log.warning(
            "claim_refused",
            operation_id=op.operation_id,
            transition=transition(current, rule).kind.value,
            claim=explained.claim.value,
            attempts=current.attempts,
            after_lookup=lookup_owner is not None,
            read_version=guard.read_version.isoformat(),
        )
        explained = Deny(
            Reason.CLAIM_REFUSED,
            f"the claim of attempt {current.attempts + 1} was refused though the row allows it",
            1,
        )
    return ClaimConflict(explained, current)


def _remember_cut_off(gw: Gateway, claim: CutOffClaim) -> None:
    """A claim cut off before anything left: released as not_sent once the store answers
    (proxy/gate/cutoff.py), so that the operation can be sent, not burned by reconciliation."""

    async def release(cut: CutOffClaim) -> bool:
        released = await gw.store.end_attempt(
            cut.operation_id,
            cut.attempt,
            LastOutcome.NOT_SENT.value,
            None,
            gw.settings.instance_id,
            owner=cut.owner,
        )
        return released is not None

    gw.cut_off.remember(claim, release)


def _decision_seconds(gw: Gateway, target: Target) -> float:
    """How long a decision may take to commit after its read (its lookups included): as long
    as an attempt's lease; one older rests on facts that time alone may have changed."""
    return _lease_seconds(gw, target)


def _lease_seconds(gw: Gateway, target: Target) -> float:
    """How long a claim's lease lasts: the provider's whole timeout, and a margin."""
    return target.provider.timeouts.total_seconds + gw.settings.lease_margin_seconds


# --- the answer and the audit record, each made once from the outcome ----------------------
def answer(outcome: RequestOutcome) -> web.Response:
    """The agent's answer to the request that came to ``outcome``."""
    if outcome.store_error is not None:
        return problem_response(
            Reason.STORE_UNAVAILABLE, f"nothing was sent: {outcome.store_error}"
        )
    row = outcome.row or outcome.before
    if outcome.decision == Decision.REPLAY:
        assert row is not None
        return _replay(row)
    if outcome.provider_answer is not None and outcome.refusal is None:
        unsettled = outcome.decision == Decision.ERROR
        return _pass_through(outcome.provider_answer, row, outcome.status_after, unsettled)
    assert outcome.refusal is not None
    response = _refusal(outcome.refusal, outcome.shown, row)
    if outcome.close_connection:
        response.force_close()
    return response


def audited(
    record: AuditRecord, outcome: RequestOutcome, response_status: int | None = None
) -> AuditRecord:
    """``record`` (begun when the request came in) completed from ``outcome``: the one place
    a request's audit fields are written."""
    target, before = outcome.target, outcome.before
    if target is not None:
        record.agent_id, record.tenant = target.agent.agent_id, target.agent.tenant
        record.provider, record.rule = target.provider.provider, target.rule.name
    if before is not None:
        record.operation_id, record.status_before = before.operation_id, before.status.value
    record.decision = outcome.decision
    if outcome.store_error is not None:
        record.reason = Reason.STORE_UNAVAILABLE.value
    elif outcome.refusal is not None:
        record.reason = outcome.refusal.reason.value
    elif outcome.unsettled is not None:
        record.reason = outcome.unsettled.value
    record.status_after = outcome.status_after.value if outcome.status_after else None
    record.attempt = outcome.attempt
    record.would_deny = outcome.would_deny
    record.precondition = outcome.evidence
    record.payment = outcome.payment
    record.provider_status = outcome.provider_status
    record.forwarded_body_sha256 = outcome.sent_sha256
    record.provider_answer_sha256 = _answer_sha256(outcome)
    record.response_status = response_status
    record.credential_echoes = list(outcome.credential_echoes) or None
    return record


def _answer_sha256(outcome: RequestOutcome) -> str | None:
    """The digest of the provider's answer this request received, or replayed from the row."""
    answered = outcome.provider_answer
    if isinstance(answered, UpstreamResponse):
        return hashlib.sha256(answered.body).hexdigest()
    row = outcome.row or outcome.before
    if outcome.decision == Decision.REPLAY and row is not None:
        return hashlib.sha256(row.response_body or b"").hexdigest()
    return None


def _refusal(refusal: Deny, shown: Deny | None, op: Operation | None) -> web.Response:
    """Refuse with ``refusal``, or show ``shown`` instead (checks.concealed): the audit record
    keeps the real reason and operation, the agent learns neither, nor the operation's status."""
    deny = refusal
    if shown is not None:  # nothing of the real refusal is shown, its evidence neither
        deny, op = shown, None
    extra = dict(deny.extra) if deny.extra else None
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


def _replay(op: Operation) -> web.Response:
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


def _unknown_outcome(error: UpstreamError) -> LastOutcome:
    if isinstance(error, UpstreamNotSent):
        return LastOutcome.NOT_SENT
    if isinstance(error, UpstreamTimeout):
        return LastOutcome.UNKNOWN_TIMEOUT
    if isinstance(error, UpstreamTruncated):
        return LastOutcome.UNKNOWN_TRUNCATED
    return LastOutcome.UNKNOWN_DROPPED


def _pass_through(
    answered: UpstreamResponse | UpstreamError,
    op: Operation | None,
    status: Status | None,
    unsettled: bool,
) -> web.Response:
    """The agent's answer once something was (or may have been) sent: for an operation, its
    id and its status now."""
    op_id = op.operation_id if op else None
    op_status = status.value if status else None
    if isinstance(answered, UpstreamError):
        if isinstance(answered, UpstreamNotSent):
            return problem_response(
                Reason.UPSTREAM_UNAVAILABLE,
                f"nothing was sent: {answered}",
                operation_id=op_id,
                operation_status=op_status,
            )
        return problem_response(
            Reason.OUTCOME_UNKNOWN,
            str(answered),
            status=504 if isinstance(answered, UpstreamTimeout) else 502,
            operation_id=op_id,
            operation_status=op_status,
        )
    if op_id is not None and unsettled:
        # The provider answered, but not in a way that settles the operation (e.g. a 5xx).
        return problem_response(
            Reason.OUTCOME_UNKNOWN,
            f"the provider answered {answered.status}",
            operation_id=op_id,
            operation_status=op_status,
            extra={"provider_status": answered.status},
        )
    headers = CIMultiDict(answered.headers)  # filtered when it arrived (_shown_headers)
    if op_id is not None and op_status is not None:
        headers["X-Operation-Id"] = op_id
        headers["X-Operation-Status"] = op_status
    return web.Response(
        status=answered.status, reason=answered.reason, headers=headers, body=answered.body
    )
