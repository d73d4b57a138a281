"""What counts against a budget (queries.sql budget_spent, mandate_open_use): every operation
that may have left, whatever happened to its approval afterwards; only one that failed with no
effect, or was revoked before anything of it was sent, leaves the sum."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from proxy.mandates.ap2 import OpenMandateUse
from proxy.store.mandates import MandateStore, OpenMandateLimits, OpenMandateUsed
from proxy.store.operation import Operation, Status
from proxy.store.store import BudgetSum, Claim, NewOperation, ProviderAnswer, Store
from tests.support.operations import NOW, new_operation, operation

OPEN = "o" * 43  # an open mandate's digest
BUDGET = 1000
LIMITS = OpenMandateLimits((OPEN,), OpenMandateUse(OPEN, 10, BUDGET).allows)
ANSWER = ProviderAnswer(200, "pi_1", "application/json", b"{}")


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


def _under_open_mandate(number: int) -> NewOperation:
    """The closed mandate ``number``'s operation of 1000 under the open mandate OPEN."""
    closed = f"{number:043d}"
    return dataclasses.replace(
        new_operation(f"op_m{number}"), amount=BUDGET, approval_ref=f"ap2:{closed};open:{OPEN}"
    )


async def _confirmed_under_open_mandate(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT coalesce(sum(amount), 0) FROM operations"
            " WHERE approval_ref LIKE '%;open:' || $1 AND status = 'confirmed'",
            OPEN,
        )
    )


async def _send_and_confirm(store: Store, operation_id: str) -> None:
    assert await store.claim(Claim(operation_id, owner="a", lease_seconds=30, expected_attempts=0))
    assert await store.settle(operation_id, Status.CONFIRMED, ANSWER, "a") is Status.CONFIRMED


async def test_a_revoke_after_the_send_never_lets_an_open_mandate_spend_twice(
    store: Store, database_url: str
) -> None:
    """A payment of 1000 under an open mandate of 1000 is sent and confirmed, then its
    approval revoked: the next closed mandate under it is refused, and never more than 1000
    is confirmed under the mandate."""
    mandates = MandateStore(store)
    first = await mandates.create(_under_open_mandate(1), "test", nonce=None, limits=LIMITS)
    assert isinstance(first, Operation)
    await _send_and_confirm(store, first.operation_id)
    await store.revoke(first.operation_id, "changed my mind", "admin")
    second = await mandates.create(_under_open_mandate(2), "test", nonce=None, limits=LIMITS)
    if isinstance(second, Operation):  # the hole: it would be sent and confirmed too
        await _send_and_confirm(store, second.operation_id)
    conn = await asyncpg.connect(database_url)
    try:
        assert await _confirmed_under_open_mandate(conn) <= BUDGET
    finally:
        await conn.close()
    assert second == OpenMandateUsed(occurrences=1, spent=BUDGET)


async def test_an_operation_revoked_in_flight_still_counts_once_it_is_confirmed(
    store: Store,
) -> None:
    """Revoked while its attempt is in flight (allowed: it stops every further attempt), then
    confirmed by the provider's answer: it counts against the open mandate's budget."""
    mandates = MandateStore(store)
    first = await mandates.create(_under_open_mandate(1), "test", nonce=None, limits=LIMITS)
    assert isinstance(first, Operation)
    assert await store.claim(
        Claim(first.operation_id, owner="a", lease_seconds=30, expected_attempts=0)
    )
    assert await store.revoke(first.operation_id, "stop", "admin") is not None
    assert await store.settle(first.operation_id, Status.CONFIRMED, ANSWER, "a")
    second = await mandates.create(_under_open_mandate(2), "test", nonce=None, limits=LIMITS)
    assert second == OpenMandateUsed(occurrences=1, spent=BUDGET)


