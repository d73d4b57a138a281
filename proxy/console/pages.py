"""What each console page shows, read from the store and the process: plain dicts for the
templates. The operation views are the operations API's (``recovery_views``: the row and its
``next_action``), so the console and the API never disagree."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from proxy.observe.auditlog.verify import unaccounted_runs, verify
from proxy.observe.observer import audit_key
from proxy.proposals.rules import proposal_view
from proxy.recovery.api import recovery_views
from proxy.runtime import Gateway
from proxy.store.console import ConsoleStore
from proxy.store.operation import STATUS_FILTERS as STATUS_FILTERS  # views.py reads it here
from proxy.store.operation import Operation

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
    return {
        "view": (await summaries(gw, [op]))[0],
        "events": events,
        "lookups": [e for e in events if e["event"] in LOOKUP_EVENTS],
        "requests": [r for r in records if r["kind"] == "request"],
        "transitions": [r for r in records if r["kind"] == "transition"],
        "notices": notices,
    }


async def pending_proposals(gw: Gateway) -> list[dict[str, Any]]:
    """Proposals waiting for a human, oldest first, each with the exact request an approval
    lets through (the proposal view the agent reads, so the two never differ)."""
    proposals = await gw.store.list_proposals(None, ["pending"], LIST_LIMIT)
    return [proposal_view(gw.policy, p, None) for p in proposals]


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
    state.summary = f"{report.records} records, {report.checkpoints} checkpoints ({signed})"
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
