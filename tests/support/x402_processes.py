"""opgate as real processes (``python -m proxy serve``) in front of the SDK's paid API: their
settings, an approval, the agent's request, and a replacement agent that finishes an operation
with only its id. Used by the crash-window and replica tests of x402."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402 import x402Client
from x402.http.utils import (
    decode_payment_required_header,
    decode_payment_signature_header,
    encode_payment_signature_header,
)
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.schemas import PaymentRequired

from tests.support.killable_opgate import KillableOpgate
from tests.support.opgate import AGENT_TOKEN, admin_headers, process_env
from tests.support.x402_chain_rpc import ChainRpc
from tests.support.x402_gate import REPORT, WALLET, paid_policy, terms
from tests.support.x402_server import PaidApi

HANG_GUARD_SECONDS = 90.0
AGENT = {"Authorization": f"Bearer {AGENT_TOKEN}"}
AGENT_WALLET: LocalAccount = Account.from_key("0x" + "5a" * 32)  # the agent's own key


def env_for(
    database_url: str,
    tmp_path: Path,
    api: PaidApi,
    node: ChainRpc,
    *,
    payer: str = "opgate",
    deduplicates: bool = False,
) -> dict[str, str]:
    """A process's settings: the paid API's policy with a 3 s provider timeout (the killed
    process's lease lapses 3.5 s after its claim), reconciliation reading the node."""
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir(exist_ok=True)
    policy = paid_policy(
        chain_rpc=True, expiry_margin=0, payer=payer, deduplicates=deduplicates
    ).replace("classify:", "timeouts: {total_seconds: 3}\nclassify:")
    (policy_dir / "paid.yaml").write_text(policy)
    return process_env(
        database_url,
        policy_dir,
        {"paid": api.base},
        OPGATE_SECRET_PAID_WALLET=WALLET.key.hex(),
        OPGATE_SECRET_PAID_RPC=node.url,
        OPGATE_LEASE_MARGIN_SECONDS="0.5",
    )


async def approve(http: aiohttp.ClientSession, gate: KillableOpgate, api: PaidApi) -> str:
    body = {
        "tenant": "t1",
        "provider": "paid",
        "action": "report.buy",
        "params": terms(f"{api.base}/report"),
        "approval_ref": "ticket-x402",
        "approved_by": "alice@example.com",
        "ttl_seconds": 600,
    }
    async with http.post(
        f"{gate.ops_url}/v1/operations", json=body, headers=admin_headers()
    ) as response:
        created: dict[str, Any] = await response.json(content_type=None)
        assert response.status == 201, created
    operation_id: str = created["operation_id"]
    return operation_id


async def buy(
    http: aiohttp.ClientSession,
    gate: KillableOpgate,
    operation_id: str,
    payment: str | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The agent's request (with ``payment`` as its own PAYMENT-SIGNATURE, if given): its
    status, JSON body and headers; a dropped connection (its opgate killed) is (0, {}, {})."""
    headers = {"X-Operation-Id": operation_id, "Proxy-Authorization": AGENT["Authorization"]}
    if payment is not None:
        headers["PAYMENT-SIGNATURE"] = payment
    try:
        async with http.get(f"{gate.agent_url}{REPORT}", headers=headers) as response:
            body = await response.json(content_type=None)
            return response.status, body, dict(response.headers)
    except aiohttp.ClientError:
        return 0, {}, {}


async def finish_as_a_replacement(
    http: aiohttp.ClientSession, gate: KillableOpgate, operation_id: str
) -> dict[str, Any]:
    """A replacement agent with only the operation id: it reads the operation (which
    reconciles it when due) and sends it when told to, until it is settled."""
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while True:
        assert time.monotonic() < deadline, "the operation was not settled in time"
        async with http.get(
            f"{gate.agent_url}/_opgate/v1/operations/{operation_id}", headers=AGENT
        ) as response:
            view: dict[str, Any] = await response.json()
            assert response.status == 200, view
        if view["operation"]["status"] in ("confirmed", "failed"):
            return view
        if view["next_action"] in ("send", "retry"):
            await buy(http, gate, operation_id)
        await asyncio.sleep(0.25)  # polling the recovery read, bounded by the deadline


async def agent_payments(
    http: aiohttp.ClientSession, gate: KillableOpgate, operation_id: str, count: int
) -> list[str]:
    """The agent's own payments for the operation: the 402 that reaches it through opgate,
    paid ``count`` times by the SDK's client with the agent's wallet (each with a fresh random
    nonce, as the SDK mints one per payment)."""
    status, _, headers = await buy(http, gate, operation_id)
    assert status == 402, headers
    required = decode_payment_required_header(headers["PAYMENT-REQUIRED"])
    assert isinstance(required, PaymentRequired)
    client = register_exact_evm_client(x402Client(), AGENT_WALLET)
    payloads = [await client.create_payment_payload(required) for _ in range(count)]
    return [encode_payment_signature_header(payload) for payload in payloads]


def nonce_of(header: str) -> str:
    payload = decode_payment_signature_header(header)
    nonce: str = payload.payload["authorization"]["nonce"]
    return nonce.lower()
