"""The operation store: asyncpg against the PostgreSQL primary. The only module that runs SQL
on the request path; every statement comes from queries.sql.

Every error that means the store cannot be reached or used (``faults.is_unavailable``, by
class) becomes ``StoreUnavailable``: the caller fails closed on it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import structlog

from proxy.errors import AlreadySuperseded, IdempotencyKeyInUse, StoreUnavailable
from proxy.store import queries
from proxy.store.connections import Connections
from proxy.store.faults import is_unavailable
from proxy.store.locks import LockKey, LockKind, lock_count_insert
from proxy.store.operation import Approval, Approved, Operation, Status
from proxy.store.promotion import Proof, SwitchFacts, SyncWitness, prove
from proxy.store.proposal import PendingProposals, Proposal
from proxy.store.readiness import ReadinessConnection
from proxy.store.replication import ReplicationFacts, Verdict, facts_from_row, judge

T = TypeVar("T")
_log = structlog.get_logger("opgate.store")


@dataclass(frozen=True)
class NewOperation(Approved):
    """The row to insert: the approval as given (queries.sql ``create_operation``'s
    parameters but the actor: ``operation_values``), and the operation it replaces, if any."""

    supersedes: str | None = None


@dataclass(frozen=True)
class NewProposal:
    """A proposal to insert: the operation its approval creates, exactly, and why."""

    proposal_id: str
    operation: NewOperation
    reason: str
    approval_seconds: float
    pending_seconds: float


@dataclass(frozen=True)
class ProviderAnswer:
    status: int
    object_id: str | None
    content_type: str | None
    body: bytes


@dataclass(frozen=True)
class BudgetSum:
    """The operations one budget sums over (queries.sql ``budget_spent``), and the name of the
    lock claims on it take turns on (``LockKind.BUDGET``, proxy/store/locks.py)."""

    lock_name: str
    provider: str
    currency: str
    tenant: str | None  # None: every tenant
    agent_id: str | None  # None: every agent
    window_seconds: float


@dataclass(frozen=True)
class BudgetedClaim:
    """A claim made under its budgets' locks: what they had spent before it (the operation
    itself left out), and the claimed row (None: refused by ``admit``, or a state conflict)."""

    spent: list[int]
    admitted: bool
    operation: Operation | None


async def _budgets_spent(
    conn: asyncpg.Connection, sums: Sequence[BudgetSum], *, excluding: str | None
) -> list[int]:
    """What each budget has spent (queries.sql ``budget_spent``), leaving out the operation
    ``excluding`` (the one being claimed: a re-send counts once)."""
    spent = []
    for s in sums:
        value = await queries.fetchval(
            conn,
            "budget_spent",
            provider=s.provider,
            currency=s.currency,
            tenant=s.tenant,
            agent_id=s.agent_id,
            window_seconds=s.window_seconds,
            excluding=excluding,
        )
        spent.append(int(value))
    return spent


@dataclass(frozen=True)
class Claim:
    """queries.sql ``claim_operation``'s parameters, once, for the claim alone and the claim
    under budget locks alike: a first attempt (the row is created) or a re-send of the attempt
    numbered ``expected_attempts``, the lease taken by ``owner`` for ``lease_seconds``.
    ``dedup_window_seconds``: how long after creation the provider deduplicates the key (None:
    never relied on). ``after_lookup_by``: the live lookup lease under which the provider showed
    no effect. ``read_version``: the row's ``updated_at`` as the decision read it, and
    ``decided_before``: the decision's deadline (proxy/gate/transitions.py ``commit_guard``);
    the claim commits only on the row unchanged since, before the deadline (None: unguarded,
    for a caller that decided on no read). ``actor``: the claim event's (None: the owner)."""

    operation_id: str
    owner: str
    lease_seconds: float
    expected_attempts: int
    dedup_window_seconds: float | None = None
    after_lookup_by: str | None = None
    read_version: datetime | None = None
    decided_before: datetime | None = None
    actor: str | None = None

    def arguments(self) -> dict[str, Any]:
        """The statement's named arguments (an empty actor is the owner)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return values | {"actor": self.actor or None}


@dataclass(frozen=True)
class ApprovalKeyScope:
    """An application's Idempotency-Key on ``POST /v1/operations`` and whose it is: the
    tenant the approval is for and the caller (migration 0027_failover)."""

    tenant: str
    caller: str
    request_key: str


@dataclass(frozen=True)
class ApprovalKeyRecord:
    operation_id: str
    fingerprint: str


def _key_values(key: ApprovalKeyScope) -> dict[str, str]:
    return {"tenant": key.tenant, "caller": key.caller, "request_key": key.request_key}


@dataclass(frozen=True)
class TimelineSeen:
    """What a connection saw of the primary's timeline (queries.sql ``timeline_seen``)."""

    current: int | None  # None: the connection is to a standby
    previous: int | None  # the greatest recorded before (None: none was)
    marked: int | None  # operations put in doubt now (None: this connection recorded nothing)


