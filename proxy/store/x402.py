"""The one live payment of an operation (queries.sql ``store_payment``, ``stored_payment``,
``record_payment_settlement``, ``release_unpaid_payment``; migrations x402, x402_released): the
one opgate signed, or the agent's own bound by its nonce; kept before it leaves, read back by
every later attempt, its settlement kept once, and released only when proven unpaid. Under
payment limits (``keep_within_limits``, ``payment_limit_spent``; migration x402_limits), kept
only if the limits' sums, read under their locks in the same transaction, admit it. An operation
made under an AP2 open mandate keeps its payment only if the mandate's budget, recorded when its
first closed mandate was (``open_mandate_cap``, migration 0032), admits what every payment under
that mandate has paid (``open_mandate_paid``), summed under the mandate's own lock."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from proxy.store import locks, queries
from proxy.store.locks import LockKey, LockKind
from proxy.store.store import Store


@dataclass(frozen=True, slots=True)
class SignedPayment:
    """A payment to keep for an operation: its header and what it pays, for evidence."""

    header: str
    payload_sha256: str
    nonce: str
    payer: str
    pay_to: str
    amount: int
    asset: str
    network: str
    valid_before: int
    payer_kind: str = "opgate"  # or "agent": the agent's own PAYMENT-SIGNATURE


@dataclass(frozen=True, slots=True)
class StoredPayment:
    """The payment kept for an operation, and the settlement read for it (None: not yet)."""

    header: str
    payload_sha256: str
    nonce: str
    settlement: dict[str, Any] | None
    payer: str
    pay_to: str
    amount: int
    asset: str
    network: str
    valid_before: int
    payer_kind: str

    def evidence(self) -> dict[str, Any]:
        """What names this payment in an audit record, an escalation or a bundle."""
        settlement = self.settlement or {}
        return {
            "payment_sha256": self.payload_sha256,
            "nonce": self.nonce,
            "payer": self.payer,
            "pay_to": self.pay_to,
            "amount": str(self.amount),
            "asset": self.asset,
            "network": self.network,
            "valid_before": self.valid_before,
            "paid_by": self.payer_kind,
            "settlement_transaction": settlement.get("transaction"),
        }


@dataclass(frozen=True, slots=True)
class PaymentLimitSum:
    """The kept payments one limit sums over (queries.sql ``payment_limit_spent``), and the advisory
    lock payments under it take turns on."""

    lock_name: str
    tenant: str
    agent_id: str | None  # None: every agent of the tenant
    network: str | None  # None with asset: any (a rate limit)
    asset: str | None  # lower case
    window_seconds: float


@dataclass(frozen=True, slots=True)
class OpenMandateCap:
    """An open mandate's budget as recorded (migration 0032): ``budget_max`` minor units of
    ``currency`` (None: the mandate has no ``payment.budget``), the identity its lock is named
    by, and every spelling of its digest an operation's approval may name."""

    identity: str
    spellings: tuple[str, ...]
    budget_max: int | None
    currency: str


@dataclass(frozen=True, slots=True)
class OpenMandatePaid:
    """What the payments under one open mandate have paid: (network, asset in lower case,
    atomic units) per network and asset, not released; and ``spent``, the amounts (minor units
    of its currency) of its other operations that spend (those approved with an amount:
    queries.sql ``mandate_open_use``; an x402 operation's approval has none, its payment
    counts)."""

    paid: tuple[tuple[str, str, int], ...]
    spent: int = 0


@dataclass(frozen=True, slots=True)
class LimitedKeep:
    """A payment kept under its limits' locks: what each limit's key had paid before it (the
    amounts' sum, the number of payments; empty when the operation had its payment already),
    whether ``admit`` let it in, and the payment to send (None: refused, or the operation is
    not dispatched)."""

    spent: list[tuple[int, int]]
    admitted: bool
    payment: StoredPayment | None
    mandate_paid: OpenMandatePaid | None = None  # summed under an open mandate's lock


