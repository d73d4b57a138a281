"""The statements of operations approved by signed mandates (queries.sql ``mandate*``,
migration 0019): revoked mandates, and an operation created under an open mandate only while
the mandate's uses and budget allow, counted and inserted in one transaction under the open
mandate's advisory lock, so that any number of processes together never exceed them."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from proxy.errors import AlreadySuperseded, IdempotencyKeyInUse
from proxy.store import queries
from proxy.store.operation import Operation
from proxy.store.store import (
    NewOperation,
    Store,
    operation_from_record,
    operation_values,
)


@dataclass(frozen=True, slots=True)
class OpenMandateUsed:
    """An open mandate's use so far, when it allows no more (nothing was created)."""

    occurrences: int
    spent: int


@dataclass(frozen=True, slots=True)
class OpenMandateLimits:
    digest: str
    max_occurrences: int
    budget_max: int | None  # minor units, in the closed mandate's currency


class MandateStore:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def revoked(self, digests: list[str]) -> set[str]:
        """Which of ``digests`` are revoked."""
        rows = await self._store.run(
            lambda c: queries.fetch(c, "mandates_revoked", digests=digests)
        )
        return {r["digest"] for r in rows}

    async def revoke(self, digest: str, actor: str, reason: str) -> list[str]:
        """Revoke the mandate ``digest``; the ids of the operations it approved."""

        async def revoke(conn: asyncpg.Connection) -> list[str]:
            async with conn.transaction():
                await queries.execute(
                    conn, "mandate_revoke", digest=digest, revoked_by=actor, reason=reason
                )
                rows = await queries.fetch(conn, "mandate_operations", digest=digest)
            return [r["operation_id"] for r in rows]

        return await self._store.run(revoke)

    async def create_within(
        self, new: NewOperation, actor: str, limits: OpenMandateLimits
    ) -> Operation | OpenMandateUsed | None:
        """``new`` created if the open mandate still allows one more use of ``new.amount``;
        None if ``new.operation_id`` exists (a replay: the caller compares); else the use so
        far. Raises as ``Store.create``."""

        async def create(conn: asyncpg.Connection) -> Operation | OpenMandateUsed | None:
            async with conn.transaction():
                await queries.execute(conn, "budget_lock", lock_name=f"ap2-open:{limits.digest}")
                if await queries.fetchrow(conn, "load_operation", operation_id=new.operation_id):
                    return None  # a replay of this closed mandate: its operation, unchanged
                use = await queries.fetchrow(conn, "mandate_open_use", open_digest=limits.digest)
                assert use is not None  # an aggregate: always one row
                occurrences, spent = int(use["occurrences"]), int(use["spent"])
                over_budget = limits.budget_max is not None and (
                    spent + (new.amount or 0) > limits.budget_max
                )
                if occurrences >= limits.max_occurrences or over_budget:
                    return OpenMandateUsed(occurrences, spent)
                record = await queries.fetchrow(
                    conn, "create_operation", **operation_values(new), actor=actor
                )
            return None if record is None else operation_from_record(record)

        try:
            return await self._store.run(create)
        except asyncpg.exceptions.UniqueViolationError as exc:
            if exc.constraint_name == "operations_provider_key_unique":
                raise IdempotencyKeyInUse(new.idempotency_key) from exc
            raise AlreadySuperseded(str(new.supersedes)) from exc