async def see_timeline(conn: asyncpg.Connection, *, prove: bool = False) -> TimelineSeen:
    """Record the timeline ``conn`` writes on, marking the operations a switch put in doubt,
    unless ``prove`` and the switch provably lost no acknowledged claim
    (proxy/store/promotion.py). Nothing on a standby: it refuses the statement (one that
    writes, even nothing), and a connection to one must still open, to be refused by what uses
    it (``ping``)."""
    if await queries.fetchval(conn, "ping"):
        return TimelineSeen(None, None, None)
    proof = await _switch_proof(conn, prove)
    record = await queries.fetchrow(
        conn, "timeline_seen", unmarked_because=proof.why if proof and proof.nothing_lost else None
    )
    assert record is not None  # one row always
    seen = TimelineSeen(record["current_timeline"], record["previous_timeline"], record["marked"])
    if seen.marked is not None and seen.previous is not None and proof is not None:
        # This connection recorded the switch: say what was done about it, once.
        say = _log.warning if seen.marked else _log.info
        say(
            "timeline_switched",
            timeline=seen.current,
            previous_timeline=seen.previous,
            operations_in_doubt=seen.marked,
            nothing_lost=proof.nothing_lost,
            proof=proof.why,
        )
    return seen


async def _switch_proof(conn: asyncpg.Connection, prove_it: bool) -> Proof | None:
    """Whether a switch this connection sees lost no acknowledged claim; None where it sees
    none (the timeline recorded already, or the first one ever)."""
    row = await queries.fetchrow(conn, "timeline_facts")
    assert row is not None  # one row always
    current, previous = row["current_timeline"], row["previous_timeline"]
    if current is None or previous is None or current <= previous:
        return None
    if not prove_it:
        return Proof(False, _NOT_PROVED)
    witness = None
    if row["standby_names"] is not None:
        witness = SyncWitness(
            previous,
            row["standby_names"],
            tuple(row["wal_senders"]),
            row["statement_timeout"],
            row["witnessed_at"],
        )
    return prove(SwitchFacts(current, previous, witness, row["streamed"], row["primary_conninfo"]))


# Where the proof is not asked for: a process that accepts asynchronous replication
# (accept_async_replication) serves while standbys lag, for as long as they do, so the last
# witness a promoted standby received says nothing of what was acknowledged after it; and
# tools (the CLI) that do not know the setting.
_NOT_PROVED = "not proved here (asynchronous replication accepted, or not a server)"


def _see_timeline_first(prove: bool) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """What every new pooled connection does before its first use. After a failover every
    connection is new (the old primary's died with it), so no claim on a new timeline can
    precede the marking of the operations that the lost timeline may have sent; a periodic
    check could come after one."""

    async def see(conn: asyncpg.Connection) -> None:
        await see_timeline(conn, prove=prove)

    return see


async def _witnessed_facts(conn: asyncpg.Connection) -> ReplicationFacts:
    """The replication facts (queries.sql ``replication_state``) and, on a primary, their
    witness for a later promotion (``record_sync_witness``: what proxy/store/promotion.py
    proves from)."""
    row = await queries.fetchrow(conn, "replication_state")
    assert row is not None  # one row always
    if not row["in_recovery"]:
        await queries.execute(conn, "record_sync_witness")
    return facts_from_row(
        row["in_recovery"], row["standby_names"], row["synchronous_commit"], row["standbys"]
    )


async def _reset_connection(conn: asyncpg.Connection) -> None:
    """Replaces asyncpg's default reset (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL: one
    extra round trip per request). opgate never leaves session state behind: no LISTEN, no
    session advisory locks, no SET. Only an interrupted transaction needs undoing."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


class _ApprovalKeyTaken(Exception):
    """A twin holds the application's Idempotency-Key (``Store.create_keyed`` answers None)."""


# The one translation of a unique violation into opgate's own error, by the constraint it broke
# (schema.sql's names; tests/store/test_store.py keeps each one a constraint of the schema), at
# the store's boundary (``Store._run``: every call, the mandates' too). A violation of any other
# constraint is not a conflict opgate expects, and is not translated.
UNIQUE_VIOLATIONS: dict[str, type[Exception]] = {
    "operations_provider_key_unique": IdempotencyKeyInUse,
    # an approved proposal's operation (proposal_approve has no ON CONFLICT): its id is held
    "operations_pkey": IdempotencyKeyInUse,
    "operations_supersedes_key": AlreadySuperseded,
    "approval_keys_pkey": _ApprovalKeyTaken,
}


