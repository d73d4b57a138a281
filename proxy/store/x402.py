"""The one live payment of an operation (queries.sql ``store_payment``, ``stored_payment``,
``record_payment_settlement``, ``release_unpaid_payment``; migrations x402, x402_released): the
one opgate signed, or the agent's own bound by its nonce; kept before it leaves, read back by
every later attempt, its settlement kept once, and released only when proven unpaid."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.store import queries
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


class X402Payments:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def stored(self, operation_id: str) -> StoredPayment | None:
        record = await self._store._run(
            lambda conn: queries.fetchrow(conn, "stored_payment", operation_id=operation_id)
        )
        if record is None:
            return None
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

    async def keep(self, operation_id: str, payment: SignedPayment) -> StoredPayment | None:
        """The payment to send: ``payment`` if it is now the operation's, else the one kept
        before it; None if the operation is not dispatched and has none."""
        header = await self._store._run(
            lambda conn: queries.fetchval(
                conn,
                "store_payment",
                operation_id=operation_id,
                header=payment.header,
                payload_sha256=payment.payload_sha256,
                nonce=payment.nonce,
                payer=payment.payer,
                pay_to=payment.pay_to,
                amount=str(payment.amount),
                asset=payment.asset,
                network=payment.network,
                valid_before=payment.valid_before,
                payer_kind=payment.payer_kind,
            )
        )
        if header is not None:
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
        return await self.stored(operation_id)

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
