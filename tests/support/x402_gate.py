"""opgate in front of the SDK's paid API (x402_server): the policy, the wallet's secret and an
approval naming the payment's terms."""

from __future__ import annotations

import textwrap
from typing import Any

from eth_account import Account

from tests.support.opgate import AGENT_TOKEN, Opgate, admin_headers
from tests.support.x402_ledger import NETWORK, TOKEN
from tests.support.x402_server import PAYEE, PRICE

WALLET = Account.from_key("0x" + "4f" * 32)  # opgate's wallet in the tests; agents hold no key
REPORT = "/paid/report"


def paid_policy(
    *,
    deduplicates: bool = False,
    payer: str = "opgate",
    chain_rpc: bool = False,
    expiry_margin: int | None = None,
) -> str:
    """The paid API's policy; ``deduplicates``: opgate may re-send an operation whose outcome
    is unknown (the paid API keeps no keys: the re-send is where a second payment could come);
    ``payer``: who signs (opgate with its wallet, or the agent); ``chain_rpc``: reconciliation
    reads nonces from the chain whose JSON-RPC URL is the secret ``paid_rpc``."""
    dedup = "true, retention_seconds: 86400" if deduplicates else "false"
    wallet = "wallet_secret: paid_wallet" if payer == "opgate" else "payer: agent"
    rpc = "\n" + " " * 14 + "chain_rpc_secret: paid_rpc" if chain_rpc else ""
    if expiry_margin is not None:  # seconds after validBefore: an unused nonce proves unpaid
        rpc += "\n" + " " * 14 + f"expiry_margin_seconds: {expiry_margin}"
    return textwrap.dedent(f"""\
        version: 1
        provider: paid
        route_prefix: /paid
        upstream: http://127.0.0.1:9
        idempotency: {{header: Idempotency-Key, provider_deduplicates: {dedup}}}
        classify: {{confirmed: [2xx], failed: [404]}}
        rules:
          - name: report.buy
            method: GET
            path: /report
            body: none
            x402:
              {wallet}{rpc}
              networks: ["{NETWORK}"]
              assets: ["{TOKEN}"]
        """)


def payments_policy(*, limit: int, max_payments: int = 100) -> str:
    """The set's payments file: a tenant budget of ``limit`` atomic units of the test token per
    day across payees, and a rate limit of ``max_payments`` a day."""
    return textwrap.dedent(f"""\
        version: 1
        payments:
          x402:
            budgets:
              - {{scope: tenant, network: "{NETWORK}", asset: "{TOKEN}", limit: {limit},
                  window: 24h}}
            rate_limits:
              - {{scope: tenant, max_payments: {max_payments}, window: 24h}}
        """)


def terms(resource: str, **changes: str) -> dict[str, str]:
    """The payment terms an approval names (policy X402_TERMS)."""
    return {
        "x402_resource": resource,
        "x402_max_amount": str(PRICE),
        "x402_asset": TOKEN,
        "x402_network": NETWORK,
        "x402_pay_to": PAYEE,
        **changes,
    }


async def approve_purchase(gate: Opgate, resource: str, **changes: str) -> dict[str, Any]:
    return await gate.approve(
        provider="paid",
        action="report.buy",
        amount=None,
        currency=None,
        params=terms(resource, **changes),
    )


async def buy(gate: Opgate, operation_id: str) -> tuple[int, dict[str, str], bytes]:
    """The agent's purchase of REPORT for ``operation_id`` through opgate's forward mode."""
    return await gate.send(
        REPORT,
        method="GET",
        headers={"X-Operation-Id": operation_id, "Proxy-Authorization": f"Bearer {AGENT_TOKEN}"},
        token=None,
        content_type=None,
    )


async def reconcile(gate: Opgate, operation_id: str) -> dict[str, Any]:
    """The operations API's reconcile of ``operation_id``; the row after it."""
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations/{operation_id}/reconcile", headers=admin_headers()
    ) as response:
        assert response.status == 200
    row: dict[str, Any] = await gate.operation(operation_id)
    return row
