"""The one payment kept for an operation: only while it is dispatched, the first kept wins
against any number racing, and its settlement is kept once."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest_asyncio

from proxy.store import queries
from proxy.store.store import Claim, Store
from proxy.store.x402 import (
    OpenMandateCap,
    OpenMandatePaid,
    PaymentLimitSum,
    SignedPayment,
    X402Payments,
)
from tests.support.operations import new_operation

PAYMENT = SignedPayment(
    header="aGVhZGVy",
    payload_sha256="0" * 64,
    nonce="0x" + "11" * 32,
    payer="0x" + "22" * 20,
    pay_to="0x" + "33" * 20,
    amount=2**255,  # a uint256 amount survives the round trip
    asset="0x" + "44" * 20,
    network="eip155:8453",
    valid_before=1_900_000_000,
)


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=20)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_payment_is_kept_only_for_a_dispatched_operation(store: Store) -> None:
    """Before its claim the operation keeps no payment, and none is returned to send."""
    await store.create(new_operation("op_x402_created"), actor="test")
    payments = X402Payments(store)
    assert await payments.keep("op_x402_created", PAYMENT) is None
    assert await payments.stored("op_x402_created") is None


async def test_racing_payments_keep_the_first_and_every_racer_sends_it(store: Store) -> None:
    """Twenty different payments racing for one operation: all twenty get the same one back."""
    await store.create(new_operation("op_x402_race"), actor="test")
    await store.claim(Claim("op_x402_race", owner="a", lease_seconds=30, expected_attempts=0))
    payments = X402Payments(store)
    racing = [dataclasses.replace(PAYMENT, header=f"payment-{i}") for i in range(20)]
    kept = await asyncio.gather(*(payments.keep("op_x402_race", p) for p in racing))
    headers = {k.header for k in kept if k is not None}
    assert len(headers) == 1
    stored = await payments.stored("op_x402_race")
    assert stored is not None
    assert {stored.header} == headers


async def test_the_settlement_is_kept_once(store: Store) -> None:
    """A second settlement for the same payment does not overwrite the first."""
    await store.create(new_operation("op_x402_settle"), actor="test")
    await store.claim(Claim("op_x402_settle", owner="a", lease_seconds=30, expected_attempts=0))
    payments = X402Payments(store)
    await payments.keep("op_x402_settle", PAYMENT)
    assert await payments.record_settlement("op_x402_settle", {"transaction": "0xa"})
    assert not await payments.record_settlement("op_x402_settle", {"transaction": "0xb"})
    stored = await payments.stored("op_x402_settle")
    assert stored is not None
    assert stored.settlement == {"transaction": "0xa"}


async def test_a_payment_is_released_only_by_the_lease_holder_for_its_nonce(store: Store) -> None:
    """Released by the reconciliation lease's holder, for the nonce it judged and the attempt
    it saw: then the operation keeps a new payment; any other release changes nothing."""
    await store.create(new_operation("op_x402_release"), actor="test")
    await store.claim(Claim("op_x402_release", owner="a", lease_seconds=30, expected_attempts=0))
    payments = X402Payments(store)
    await payments.keep("op_x402_release", PAYMENT)
    await store.end_attempt("op_x402_release", 1, "unknown:dropped", None, "test")
    claimed = await store.claim_reconcile_one("op_x402_release", "r", 30)
    assert claimed is not None
    evidence = {"verdict": "not_paid"}
    for owner, nonce, attempts in (("other", PAYMENT.nonce, 1), ("r", "0x" + "99" * 32, 1)):
        released = await payments.release_unpaid(
            "op_x402_release", owner, nonce, evidence, expected_attempts=attempts
        )
        assert released is False
    assert not await payments.release_unpaid(
        "op_x402_release", "r", PAYMENT.nonce, evidence, expected_attempts=2
    )
    assert await payments.release_unpaid(
        "op_x402_release", "r", PAYMENT.nonce, evidence, expected_attempts=1
    )
    assert await payments.stored("op_x402_release") is None
    row = await store.load("op_x402_release")
    assert row is not None
    assert row.last_outcome == "not_sent"
    await store.claim(Claim("op_x402_release", owner="b", lease_seconds=30, expected_attempts=1))
    second = dataclasses.replace(PAYMENT, header="second")
    kept = await payments.keep("op_x402_release", second)
    assert kept is not None
    assert kept.header == "second"


def _limit(
    lock_name: str = "x402:budget-t1", *, asset: str | None = PAYMENT.asset
) -> PaymentLimitSum:
    return PaymentLimitSum(
        lock_name=lock_name,
        tenant="t1",
        agent_id=None,
        network=PAYMENT.network if asset is not None else None,
        asset=asset,
        window_seconds=3600.0,
    )


async def test_payments_racing_from_separate_pools_never_pay_beyond_the_budget(
    database_url: str,
) -> None:
    """Twenty operations of one tenant, each paying its own payee 100 under a budget of 1000,
    kept at once from two pools (two processes' worth of connections): exactly ten are kept,
    and the database's own sum of the kept payments is the limit, never more."""
    pools = [await Store.open(database_url, min_size=1, max_size=10) for _ in range(2)]
    try:
        ids = [f"op_x402_budget_{i}" for i in range(20)]
        for operation_id in ids:
            await pools[0].create(new_operation(operation_id), actor="test")
            claim = Claim(operation_id, owner="a", lease_seconds=30, expected_attempts=0)
            await pools[0].claim(claim)
        limit = 1000

        def admit(spent: list[tuple[int, int]]) -> bool:
            return all(amount + 100 <= limit for amount, _ in spent)

        async def pay(i: int) -> bool:
            payment = dataclasses.replace(
                PAYMENT,
                header=f"payment-{i}",
                amount=100,
                pay_to="0x" + f"{i:040x}",
                nonce="0x" + f"{i:064x}",
            )
            kept = await X402Payments(pools[i % 2]).keep_within_limits(
                ids[i], payment, [_limit()], admit
            )
            return kept.payment is not None

        kept = await asyncio.gather(*(pay(i) for i in range(20)))
        assert sum(kept) == 10
        total = await pools[1]._run(
            lambda conn: conn.fetchrow(
                "SELECT sum(amount)::bigint AS paid, count(DISTINCT pay_to) AS payees"
                " FROM x402_payments WHERE released_at IS NULL"
            )
        )
        assert total is not None
        assert (total["paid"], total["payees"]) == (limit, 10)
    finally:
        for pool in pools:
            await pool.close()


async def test_an_operation_paying_again_counts_once_and_a_rate_limit_counts_payments(
    store: Store,
) -> None:
    """An operation whose payment is kept gets it back under a spent budget (its own payment
    is not counted twice); a rate limit sums the number of payments in any asset."""
    payments = X402Payments(store)
    for operation_id in ("op_x402_rate_1", "op_x402_rate_2"):
        await store.create(new_operation(operation_id), actor="test")
        await store.claim(Claim(operation_id, owner="a", lease_seconds=30, expected_attempts=0))
    rate = _limit("x402:rate-t1", asset=None)
    one_payment = lambda spent: all(count + 1 <= 1 for _, count in spent)  # noqa: E731
    first = await payments.keep_within_limits("op_x402_rate_1", PAYMENT, [rate], one_payment)
    assert first.payment is not None
    assert first.spent == [(0, 0)]
    again = await payments.keep_within_limits("op_x402_rate_1", PAYMENT, [rate], one_payment)
    assert again.payment == first.payment
    other = dataclasses.replace(PAYMENT, asset="0x" + "55" * 20, header="other")
    refused = await payments.keep_within_limits("op_x402_rate_2", other, [rate], one_payment)
    assert (refused.admitted, refused.payment, refused.spent) == (False, None, [(2**255, 1)])
    assert await payments.stored("op_x402_rate_2") is None


async def test_payments_under_one_open_mandate_racing_from_two_pools_never_pass_its_budget(
    database_url: str,
) -> None:
    """Twenty operations made under one AP2 open mandate (ten approved under each spelling of
    its digest), each paying its own payee 100, kept at once from two pools, with no x402
    limit at all: the mandate's lock and sum alone let exactly ten in (a budget of 1000), and a
    card payment of the mandate approved with an amount counts against the same budget."""
    pools = [await Store.open(database_url, min_size=1, max_size=10) for _ in range(2)]
    try:
        spellings = ("open_identity", "open_twin")
        for spelling in spellings:
            await pools[0]._run(
                lambda conn, s=spelling: queries.execute(  # type: ignore[misc]
                    conn,
                    "record_open_mandate_cap",
                    open_digest=s,
                    identity=spellings[0],
                    spellings=list(spellings),
                    budget_max="1200",
                    currency="USD",
                )
            )
        card = dataclasses.replace(
            new_operation("op_card"), amount=200, approval_ref="ap2:card;open:open_identity"
        )
        await pools[0].create(card, actor="test")
        ids = [f"op_x402_mandate_{i}" for i in range(20)]
        for i, operation_id in enumerate(ids):
            op = dataclasses.replace(
                new_operation(operation_id),
                amount=None,
                currency=None,
                approval_ref=f"ap2:closed{i};open:{spellings[i % 2]}",
            )
            await pools[0].create(op, actor="test")
            claim = Claim(operation_id, owner="a", lease_seconds=30, expected_attempts=0)
            await pools[0].claim(claim)
        cap = await X402Payments(pools[0]).open_mandate_cap("open_twin")
        assert cap == OpenMandateCap("open_identity", spellings, 1200, "USD")

        def within(paid: OpenMandatePaid) -> bool:  # minor units throughout: 1 atomic = 1 cent
            return paid.spent + sum(amount for _, _, amount in paid.paid) + 100 <= 1200

        async def pay(i: int) -> bool:
            payment = dataclasses.replace(
                PAYMENT,
                header=f"payment-{i}",
                amount=100,
                pay_to="0x" + f"{i:040x}",
                nonce="0x" + f"{i:064x}",
            )
            kept = await X402Payments(pools[i % 2]).keep_within_limits(
                ids[i], payment, [], lambda _: True, mandate=cap, admit_mandate=within
            )
            return kept.payment is not None

        kept = await asyncio.gather(*(pay(i) for i in range(20)))
        assert sum(kept) == 10
        total = await pools[1]._run(
            lambda conn: conn.fetchval(
                "SELECT sum(amount)::bigint FROM x402_payments WHERE released_at IS NULL"
            )
        )
        assert total == 1000
    finally:
        for pool in pools:
            await pool.close()
