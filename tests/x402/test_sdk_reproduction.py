"""x402 issue #3438 with the official SDK on every side: a paying client that mints a fresh
authorization for each 402 pays twice when a settled answer is lost and the call is repeated."""

from __future__ import annotations

import contextlib
import time

import httpx
from eth_account import Account
from x402 import x402Client
from x402.http.clients.httpx import PaymentError, x402HttpxClient
from x402.mechanisms.evm.exact import register_exact_evm_client

from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PRICE, paid_api


async def test_the_bare_sdk_client_settles_twice_for_one_purchase_when_an_answer_is_lost() -> None:
    """One purchase, its answer lost after settlement, the call repeated: two settlements."""
    ledger = Ledger(now=lambda: int(time.time()))
    wallet = Account.create()
    ledger.fund(wallet.address, 10 * PRICE)
    async with paid_api(ledger) as api:
        client = register_exact_evm_client(x402Client(), wallet)
        api.lose_answers = 1
        async with x402HttpxClient(client, base_url=api.base) as agent:
            # the answer is lost: the agent does what agents do, it asks again
            with contextlib.suppress(httpx.HTTPError, PaymentError):
                await agent.get("/report")
            answer = await agent.get("/report")
    assert answer.status_code == 200
    assert len(ledger.settlements) == 2  # one purchase, paid twice
    assert len({s.nonce for s in ledger.settlements}) == 2  # a fresh nonce for each 402
    assert ledger.balance(wallet.address) == 8 * PRICE
    assert api.served == 2