def _stored_from(record: asyncpg.Record) -> StoredPayment:
    settlement = record["settlement"]
    return StoredPayment(
        record["header"],
        record["payload_sha256"],
        record["nonce"],
        json.loads(settlement) if isinstance(settlement, str) else settlement,
        record["payer"],
        record["pay_to"],
        int(record["amount"]),
        record["asset"],
        record["network"],
        record["valid_before"],
        record["payer_kind"],
    )


def _store_values(operation_id: str, payment: SignedPayment) -> dict[str, Any]:
    return {
        "operation_id": operation_id,
        "header": payment.header,
        "payload_sha256": payment.payload_sha256,
        "nonce": payment.nonce,
        "payer": payment.payer,
        "pay_to": payment.pay_to,
        "amount": str(payment.amount),
        "asset": payment.asset,
        "network": payment.network,
        "valid_before": payment.valid_before,
        "payer_kind": payment.payer_kind,
    }


def _kept(payment: SignedPayment, header: str) -> StoredPayment:
    return StoredPayment(
        header,
        payment.payload_sha256,
        payment.nonce,
        None,
        payment.payer,
        payment.pay_to,
        payment.amount,
        payment.asset,
        payment.network,
        payment.valid_before,
        payment.payer_kind,
    )


async def _limit_spent(conn: asyncpg.Connection, s: PaymentLimitSum) -> tuple[int, int]:
    """(amount, payments) of one limit's key in its window (queries.sql payment_limit_spent)."""
    row = await queries.fetchrow(
        conn,
        "payment_limit_spent",
        tenant=s.tenant,
        agent_id=s.agent_id,
        network=s.network,
        asset=s.asset,
        window_seconds=s.window_seconds,
    )
    assert row is not None  # an aggregate always answers
    return int(row["spent"]), int(row["payments"])


async def _open_mandate_paid(conn: asyncpg.Connection, cap: OpenMandateCap) -> OpenMandatePaid:
    digests = list(cap.spellings)
    rows = await queries.fetch(conn, "open_mandate_paid", open_digests=digests)
    use = await queries.fetchrow(conn, "mandate_open_use", open_digests=digests)
    assert use is not None  # an aggregate: always one row
    paid = tuple((r["network"], r["asset"], int(r["paid"])) for r in rows)
    return OpenMandatePaid(paid, int(use["spent"]))