class Store:
    def __init__(
        self, pool: asyncpg.Pool, acquire_timeout: float, readiness: ReadinessConnection
    ) -> None:
        self._connections = Connections(pool, acquire_timeout)  # every call's connection
        self._readiness = readiness  # /readyz's own, outside the pool
        # Why claims are refused now (replication judged asynchronous at run time, not
        # accepted: proxy/store/replication.py), or None; set by each judgement.
        self._claims_refused: str | None = None

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 10,
        acquire_timeout: float = 5.0,
        statement_timeout_ms: int = 5000,
        instance_id: str | None = None,
        statement_cache_size: int = 100,
        prove_promotions: bool = False,
    ) -> Store:
        """``prove_promotions``: a switch of timeline that provably lost no acknowledged claim
        marks nothing (proxy/store/promotion.py); only for a server that refuses asynchronous
        replication (see ``_NOT_PROVED``)."""
        # opgate.instance_id: read by the audit trigger (migration 0003) so that each
        # transition's audit record names the instance and the policy set that wrote it.
        settings = {"application_name": "opgate", "opgate.instance_id": instance_id or ""}
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                reset=_reset_connection,
                init=_see_timeline_first(prove_promotions),
                timeout=acquire_timeout,
                command_timeout=statement_timeout_ms / 1000,
                server_settings=settings,
                # 0 behind PgBouncer's transaction pooling, where a named prepared statement
                # may live on another server connection than the next query's
                statement_cache_size=statement_cache_size,
            )
        except Exception as exc:
            if is_unavailable(exc, connecting=True):
                raise StoreUnavailable(f"cannot open the pool: {exc}") from exc
            raise

        async def connect_for_readiness() -> asyncpg.Connection:
            conn: asyncpg.Connection = await asyncpg.connect(
                dsn,
                command_timeout=statement_timeout_ms / 1000,
                server_settings={**settings, "application_name": "opgate-readiness"},
                statement_cache_size=statement_cache_size,
            )
            return conn

        return cls(pool, acquire_timeout, ReadinessConnection(connect_for_readiness))

    async def close(self) -> None:
        self._readiness.drop()
        await self._connections.close()

    async def run(self, call: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``call`` on a pooled connection, errors translated (the audit writer uses it)."""
        return await self._run(call)

    def pool_usage(self) -> tuple[int, int, int]:
        """(open, idle, maximum) connections: the pool saturation metrics."""
        return self._connections.usage()

    async def _run(self, call: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        try:
            return await self._connections.run(call)
        except StoreUnavailable:
            raise
        except asyncpg.exceptions.UniqueViolationError as exc:
            error = UNIQUE_VIOLATIONS.get(exc.constraint_name or "")
            if error is None:
                raise  # not a conflict opgate expects: a bug, shown as it is
            raise error(exc.constraint_name) from exc
        except Exception as exc:
            if is_unavailable(exc):
                raise StoreUnavailable(str(exc) or type(exc).__name__) from exc
            raise

    async def _one(
        self, query: str, loaded: Operation | None = None, /, **values: Any
    ) -> Operation | None:
        record = await self._run(lambda conn: queries.fetchrow(conn, query, **values))
        return None if record is None else operation_from_record(record, loaded)

    async def _status(self, query: str, **values: Any) -> Status | None:
        value = await self._run(lambda conn: queries.fetchval(conn, query, **values))
        return None if value is None else Status(value)

    async def load(self, operation_id: str) -> Operation | None:
        return await self._one("load_operation", operation_id=operation_id)

    async def load_by_key(self, provider: str, idempotency_key: str) -> Operation | None:
        return await self._one(
            "load_operation_by_key", provider=provider, idempotency_key=idempotency_key
        )

    async def create(self, new: NewOperation, actor: str) -> Operation | None:
        """The created row, or None if ``operation_id`` exists already. IdempotencyKeyInUse,
        AlreadySuperseded: another operation holds its key, or supersedes what it does
        (``UNIQUE_VIOLATIONS``)."""
        return await self._one("create_operation", **operation_values(new), actor=actor)

    async def create_keyed(
        self, new: NewOperation, actor: str, key: ApprovalKeyScope, fingerprint: str
    ) -> Operation | None:
        """The created row, stored with the application's Idempotency-Key (queries.sql
        ``create_operation_keyed``); None if the key or ``operation_id`` is taken already (a
        twin that raced for the key included): :meth:`approval_key` tells which."""
        if key.tenant != new.tenant:
            raise ValueError("an approval's key is scoped to the approval's own tenant")
        try:
            return await self._one(
                "create_operation_keyed",
                **operation_values(new),  # its tenant is the key's too
                actor=actor,
                caller=key.caller,
                request_key=key.request_key,
                fingerprint=fingerprint,
            )
        except _ApprovalKeyTaken:
            return None

    async def approval_key(self, key: ApprovalKeyScope) -> ApprovalKeyRecord | None:
        """What the application's Idempotency-Key made: its operation and its approval's
        fingerprint; None if the key is unused."""
        record = await self._run(
            lambda conn: queries.fetchrow(conn, "approval_key", **_key_values(key))
        )
        if record is None:
            return None
        return ApprovalKeyRecord(record["operation_id"], record["fingerprint"])

    async def claim(self, claim: Claim, loaded: Operation | None = None) -> Operation | None:
        """The claim, or None: the statement itself decides whether a re-send may go
        (queries.sql ``claim_operation``). ``loaded``: the row as the caller loaded it, whose
        decoded parameters are reused (``operation_from_record``)."""
        self._refuse_while_not_durable()
        return await self._one("claim_operation", loaded, **claim.arguments())

    async def claim_within_budgets(
        self,
        claim: Claim,
        sums: Sequence[BudgetSum],
        admit: Callable[[list[int]], bool],
        loaded: Operation | None = None,
    ) -> BudgetedClaim:
        """``claim`` in one transaction that first takes each budget's lock (in key order,
        proxy/store/locks.py: two claims never wait on each other crosswise), then sums what
        each budget has spent,
        and claims only if ``admit`` (pure: the gate's decision) accepts those sums. Claims on
        the same budget, from any number of processes, are serialised: together they can never
        spend more than ``admit`` allows."""
        self._refuse_while_not_durable()

        async def claim_under_locks(conn: asyncpg.Connection) -> BudgetedClaim:
            made = await lock_count_insert(
                conn,
                [LockKey(LockKind.BUDGET, s.lock_name) for s in sums],
                lambda conn: _budgets_spent(conn, sums, excluding=claim.operation_id),
                admit,
                lambda conn: queries.fetchrow(conn, "claim_operation", **claim.arguments()),
            )
            record = made.inserted
            claimed = None if record is None else operation_from_record(record, loaded)
            return BudgetedClaim(made.counted, made.admitted, claimed)

        return await self._run(claim_under_locks)

    async def budget_spent(self, sums: Sequence[BudgetSum]) -> list[int]:
        """What each budget has spent now, without its lock: advisory (an approval, a read);
        only a claim decides."""
        return await self._run(lambda conn: _budgets_spent(conn, sums, excluding=None))

    async def budget_spent_by_key(
        self, provider: str, currency: str, window_seconds: float, *, tenant: bool, agent: bool
    ) -> list[tuple[str | None, str | None, int]]:
        """(tenant, agent id, spent) for every key of a budget that spent anything."""
        records = await self._run(
            lambda conn: queries.fetch(
                conn,
                "budget_spent_by_key",
                provider=provider,
                currency=currency,
                by_tenant=tenant,
                by_agent=agent,
                window_seconds=window_seconds,
            )
        )
        return [(r["tenant"], r["agent_id"], int(r["spent"])) for r in records]

    async def record_precondition_failed(
        self, operation_id: str, actor: str, evidence: dict[str, Any]
    ) -> bool:
        """Keep a failed precondition's evidence as the operation's event (False: the row is
        no longer created, and nothing was recorded)."""
        seq = await self._run(
            lambda conn: queries.fetchval(
                conn,
                "record_precondition_failed",
                operation_id=operation_id,
                actor=actor,
                evidence=_jsonb(evidence),
            )
        )
        return seq is not None

    async def precondition_failures(self, operation_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The latest failed-precondition evidence of each of these operations still created."""
        if not operation_ids:
            return {}
        rows = await self._run(
            lambda conn: queries.fetch(conn, "precondition_failures", operation_ids=operation_ids)
        )
        return {row["operation_id"]: json.loads(row["detail"]) for row in rows}

    async def settle(
        self,
        operation_id: str,
        status: Status,
        answer: ProviderAnswer,
        actor: str,
        *,
        request: str | None = None,
    ) -> Status | None:
        """The row's status once settled, or None if it was not dispatched. ``request``: the
        JSON of the agent request's audit record, written with the settle (migration 0022)."""
        return await self._status(
            "settle_operation",
            operation_id=operation_id,
            status=status.value,
            provider_status=answer.status,
            object_id=answer.object_id,
            content_type=answer.content_type,
            body=answer.body,
            actor=actor,
            request=request,
        )

    async def end_attempt(
        self,
        operation_id: str,
        attempt: int,
        outcome: str,
        provider_status: int | None,
        actor: str,
        *,
        owner: str | None = None,
        request: str | None = None,
    ) -> Status | None:
        """End ``attempt`` without settling the operation (queries.sql ``release_unknown``):
        its outcome unknown, or ``not_sent`` (a claim withdrawn before anything left). The
        row's status (still dispatched), or None if ``attempt`` no longer holds it. ``owner``:
        only if that claim holds it, its end unrecorded (a cut-off claim). ``request``: as
        ``settle``'s."""
        return await self._status(
            "release_unknown",
            operation_id=operation_id,
            attempt=attempt,
            outcome=outcome,
            provider_status=provider_status,
            actor=actor,
            owner=owner,
            request=request,
        )

    async def many(self, query: str, **values: Any) -> list[Operation]:
        records = await self._run(lambda conn: queries.fetch(conn, query, **values))
        return [operation_from_record(r) for r in records]

    async def list_operations(
        self,
        tenant: str | None,
        statuses: list[str],
        agent_id: str | None = None,
        limit: int = 100,
    ) -> list[Operation]:
        return await self.many(
            "list_operations", tenant=tenant, statuses=statuses, agent_id=agent_id, limit=limit
        )

    async def escalated(self, tenant: str | None, limit: int) -> list[Operation]:
        """The escalation queue of ``tenant`` (None: every tenant's), oldest escalation first."""
        return await self.many("escalated_operations", tenant=tenant, limit=limit)

    async def claim_reconcile_one(
        self,
        operation_id: str,
        owner: str,
        lease_seconds: float,
        *,
        in_doubt: bool = False,
        unchanged_since: datetime | None = None,
    ) -> Operation | None:
        """The reconciliation lease of a dispatched operation; with ``in_doubt``, also of a
        created one that a timeline switch put in doubt (its lookup before the send).
        ``unchanged_since``: the row's ``updated_at`` as the decision that asks read it."""
        return await self._one(
            "claim_reconcile_one",
            operation_id=operation_id,
            owner=owner,
            lease_seconds=lease_seconds,
            in_doubt=in_doubt,
            unchanged_since=unchanged_since,
        )

    async def claim_reconcile_batch(
        self, owner: str, lease_seconds: float, limit: int
    ) -> list[Operation]:
        return await self.many(
            "claim_reconcile_batch", owner=owner, lease_seconds=lease_seconds, limit=limit
        )

    async def settle_reconciled(
        self,
        operation_id: str,
        owner: str,
        status: Status,
        reason: str,
        answer: ProviderAnswer | None,
        evidence: dict[str, Any],
        *,
        expected_attempts: int,
        unchanged_since: datetime | None = None,
    ) -> Operation | None:
        """dispatched -> confirmed | failed by the reconciliation lease's holder (queries.sql
        ``settle_reconciled``); ``unchanged_since``: the row's ``updated_at`` as the lease was
        taken, which it must still have. None: stale (a conflict to explain)."""
        return await self._one(
            "settle_reconciled",
            operation_id=operation_id,
            owner=owner,
            status=status.value,
            reason=reason,
            object_id=answer.object_id if answer else None,
            provider_status=answer.status if answer else None,
            content_type=answer.content_type if answer else None,
            body=answer.body if answer else None,
            evidence=_jsonb(evidence),
            expected_attempts=expected_attempts,
            unchanged_since=unchanged_since,
        )

    async def reconcile_inconclusive(
        self,
        operation_id: str,
        owner: str,
        retry_in_seconds: float,
        evidence: dict[str, Any],
        *,
        expected_attempts: int,
    ) -> Operation | None:
        return await self._one(
            "reconcile_inconclusive",
            operation_id=operation_id,
            owner=owner,
            retry_in_seconds=retry_in_seconds,
            evidence=_jsonb(evidence),
            expected_attempts=expected_attempts,
        )

    async def release_reconcile(self, operation_id: str, owner: str) -> None:
        await self._run(
            lambda conn: queries.execute(
                conn, "release_reconcile", operation_id=operation_id, owner=owner
            )
        )

    async def escalate(
        self,
        operation_id: str,
        owner: str | None,
        reason: str,
        evidence: dict[str, Any],
        *,
        look_again_seconds: float,
        expected_attempts: int | None = None,
        actor: str | None = None,
    ) -> Operation | None:
        """Escalate to a human: by the holder of a live reconciliation lease for the attempt
        it looked up, or without one (``owner`` None) by ``actor`` (an admin if None)."""
        return await self._one(
            "escalate_operation",
            operation_id=operation_id,
            owner=owner,
            reason=reason,
            evidence=_jsonb(evidence),
            look_again_seconds=look_again_seconds,
            expected_attempts=expected_attempts,
            actor=actor,
        )

    async def resolve(
        self, operation_id: str, status: Status, object_id: str | None, note: str, actor: str
    ) -> Operation | None:
        return await self._one(
            "resolve_operation",
            operation_id=operation_id,
            status=status.value,
            object_id=object_id,
            note=note,
            actor=actor,
        )

    async def claim_notifications(self, limit: int, lease_seconds: float) -> list[dict[str, Any]]:
        records = await self._run(
            lambda conn: queries.fetch(
                conn, "claim_notifications", limit=limit, lease_seconds=lease_seconds
            )
        )
        return [dict(r) for r in records]

    async def notification_delivered(self, notification_id: int) -> None:
        await self._run(
            lambda conn: queries.execute(
                conn, "notification_delivered", notification_id=notification_id
            )
        )

    async def notification_failed(self, notification_id: int, retry_in: float, error: str) -> None:
        await self._run(
            lambda conn: queries.execute(
                conn,
                "notification_failed",
                notification_id=notification_id,
                retry_in_seconds=retry_in,
                error=error[:500],
            )
        )

    async def revoke(self, operation_id: str, reason: str, actor: str) -> Operation | None:
        return await self._one(
            "revoke_operation", operation_id=operation_id, reason=reason, actor=actor
        )

    async def revoke_unsent(self, operation_id: str, reason: str, actor: str) -> Operation | None:
        """Revoke only while nothing was sent (``created``); None: claimed or revoked first."""
        return await self._one(
            "revoke_unsent_operation", operation_id=operation_id, reason=reason, actor=actor
        )

    async def events(self, operation_id: str) -> list[dict[str, Any]]:
        records = await self._run(
            lambda conn: queries.fetch(conn, "operation_events", operation_id=operation_id)
        )
        return [
            {**dict(r), "at": r["at"].isoformat(), "detail": json.loads(r["detail"])}
            for r in records
        ]

    async def _proposal(self, query: str, **values: Any) -> Proposal | None:
        record = await self._run(lambda conn: queries.fetchrow(conn, query, **values))
        return None if record is None else proposal_from_record(record)

    async def create_proposal(
        self,
        new: NewProposal,
        admit: Callable[[PendingProposals], bool],
        declined_twin_seconds: float,
    ) -> Proposal | PendingProposals:
        """The new pending proposal, if ``admit`` (pure: the caps) accepts what already waits
        for a human; else what waits. One transaction that first takes the tenant's proposal
        lock: proposals created at once, by any number of processes, are counted one after
        the other, so together they never pass the caps."""
        op = new.operation
        values = {
            **_values(op, _APPROVAL_FIELDS),
            "proposal_id": new.proposal_id,
            "reason": new.reason,
            "approval_seconds": new.approval_seconds,
            "pending_seconds": new.pending_seconds,
            "declined_twin_seconds": declined_twin_seconds,
        }

        async def count(conn: asyncpg.Connection) -> PendingProposals:
            row = await queries.fetchrow(
                conn, "proposals_pending_count", tenant=op.tenant, agent_id=op.agent_id
            )
            assert row is not None  # an aggregate: always one row
            return PendingProposals(
                agent=row["agent_pending"],
                tenant=row["tenant_pending"],
                agent_first_expiry_seconds=row["agent_first_expiry_seconds"],
                tenant_first_expiry_seconds=row["tenant_first_expiry_seconds"],
            )

        async def create_under_lock(conn: asyncpg.Connection) -> Proposal | PendingProposals:
            made = await lock_count_insert(
                conn,
                [LockKey(LockKind.PROPOSALS, op.tenant)],
                count,
                admit,
                lambda conn: queries.fetchrow(conn, "proposal_create", **values),
            )
            if not made.admitted:
                return made.counted
            assert made.inserted is not None  # an INSERT with no condition returns its row
            return proposal_from_record(made.inserted)

        return await self._run(create_under_lock)

    async def load_proposal(self, proposal_id: str) -> Proposal | None:
        return await self._proposal("proposal_load", proposal_id=proposal_id)

    async def watched_versions(
        self, operation_ids: list[str], proposal_ids: list[str]
    ) -> dict[str, str]:
        """A version of each named row that exists (a digest: it changes when the row does)."""
        records = await self._run(
            lambda conn: queries.fetch(
                conn,
                "watched_versions",
                operation_ids=operation_ids,
                proposal_ids=proposal_ids,
            )
        )
        return {r["id"]: r["version"] for r in records}

    async def list_proposals(
        self, tenant: str | None, states: list[str], limit: int = 100
    ) -> list[Proposal]:
        records = await self._run(
            lambda conn: queries.fetch(
                conn, "proposal_list", tenant=tenant, states=states, limit=limit
            )
        )
        return [proposal_from_record(r) for r in records]

    async def withdrawn_proposals(self, limit: int) -> list[Proposal]:
        records = await self._run(
            lambda conn: queries.fetch(conn, "proposals_withdrawn_lately", limit=limit)
        )
        return [proposal_from_record(r) for r in records]

    async def approve_proposal(
        self, proposal_id: str, approved_by: str, actor: str, note: str | None
    ) -> Operation | None:
        """The operation created from the pending, unexpired proposal; None if it was not.
        IdempotencyKeyInUse if an operation already holds its id or its key (the statement
        then changed nothing)."""
        return await self._one(
            "proposal_approve",
            proposal_id=proposal_id,
            approved_by=approved_by,
            actor=actor,
            note=note,
        )

    async def decline_proposal(
        self, proposal_id: str, declined_by: str, actor: str, note: str | None
    ) -> Proposal | None:
        return await self._proposal(
            "proposal_decline",
            proposal_id=proposal_id,
            declined_by=declined_by,
            actor=actor,
            note=note,
        )

    async def withdraw_proposal(
        self, proposal_id: str, tenant: str, agent_id: str, via: str
    ) -> Proposal | None:
        """The proposal withdrawn by its agent; None if it is not that agent's or not pending
        (``via``: the front end, on its event)."""
        return await self._proposal(
            "proposal_withdraw", proposal_id=proposal_id, tenant=tenant, agent_id=agent_id, via=via
        )

    async def record_proposal_refusal(
        self, proposal_id: str, actor: str, code: str, detail: str
    ) -> None:
        await self._run(
            lambda conn: queries.execute(
                conn,
                "proposal_refusal",
                proposal_id=proposal_id,
                actor=actor,
                code=code,
                detail=detail[:2000],
            )
        )

    async def proposal_events(self, proposal_id: str) -> list[dict[str, Any]]:
        records = await self._run(
            lambda conn: queries.fetch(conn, "proposal_events", proposal_id=proposal_id)
        )
        return [
            {**dict(r), "at": r["at"].isoformat(), "detail": json.loads(r["detail"])}
            for r in records
        ]

    async def replication_facts(self) -> ReplicationFacts:
        """Whether commits here are replicated before they are acknowledged
        (proxy/store/replication.py judges them); on a primary, witnessed for a promotion."""
        return await self._run(_witnessed_facts)

    async def commit_heartbeat(self, timeout_seconds: float) -> None:
        """Commit a transaction as a claim commits (queries.sql ``commit_heartbeat``); raises
        StoreUnavailable if it is not acknowledged within ``timeout_seconds`` (a synchronous
        standby missing: the claims' commits would hang as long)."""
        await self._run(
            lambda conn: queries.fetchval(conn, "commit_heartbeat", timeout=timeout_seconds)
        )

    async def readiness(
        self, *, accept_async: bool, commit_timeout_seconds: float, budget_seconds: float
    ) -> Verdict:
        """Whether a claim's commit survives a failover here (proxy/store/replication.py), once
        a heartbeat commit has been acknowledged, checked on readiness's own connection
        (proxy/store/readiness.py) within ``budget_seconds`` in all. StoreUnavailable if the
        database is a standby, the commit was not acknowledged within
        ``commit_timeout_seconds`` (no synchronous standby to acknowledge it: every claim
        would hang), or the whole check did not end within the budget."""

        async def check(conn: asyncpg.Connection) -> Verdict:
            if await queries.fetchval(conn, "ping"):
                raise StoreUnavailable(
                    "the database is a standby or read-only; opgate writes only to the primary"
                )
            row = await queries.fetchrow(conn, "replication_state")
            assert row is not None  # one row always
            verdict = judge(
                facts_from_row(
                    row["in_recovery"],
                    row["standby_names"],
                    row["synchronous_commit"],
                    row["standbys"],
                ),
                accept_async=accept_async,
            )
            timeout = min(commit_timeout_seconds, budget_seconds)
            try:
                await queries.fetchval(conn, "commit_heartbeat", timeout=timeout)
            except TimeoutError as exc:  # the statement's own timeout, not the budget's
                raise StoreUnavailable(
                    f"a commit was not acknowledged within {timeout:g} s ({verdict.note})"
                ) from exc
            return verdict

        try:
            return self._judged(await self._readiness.run(check, budget_seconds))
        except StoreUnavailable:
            raise
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"the database did not answer within readiness's {budget_seconds:g} s"
            ) from exc
        except Exception as exc:
            if is_unavailable(exc, connecting=True):
                raise StoreUnavailable(str(exc) or type(exc).__name__) from exc
            raise

    async def judge_replication(self, *, accept_async: bool, budget_seconds: float) -> Verdict:
        """The replication judged now (proxy/store/replication.py), on readiness's connection
        within ``budget_seconds``: claims are refused while the verdict says so, taken again
        once it no longer does. StoreUnavailable if the database did not answer (the verdict
        before stands)."""
        try:
            read = await self._readiness.run(_witnessed_facts, budget_seconds)
        except TimeoutError as exc:
            raise StoreUnavailable(f"no answer within {budget_seconds:g} s") from exc
        except Exception as exc:
            if is_unavailable(exc, connecting=True):
                raise StoreUnavailable(str(exc) or type(exc).__name__) from exc
            raise
        return self._judged(judge(read, accept_async=accept_async))

    def _judged(self, verdict: Verdict) -> Verdict:
        self._claims_refused = verdict.note if verdict.refuses_claims else None
        return verdict

    def _refuse_while_not_durable(self) -> None:
        """StoreUnavailable (nothing sent) while replication is judged not durable enough to
        claim (proxy/store/replication.py): before the claim, so none is made."""
        refused = self._claims_refused
        if refused is not None:
            raise StoreUnavailable(f"claims are refused: {refused}")

    async def ping(self) -> None:
        """Raises StoreUnavailable unless the database answers as a writable primary. A
        connection to a standby is dropped, so that the next one is made anew (to the new
        primary, when the DSN names it)."""

        async def primary(conn: asyncpg.Connection) -> bool:
            if await queries.fetchval(conn, "ping"):
                conn.terminate()
                return False
            return True

        if not await self._run(primary):
            raise StoreUnavailable(
                "the database is a standby or read-only; opgate writes only to the primary"
            )


