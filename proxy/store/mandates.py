"""The statements of operations approved by signed mandates (queries.sql ``mandate*``,
migrations 0019, 0021 and 0032): revoked mandates; the nonces opgate issues for key bindings; and
an operation created in one transaction that consumes its key binding's nonce and, under an
open mandate, counts the mandate's uses and budget under its advisory lock first, so that any
number of processes together never use a nonce twice nor exceed an open mandate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import asyncpg

from proxy.store import queries
from proxy.store.locks import LockKey, LockKind, lock_count_insert
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
    # what the x402 payments kept under it paid: (network, asset, atomic units)
    paid: tuple[tuple[str, str, int], ...] = ()


class NonceRefused(StrEnum):
    """Why a key binding's nonce consumed nothing (nothing was created)."""

    UNKNOWN = "unknown"  # never issued to this agent of this tenant, or long gone
    EXPIRED = "expired"
    USED = "used"  # it answered another mandate's presentation


@dataclass(frozen=True, slots=True)
class NonceUse:
    """The nonce a presentation's key binding answered, and who presents it."""

    nonce: str
    tenant: str
    agent_id: str


@dataclass(frozen=True, slots=True)
class OpenMandateLimits:
    """An open mandate, as its uses are counted under its lock and judged."""

    # the open mandate's digests: its identity first (its lock's name), then any other under
    # which its earlier uses were counted; every one of them counts
    digests: tuple[str, ...]
    # whether it allows one more use (pure; the mandate's own constraints: proxy/mandates/ap2.py
    # OpenMandateUse.allows), given its uses so far, what they spent, and the new use's amount
    allows: Callable[[int, int, int | None], bool]
    # its payment.budget (minor units of currency; None: none), recorded with its first closed
    # mandate so that payments kept under it are summed against it too (proxy/store/x402.py)
    budget_max: int | None = None
    currency: str = ""
    # the x402 payments kept under it in minor units of its currency (None: cannot be counted,
    # refuse): they count against its budget with its operations' amounts
    paid_in_minor: Callable[[tuple[tuple[str, str, int], ...]], int | None] | None = None


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

    async def issue_nonce(
        self, nonce: str, tenant: str, agent_id: str, ttl_seconds: int
    ) -> datetime:
        """Store ``nonce`` as issued to the agent; when it expires."""
        expires_at: datetime = await self._store.run(
            lambda c: queries.fetchval(
                c,
                "mandate_nonce_issue",
                nonce=nonce,
                tenant=tenant,
                agent_id=agent_id,
                ttl_seconds=ttl_seconds,
            )
        )
        return expires_at

    async def create(
        self,
        new: NewOperation,
        actor: str,
        *,
        nonce: NonceUse | None,
        limits: OpenMandateLimits | None,
    ) -> Operation | OpenMandateUsed | NonceRefused | None:
        """``new`` created, in one transaction, if its ``nonce`` is the agent's, unexpired and
        unused (or used by ``new`` itself: the same presentation again) and the open mandate of
        ``limits`` still allows one more use of ``new.amount``. None if ``new.operation_id``
        exists (a replay: the caller compares); else why not. Raises as ``Store.create``. The
        nonce is consumed and the open mandate's use counted under its lock, before the
        insert, in one transaction (proxy/store/locks.py ``lock_count_insert``)."""

        async def count(conn: asyncpg.Connection) -> OpenMandateUsed | None:
            if nonce is not None:
                await _use_nonce(conn, nonce, new.operation_id)
            if limits is None:
                return None
            return await _open_mandate_use(conn, limits, new)

        def admit(used: OpenMandateUsed | None) -> bool:
            if used is None or limits is None:  # no open mandate, or a replay
                return True
            spent = used.spent
            if used.paid:
                worth = None if limits.paid_in_minor is None else limits.paid_in_minor(used.paid)
                if worth is None:  # fail closed: a payment that cannot be counted
                    return False
                spent += worth
            return limits.allows(used.occurrences, spent, new.amount)

        async def create(
            conn: asyncpg.Connection,
        ) -> Operation | OpenMandateUsed | NonceRefused | None:
            keys = [] if limits is None else [LockKey(LockKind.OPEN_MANDATE, limits.digests[0])]
            try:
                made = await lock_count_insert(
                    conn,
                    keys,
                    count,
                    admit,
                    lambda conn: queries.fetchrow(
                        conn, "create_operation", **operation_values(new), actor=actor
                    ),
                )
            except _Refused as refused:
                return refused.why  # rolled back: nothing created, the nonce not consumed
            if not made.admitted:
                assert made.counted is not None  # admit accepts no count at all
                return made.counted  # rolled back too
            record = made.inserted
            return None if record is None else operation_from_record(record)

        return await self._store.run(create)


class _Refused(Exception):
    """Raised inside the creating transaction so that it rolls back; carries why."""

    def __init__(self, why: NonceRefused) -> None:
        super().__init__(str(why))
        self.why = why


async def _use_nonce(conn: asyncpg.Connection, use: NonceUse, operation_id: str) -> None:
    """The nonce consumed for ``operation_id``, or ``_Refused`` saying why not."""
    agent = {"nonce": use.nonce, "tenant": use.tenant, "agent_id": use.agent_id}
    if await queries.fetchrow(conn, "mandate_nonce_use", operation_id=operation_id, **agent):
        return
    state = await queries.fetchrow(conn, "mandate_nonce_state", **agent)
    if state is None:
        raise _Refused(NonceRefused.UNKNOWN)
    raise _Refused(NonceRefused.EXPIRED if state["expired"] else NonceRefused.USED)


async def _open_mandate_use(
    conn: asyncpg.Connection, limits: OpenMandateLimits, new: NewOperation
) -> OpenMandateUsed | None:
    """The open mandate's use so far; None if ``new`` exists (a replay of this closed mandate,
    its operation unchanged: nothing more to count). Run under the open mandate's lock, so
    that the count sees every creation before it."""
    if await queries.fetchrow(conn, "load_operation", operation_id=new.operation_id):
        return None
    for spelling in limits.digests:
        await queries.execute(
            conn,
            "record_open_mandate_cap",
            open_digest=spelling,
            identity=limits.digests[0],
            spellings=list(limits.digests),
            budget_max=None if limits.budget_max is None else str(limits.budget_max),
            currency=limits.currency,
        )
    use = await queries.fetchrow(conn, "mandate_open_use", open_digests=list(limits.digests))
    assert use is not None  # an aggregate: always one row
    rows = await queries.fetch(conn, "open_mandate_paid", open_digests=list(limits.digests))
    paid = tuple((r["network"], r["asset"], int(r["paid"])) for r in rows)
    return OpenMandateUsed(int(use["occurrences"]), int(use["spent"]), paid)
