"""An approved operation to insert in store tests and the store's benchmarks: a 5.00 USD refund
of ``ch_1`` at the ``fault`` provider, expiring in five minutes; and such a row as read back
(``operation``), for pure tests."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.store.operation import Operation, Status
from proxy.store.store import NewOperation

__all__ = ["NOW", "new_operation", "operation"]


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


NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def operation(**overrides: Any) -> Operation:
    values: dict[str, Any] = {f.name: None for f in fields(Operation)}
    values.update(
        operation_id="op_1",
        tenant="t1",
        provider="fault",
        action="refund.create",
        method="POST",
        path="/v1/refunds",
        path_params={},
        params={},
        idempotency_key="k",
        approval_ref="r",
        approved_by="a",
        expires_at=NOW + timedelta(minutes=5),
        status=Status.CREATED,
        attempts=0,
        unsent_attempts=0,
        reconcile_attempts=0,
        created_at=NOW,
        updated_at=NOW,
        read_at=NOW,
    )
    values.update(overrides)
    return Operation(**values)
