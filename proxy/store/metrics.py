"""What the metrics scrape reads from PostgreSQL (queries.sql ``metrics_operations``), run on
the store's connections (``Store.run``: a store that cannot be reached or used is
``StoreUnavailable``)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.store import queries
from proxy.store.store import Store


@dataclass(frozen=True)
class OperationCounts:
    """Unsettled operations by status, those dispatched too long ago, open escalations, and
    proposals waiting for a human (unexpired)."""

    created: int
    dispatched: int
    dispatched_old: int
    escalated: int
    proposals_pending: int


async def operation_counts(store: Store, dispatched_after_seconds: float) -> OperationCounts:
    """The scrape-time counts; ``dispatched_old``: dispatched more than
    ``dispatched_after_seconds`` ago and still unsettled."""
    row = await store.run(
        lambda conn: queries.fetchrow(
            conn, "metrics_operations", dispatched_after_seconds=dispatched_after_seconds
        )
    )
    assert row is not None  # an aggregate: one row always
    return OperationCounts(
        created=row["created"],
        dispatched=row["dispatched"],
        dispatched_old=row["dispatched_old"],
        escalated=row["escalated"],
        proposals_pending=row["proposals_pending"],
    )
