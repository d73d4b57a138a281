"""The x402 tests run only where the optional extra is installed (opgate[x402], in [test]).
The paid API, the chain node and a plain HTTP client every module starts the same way, over the
module's own ``ledger`` fixture (each module funds its own wallets)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

pytest.importorskip("x402")
pytest.importorskip("eth_account")

from tests.support.x402_chain_rpc import ChainRpc, chain_rpc
from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PaidApi, paid_api


@pytest_asyncio.fixture(loop_scope="session")
async def api(ledger: Ledger) -> AsyncIterator[PaidApi]:
    async with paid_api(ledger) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def node(ledger: Ledger) -> AsyncIterator[ChainRpc]:
    async with chain_rpc(ledger) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session