class X402Payments:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def stored(self, operation_id: str) -> StoredPayment | None:
        record = await self._store._run(
            lambda conn: queries.fetchrow(conn, "stored_payment", operation_id=operation_id)
        )
        return None if record is None else _stored_from(record)

    async def keep(self, operation_id: str, payment: SignedPayment) -> StoredPayment | None:
        """The payment to send: ``payment`` if it is now the operation's, else the one kept
        before it; None if the operation is not dispatched and has none."""
        values = _store_values(operation_id, payment)
        header = await self._store._run(
            lambda conn: queries.fetchval(conn, "store_payment", **values)
        )
        if header is not None:
            return _kept(payment, header)
        return await self.stored(operation_id)

    async def keep_within_limits(
        self,
        operation_id: str,
        payment: SignedPayment,
        sums: Sequence[PaymentLimitSum],
        admit: Callable[[list[tuple[int, int]]], bool],
        *,
        mandate: OpenMandateCap | None = None,
        admit_mandate: Callable[[OpenMandatePaid], bool] | None = None,
    ) -> LimitedKeep:
        """``keep`` in one transaction that first takes each limit's lock (proxy/store/locks.py,
        in key order: two payments never wait on each other crosswise), then, unless the
        operation has its payment already (sent again, it counts nothing new), sums what each
        limit's key has paid and keeps ``payment`` only if ``admit`` (pure: the gate's
        decision) accepts those sums. Payments under one limit, from any number of processes,
        take turns: together they can never pay more than ``admit`` allows.

        ``mandate``: the operation was made under that open mandate; its lock is taken with the
        limits' (one sorted order, as its closed mandates' creation takes it), what every
        payment under it has paid is summed, and ``admit_mandate`` (pure) must accept that too."""
        values = _store_values(operation_id, payment)
        keys = [LockKey(LockKind.X402_LIMIT, s.lock_name) for s in sums]
        if mandate is not None:
            keys.append(LockKey(LockKind.OPEN_MANDATE, mandate.identity))

        async def keep_under_locks(conn: asyncpg.Connection) -> LimitedKeep:
            async with conn.transaction():
                await locks.lock(conn, keys)
                record = await queries.fetchrow(conn, "stored_payment", operation_id=operation_id)
                if record is not None:
                    return LimitedKeep([], True, _stored_from(record))
                spent = [await _limit_spent(conn, s) for s in sums]
                if not admit(spent):
                    return LimitedKeep(spent, False, None)
                paid = None
                if mandate is not None:
                    paid = await _open_mandate_paid(conn, mandate)
                    if admit_mandate is None or not admit_mandate(paid):
                        return LimitedKeep(spent, False, None, paid)
                header = await queries.fetchval(conn, "store_payment", **values)
                if header is not None:
                    return LimitedKeep(spent, True, _kept(payment, header), paid)
                # another kept one first (a keep under no lock: a policy reloaded), or the
                # operation is not dispatched
                record = await queries.fetchrow(conn, "stored_payment", operation_id=operation_id)
                kept = None if record is None else _stored_from(record)
                return LimitedKeep(spent, True, kept, paid)

        return await self._store._run(keep_under_locks)

    async def open_mandate_cap(self, open_digest: str) -> OpenMandateCap | None:
        """The budget recorded for the open mandate ``open_digest`` (any spelling); None: none
        was (a mandate whose closed mandates were all made before it was recorded)."""
        row = await self._store._run(
            lambda conn: queries.fetchrow(conn, "open_mandate_cap", open_digest=open_digest)
        )
        if row is None:
            return None
        budget = row["budget_max"]
        return OpenMandateCap(
            row["identity"],
            tuple(row["spellings"]),
            None if budget is None else int(budget),
            row["currency"],
        )

    async def limit_spent(self, sums: Sequence[PaymentLimitSum]) -> list[tuple[int, int]]:
        """What each limit's key has paid now, without its lock: advisory (a read); only
        ``keep_within_limits`` decides."""

        async def read(conn: asyncpg.Connection) -> list[tuple[int, int]]:
            return [await _limit_spent(conn, s) for s in sums]

        return await self._store._run(read)

    async def limit_spent_by_key(
        self, network: str | None, asset: str | None, window_seconds: float, *, per_agent: bool
    ) -> list[tuple[str, str | None, int, int]]:
        """(tenant, agent_id, amount, payments) of every key that paid in the window (advisory)."""
        records = await self._store._run(
            lambda conn: queries.fetch(
                conn,
                "payment_limit_spent_by_key",
                network=network,
                asset=asset,
                window_seconds=window_seconds,
                per_agent=per_agent,
            )
        )
        return [(r["tenant"], r["agent_id"], int(r["spent"]), int(r["payments"])) for r in records]

    async def record_settlement(self, operation_id: str, settlement: dict[str, Any]) -> bool:
        """Keep the settlement read for the operation's payment (False: one was kept already)."""
        written = await self._store._run(
            lambda conn: queries.fetchval(
                conn,
                "record_payment_settlement",
                operation_id=operation_id,
                settlement=json.dumps(settlement),
            )
        )
        return written is not None

    async def release_unpaid(
        self,
        operation_id: str,
        owner: str,
        nonce: str,
        evidence: dict[str, Any],
        *,
        expected_attempts: int,
    ) -> bool:
        """Release the operation's payment under ``nonce``, proven unpaid, by the holder of its
        reconciliation lease: its attempt ends as never sent (False: that no longer holds)."""
        released = await self._store._run(
            lambda conn: queries.fetchval(
                conn,
                "release_unpaid_payment",
                operation_id=operation_id,
                owner=owner,
                nonce=nonce,
                evidence=json.dumps(evidence),
                expected_attempts=expected_attempts,
            )
        )
        return released is not None
