"""An approved operation to insert in store tests and the store's benchmarks: a 5.00 USD refund
of ``ch_1`` at the ``fault`` provider, expiring in five minutes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from proxy.store.store import NewOperation

__all__ = ["new_operation"]


def new_operation(
    operation_id: str, key: str | None = None, *, tenant: str = "t1", approved_by: str = "a"
) -> NewOperation:
    """The operation ``operation_id`` of ``tenant``, its key ``key`` or ``key-<id>``."""
    return NewOperation(
        operation_id=operation_id,
        tenant=tenant,
        agent_id=None,
        provider="fault",
        action="refund.create",
        method="POST",
        path="/v1/refunds",
        path_params={},
        amount=500,
        currency="usd",
        params={"charge": "ch_1"},
        idempotency_key=key or f"key-{operation_id}",
        approval_ref="r",
        approved_by=approved_by,
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
    )