_OPERATION_FIELDS = tuple(f.name for f in fields(Operation))
_new_operation = object.__new__


# Where an Operation keeps the JSON texts its path_params and params were decoded from (not a
# field: no comparison, copy or API sees it).
_DECODED_FROM = "_decoded_from"


def operation_from_record(record: asyncpg.Record, loaded: Operation | None = None) -> Operation:
    """The row's columns named as ``Operation``'s fields (other columns are not the checks'
    business), built without the frozen dataclass's ``__init__``: forty ``object.__setattr__``
    calls were half of this conversion's cost, which runs on each of a request's store calls.
    The same fields and values as ``Operation(**...)`` (tests/store/test_store.py).

    ``loaded``: the same row as read earlier by the same request (the claim's row after the
    load's): where its JSON texts are the very texts of ``record``, its decoded path_params and
    params are taken instead of decoding them again (one decode per request)."""
    op = _new_operation(Operation)
    values = vars(op)
    for name in _OPERATION_FIELDS:
        values[name] = record[name]
    texts = (values["path_params"], values["params"])
    if loaded is not None and vars(loaded).get(_DECODED_FROM) == texts:
        values["path_params"], values["params"] = loaded.path_params, loaded.params
    else:
        values["path_params"], values["params"] = json.loads(texts[0]), json.loads(texts[1])
    values[_DECODED_FROM] = texts
    values["status"] = Status(values["status"])
    return op


