"""The transition module and the claim statement agree: every row state and claim rule is driven
through ``transitions.transition`` and through queries.sql ``claim_operation`` on a real
PostgreSQL. Where the module claims without a lookup, the statement claims as the gate calls it;
where it claims after a lookup, the statement claims for the holder of the lookup's lease; where
it refuses, the statement claims nothing; and where a concurrent writer moved the row after the
read, the statement, guarded by the version read (``commit_guard``), claims nothing either."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import asyncpg
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.gate.decision import ClaimKind
from proxy.gate.transitions import (
    CLAIMED_WITHOUT_LOOKUP,
    ClaimRule,
    Kind,
    commit_guard,
    transition,
)
from proxy.store import queries
from proxy.store.operation import LastOutcome, Operation, Status
from proxy.store.store import Claim, operation_from_record, operation_values
from tests.support.operations import new_operation

# the row was created an hour ago: a provider keeping keys for a day still deduplicates its
# key, one keeping them a minute no longer does (far from either boundary, so the database's
# clock and the row's read agree)
WINDOWS = {"none": None, "kept": 86400.0, "lapsed": 60.0}
LEASES = ("none", "lapsed", "live")


@dataclass(frozen=True)
class RowState:
    status: Status
    attempts: int
    last_outcome: str | None
    revoked: bool
    expired: bool
    escalated: bool
    in_doubt: bool  # lookup_before_send: a timeline switch put it in doubt
    lease: str  # the attempt's lease: none, lapsed, live
    reconcile_lease: str  # another's lookup lease: none, lapsed, live


# an ended approval, an escalation or a failover's doubt each hides the rest of the row: one time
# in four, so that the states beneath them are reached too
_RARELY = st.sampled_from([False, False, False, True])
ROW_STATES = st.builds(
    RowState,
    status=st.sampled_from(list(Status)),
    attempts=st.integers(0, 2),
    last_outcome=st.sampled_from([None, LastOutcome.NOT_SENT, LastOutcome.UNKNOWN_TIMEOUT]),
    revoked=_RARELY,
    expired=_RARELY,
    escalated=_RARELY,
    in_doubt=_RARELY,
    lease=st.sampled_from(LEASES),
    reconcile_lease=st.sampled_from(LEASES),
)
RULES = st.builds(
    lambda window, lookups: ClaimRule("fault", WINDOWS[window], lookups=lookups),
    st.sampled_from(sorted(WINDOWS)),
    st.booleans(),
)


def _row_state(status: Status = Status.DISPATCHED, **changes: Any) -> RowState:
    """A row with its approval standing and nothing in flight, as ``changes`` say otherwise."""
    values: dict[str, Any] = {
        "status": status,
        "attempts": 0 if status is Status.CREATED else 1,
        "last_outcome": None if status is Status.CREATED else LastOutcome.UNKNOWN_TIMEOUT,
        "revoked": False,
        "expired": False,
        "escalated": False,
        "in_doubt": False,
        "lease": "none" if status is Status.CREATED else "lapsed",
        "reconcile_lease": "none",
    }
    return RowState(**(values | changes))


def _rule(window: str, *, lookups: bool) -> ClaimRule:
    return ClaimRule("fault", WINDOWS[window], lookups=lookups)


# one row of each transition, so that every one is driven whatever hypothesis draws; the first is
# issue 39's known difference: outcome unknown, a provider that does not deduplicate, a rule
# that declares lookups (the gate asks and re-sends; recovery says reconcile)
EACH_TRANSITION: dict[Kind, tuple[RowState, ClaimRule]] = {
    Kind.ASK_BEFORE_RESEND: (_row_state(), _rule("none", lookups=True)),
    Kind.CONFIRMED: (_row_state(Status.CONFIRMED), _rule("none", lookups=False)),
    Kind.FAILED: (_row_state(Status.FAILED), _rule("none", lookups=False)),
    Kind.REVOKED: (_row_state(Status.CREATED, revoked=True), _rule("none", lookups=False)),
    Kind.EXPIRED: (_row_state(Status.CREATED, expired=True), _rule("none", lookups=False)),
    Kind.ESCALATED: (_row_state(escalated=True), _rule("kept", lookups=True)),
    Kind.FIRST: (_row_state(Status.CREATED), _rule("none", lookups=False)),
    Kind.ATTEMPT_IN_FLIGHT: (_row_state(lease="live"), _rule("kept", lookups=True)),
    Kind.RECONCILING: (_row_state(reconcile_lease="live"), _rule("kept", lookups=True)),
    Kind.IN_DOUBT: (_row_state(Status.CREATED, in_doubt=True), _rule("none", lookups=True)),
    Kind.IN_DOUBT_UNVERIFIABLE: (
        _row_state(Status.CREATED, in_doubt=True),
        _rule("kept", lookups=False),
    ),
    Kind.RESEND_NOT_SENT: (
        _row_state(last_outcome=LastOutcome.NOT_SENT),
        _rule("none", lookups=False),
    ),
    Kind.ASK_THEN_RESEND: (_row_state(), _rule("kept", lookups=True)),
    Kind.RESEND_DEDUPLICATED: (_row_state(), _rule("kept", lookups=False)),
    Kind.RECONCILE_REQUIRED: (_row_state(), _rule("lapsed", lookups=False)),
}

_SET_STATE = """
UPDATE operations
   SET status = $2, attempts = $3, last_outcome = $4,
       revoked_at = CASE WHEN $5 THEN clock_timestamp() - interval '1 minute' END,
       revoked_reason = CASE WHEN $5 THEN 'no' END,
       expires_at = clock_timestamp()
                    + CASE WHEN $6 THEN interval '-1 hour' ELSE interval '1 hour' END,
       escalated_at = CASE WHEN $7 THEN clock_timestamp() - interval '1 minute' END,
       escalation_reason = CASE WHEN $7 THEN 'unknown' END,
       lookup_before_send = CASE WHEN $8 THEN clock_timestamp() - interval '1 minute' END,
       lease_owner = CASE WHEN $9 <> 'none' THEN 'another' END,
       lease_until = CASE $9 WHEN 'live' THEN clock_timestamp() + interval '1 hour'
                             WHEN 'lapsed' THEN clock_timestamp() - interval '1 hour' END,
       reconcile_owner = CASE WHEN $10 <> 'none' THEN 'another-lookup' END,
       reconcile_lease_until = CASE $10 WHEN 'live' THEN clock_timestamp() + interval '1 hour'
                                        WHEN 'lapsed' THEN clock_timestamp() - interval '1 hour'
                               END,
       created_at = clock_timestamp() - interval '1 hour',
       settled_at = CASE WHEN $2 IN ('confirmed', 'failed') THEN clock_timestamp() END
 WHERE operation_id = $1
