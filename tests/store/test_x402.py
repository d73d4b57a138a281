"""The one payment kept for an operation: only while it is dispatched, the first kept wins
against any number racing, and its settlement is kept once."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest_asyncio

from proxy.store.store import Claim, Store
from proxy.store.x402 import SignedPayment, X402Payments
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