def proposal_from_record(record: asyncpg.Record) -> Proposal:
    values = {name: record[name] for name in _PROPOSAL_FIELDS}
    values["path_params"] = json.loads(values["path_params"])
    values["params"] = json.loads(values["params"])
    return Proposal(**values)


_APPROVAL_FIELDS = tuple(f.name for f in fields(Approval))
_NEW_OPERATION_FIELDS = tuple(f.name for f in fields(NewOperation))
_PROPOSAL_FIELDS = tuple(f.name for f in fields(Proposal))


def _values(approval: Approval, names: Sequence[str]) -> dict[str, Any]:
    """The named fields of ``approval`` as a statement's parameters (each dict a jsonb)."""
    values = {name: getattr(approval, name) for name in names}
    return {name: _jsonb(v) if isinstance(v, dict) else v for name, v in values.items()}


def operation_values(new: NewOperation) -> dict[str, Any]:
    """queries.sql ``create_operation``'s parameters but the actor: the approval as written."""
    return _values(new, _NEW_OPERATION_FIELDS)


def _jsonb(value: Any) -> str:
    """A jsonb parameter. Never a non-finite number: ``json.dumps`` would write the bare word
    ``NaN`` or ``Infinity``, which is not JSON (and not what was validated)."""
    return json.dumps(value, allow_nan=False)