RETURNING *, clock_timestamp() AS read_at
"""


async def _row(conn: asyncpg.Connection, operation_id: str, state: RowState) -> Operation:
    """A new operation, put in ``state`` as read from the primary."""
    values: dict[str, Any] = operation_values(new_operation(operation_id))
    assert await queries.fetchrow(conn, "create_operation", **values, actor="test") is not None
    record = await conn.fetchrow(
        _SET_STATE,
        operation_id,
        state.status.value,
        state.attempts,
        state.last_outcome,
        state.revoked,
        state.expired,
        state.escalated,
        state.in_doubt,
        state.lease,
        state.reconcile_lease,
    )
    return operation_from_record(record)


async def _claims(
    conn: asyncpg.Connection,
    op: Operation,
    rule: ClaimRule,
    *,
    after_lookup: bool,
    moved: bool = False,
) -> bool:
    """Whether claim_operation claims ``op`` as the gate calls it (guarded by the row's version
    as read and the decision's deadline; after its own lookup, under that lookup's lease, on
    the row as the lease left it), rolled back so that the row stays as it was. ``moved``: a
    concurrent writer changed the row (nothing but its version) after the read."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        looker = None
        guard = commit_guard(op, 3600.0)
        if after_lookup:
            looker = "the-gate-lookup"
            leased = await conn.fetchrow(
                "UPDATE operations SET reconcile_owner = $2,"
                " reconcile_lease_until = clock_timestamp() + interval '1 hour',"
                " updated_at = clock_timestamp()"
                " WHERE operation_id = $1 RETURNING *, clock_timestamp() AS read_at",
                op.operation_id,
                looker,
            )
            lease = operation_from_record(leased)
            guard = commit_guard(lease, 3600.0, lease.reconcile_lease_until)
        if moved:
            await conn.execute(
                "UPDATE operations SET updated_at = clock_timestamp() WHERE operation_id = $1",
                op.operation_id,
            )
        claim = Claim(
            op.operation_id,
            owner="the-gate",
            lease_seconds=30,
            expected_attempts=op.attempts,
            dedup_window_seconds=rule.dedup_window_seconds,
            after_lookup_by=looker,
            read_version=guard.read_version,
            decided_before=guard.decided_before,
        )
        return await queries.fetchrow(conn, "claim_operation", **claim.arguments()) is not None
    finally:
        await transaction.rollback()


async def _agree(
    conn: asyncpg.Connection, operation_id: str, state: RowState, rule: ClaimRule
) -> Kind:
    """The module's transition of the row, once checked against the statement."""
    op = await _row(conn, operation_id, state)
    step = transition(op, rule)
    told = f"{state} under {rule}: the module says {step.kind}"
    claimed = await _claims(conn, op, rule, after_lookup=False)
    assert claimed == (step.kind in CLAIMED_WITHOUT_LOOKUP), f"{told}, the statement {claimed}"
    if step.claim is ClaimKind.RESEND_AFTER_LOOKUP:
        assert await _claims(conn, op, rule, after_lookup=True), f"{told}, after the lookup"
    # a decision on a row another writer moved since commits nothing, whatever it decided
    lookup = step.claim is ClaimKind.RESEND_AFTER_LOOKUP
    stale = await _claims(conn, op, rule, after_lookup=lookup, moved=True)
    assert not stale, f"{told}, and the statement claimed a row that moved since"
    return step.kind


def test_the_module_and_the_claim_statement_agree_on_every_state(database_url: str) -> None:
    """Every row state and claim rule: the module claims exactly where the statement does."""
    loop = asyncio.new_event_loop()
    conn: asyncpg.Connection = loop.run_until_complete(asyncpg.connect(database_url))
    numbers = itertools.count()

    def agree(state: RowState, rule: ClaimRule) -> Kind:
        operation_id = f"op_agree_{next(numbers)}"
        return loop.run_until_complete(_agree(conn, operation_id, state, rule))

    try:
        for kind, (state, rule) in EACH_TRANSITION.items():
            assert agree(state, rule) is kind, f"{state} under {rule} is not {kind}"

        @settings(max_examples=300, deadline=None, database=None)
        @given(state=ROW_STATES, rule=RULES)
        def agree_on(state: RowState, rule: ClaimRule) -> None:
            agree(state, rule)

        agree_on()
    finally:
        loop.run_until_complete(conn.close())
        loop.close()
    assert set(EACH_TRANSITION) == set(Kind)
