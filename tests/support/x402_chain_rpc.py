"""The in-memory token (x402_ledger) behind a JSON-RPC endpoint on loopback, as a chain's node
serves it: ``eth_call`` of ``authorizationState(address,bytes32)`` on the token, the only call
opgate's reconciliation makes. Part of the one fake of the x402 tests: the chain. ``failing``
answers every call with a JSON-RPC error (a node that is down or refuses)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from tests.support.x402_ledger import TOKEN, Ledger

SELECTOR = "0xe94a0102"


@dataclass
class ChainRpc:
    url: str = ""
    failing: bool = False
    calls: int = 0


@asynccontextmanager
async def chain_rpc(ledger: Ledger) -> AsyncIterator[ChainRpc]:
    """The node on a loopback port, stopped on exit."""
    state = ChainRpc()

    async def rpc(request: web.Request) -> web.Response:
        call = await request.json()
        state.calls += 1
        if state.failing:
            error = {"code": -32000, "message": "header not found"}
            return web.json_response({"jsonrpc": "2.0", "id": call["id"], "error": error})
        [transaction, _block] = call["params"]
        data: str = transaction["data"]
        assert call["method"] == "eth_call"
        assert transaction["to"].lower() == TOKEN.lower()
        assert data.startswith(SELECTOR)
        assert len(data) == 2 + 8 + 128
        payer = "0x" + data[10:74][-40:]
        nonce = bytes.fromhex(data[74:])
        used = ledger.read_contract(TOKEN, None, "authorizationState", payer, nonce)
        result = "0x" + ("1" if used else "0").rjust(64, "0")
        return web.json_response({"jsonrpc": "2.0", "id": call["id"], "result": result})

    app = web.Application()
    app.router.add_post("/", rpc)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    try:
        yield state
    finally:
        await runner.cleanup()