async def test_revoked_before_anything_was_sent_frees_the_open_mandate(store: Store) -> None:
    """Revoked while created, or after its only attempt ended before a byte left: nothing can
    ever leave, so the open mandate's budget is free again, each time."""
    mandates = MandateStore(store)
    first = await mandates.create(_under_open_mandate(1), "test", nonce=None, limits=LIMITS)
    assert isinstance(first, Operation)
    assert await store.revoke(first.operation_id, "not needed", "admin") is not None
    second = await mandates.create(_under_open_mandate(2), "test", nonce=None, limits=LIMITS)
    assert isinstance(second, Operation)
    assert await store.claim(
        Claim(second.operation_id, owner="a", lease_seconds=30, expected_attempts=0)
    )
    assert await store.end_attempt(second.operation_id, 1, "not_sent", None, "a")
    assert await store.revoke(second.operation_id, "not needed", "admin") is not None
    third = await mandates.create(_under_open_mandate(3), "test", nonce=None, limits=LIMITS)
    assert isinstance(third, Operation)


async def test_a_settled_operation_cannot_be_revoked(store: Store) -> None:
    """Confirmed or failed: nothing is left to stop, and a revocation would only read as if
    it un-sent something; the row stays unrevoked."""
    for operation_id, status in (("op_c", Status.CONFIRMED), ("op_f", Status.FAILED)):
        await store.create(new_operation(operation_id), actor="test")
        assert await store.claim(
            Claim(operation_id, owner="a", lease_seconds=30, expected_attempts=0)
        )
        assert await store.settle(operation_id, status, ANSWER, "a") is status
        assert await store.revoke(operation_id, "too late", "admin") is None
        settled = await store.load(operation_id)
        assert settled is not None
        assert settled.revoked_at is None


async def test_the_tenant_budget_counts_what_may_have_left_whatever_its_approval(
    store: Store,
) -> None:
    """A tenant budget's sum: a dispatched attempt revoked in flight counts; one revoked after
    its only attempt ended not_sent and one that failed do not; a created row is not claimed."""
    for operation_id in ("op_in_flight", "op_unsent", "op_failed", "op_created"):
        await store.create(new_operation(operation_id), actor="test")
    for operation_id in ("op_in_flight", "op_unsent", "op_failed"):
        assert await store.claim(
            Claim(operation_id, owner="a", lease_seconds=30, expected_attempts=0)
        )
    assert await store.end_attempt("op_unsent", 1, "not_sent", None, "a")
    assert await store.settle("op_failed", Status.FAILED, ANSWER, "a") is Status.FAILED
    for operation_id in ("op_in_flight", "op_unsent"):
        assert await store.revoke(operation_id, "stop", "admin") is not None
    tenant = BudgetSum("t", "fault", "usd", "t1", None, 3600)
    assert await store.budget_spent([tenant]) == [500]
    assert await store.budget_spent_by_key("fault", "usd", 3600, tenant=True, agent=False) == [
        ("t1", None, 500)
    ]


async def test_what_spends_is_one_definition_in_sql_and_python(database_url: str) -> None:
    """On every status, attempt count, revocation and doubt: opgate_spends equals
    Operation.spends, and leaves out exactly what failed or was revoked with nothing sent."""
    conn = await asyncpg.connect(database_url)
    try:
        for status, attempts, unsent, revoked, doubt in itertools.product(
            Status, range(3), range(3), (None, NOW), (None, NOW)
        ):
            if unsent > attempts:
                continue
            in_sql = await conn.fetchval(
                "SELECT opgate_spends($1, $2, $3, $4, $5)", status, attempts, unsent, revoked, doubt
            )
            op = operation(
                status=status,
                attempts=attempts,
                unsent_attempts=unsent,
                revoked_at=revoked,
                lookup_before_send=doubt,
            )
            case = (status, attempts, unsent, revoked, doubt)
            assert in_sql is op.spends(), case
            nothing_sent = status.value in ("created", "dispatched") and (
                attempts == unsent and doubt is None
            )
            left_out = status is Status.FAILED or (revoked is not None and nothing_sent)
            assert op.spends() is not left_out, case
    finally:
        await conn.close()
