"""docs/x402.md works as written: its policy block is the paid API's policy, and its python
block, run verbatim with only OPGATE_URL, OPGATE_AGENT_TOKEN and AGENT_WALLET_KEY set, buys
through opgate in both modes against the SDK's resource server and exact facilitator over the
in-memory token, the first answer lost after settlement (#3438): one settlement each."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from eth_account import Account

from proxy.policy.load import load_policy_dir
from proxy.policy.payments import to_atomic
from tests.support.opgate import AGENT_TOKEN, StartOpgate
from tests.support.paths import REPO
from tests.support.x402_chain_rpc import ChainRpc
from tests.support.x402_gate import WALLET, approve_purchase, reconcile
from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PRICE, PaidApi

PAGE = REPO / "docs" / "x402.md"
AGENT_WALLET = Account.from_key("0x" + "6b" * 32)


def block(language: str, containing: str = "") -> str:
    """The page's one fenced block in ``language`` (that contains ``containing``)."""
    found = re.findall(rf"^```{language}\n(.*?)^```", PAGE.read_text("utf-8"), re.S | re.M)
    [code] = [text for text in found if containing in text]
    return code


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 10 * PRICE)
    chain.fund(AGENT_WALLET.address, 10 * PRICE)
    return chain


@pytest.mark.parametrize(
    ("payer", "function"), [("opgate", "buy_report"), ("agent", "buy_report_paying")]
)
async def test_the_worked_example_pays_once_in_each_mode(
    start_opgate: StartOpgate,
    policy_dir: Path,
    api: PaidApi,
    ledger: Ledger,
    node: ChainRpc,
    monkeypatch: pytest.MonkeyPatch,
    payer: str,
    function: str,
) -> None:
    """The page's client buys an approved report; its answer is lost after settlement; asked
    again, opgate sends nothing (reconcile_required); reconciliation reads the nonce used and
    settles it paid; asked again, the row answers. The ledger holds one settlement."""
    policy = block("yaml", "provider:")
    if payer == "agent":
        policy = policy.replace("payer: opgate", "payer: agent")
        policy = re.sub(r"\n\s*wallet_secret:[^\n]*", "", policy)
    (policy_dir / "paid.yaml").write_text(policy)
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    monkeypatch.setenv("OPGATE_SECRET_PAID_RPC", node.url)
    async with start_opgate(upstream_overrides={"paid": api.base}) as gate:
        monkeypatch.setenv("OPGATE_URL", gate.agent_url)
        monkeypatch.setenv("OPGATE_AGENT_TOKEN", AGENT_TOKEN)
        monkeypatch.setenv("AGENT_WALLET_KEY", AGENT_WALLET.key.hex())
        defined: dict[str, Any] = {"__name__": "x402_example"}
        exec(compile(block("python"), str(PAGE), "exec"), defined)  # noqa: S102
        buy: Callable[[str], Awaitable[httpx.Response]] = defined[function]
        op = await approve_purchase(gate, f"{api.base}/report")
        before = len(ledger.settlements)
        api.lose_answers = 1
        lost = await buy(op["operation_id"])
        assert (lost.status_code, lost.json()["code"]) == (502, "outcome_unknown")
        again = await buy(op["operation_id"])
        assert (again.status_code, again.json()["code"]) == (409, "reconcile_required")
        row = await reconcile(gate, op["operation_id"])
        assert (row["status"], row["settled_reason"]) == ("confirmed", "x402_paid_answer_lost")
        answered = await buy(op["operation_id"])
        assert answered.headers["X-Operation-Status"] == "confirmed"
        assert answered.json()["code"] == "x402_paid_answer_lost"
    [settled] = ledger.settlements[before:]
    assert settled.payer == (WALLET.address if payer == "opgate" else AGENT_WALLET.address)


def test_the_payments_file_on_the_page_loads_as_the_sets_limits(tmp_path: Path) -> None:
    """The page's payments file, beside its provider policy, is the set's x402 limits."""
    (tmp_path / "paid.yaml").write_text(block("yaml", "provider:"))
    (tmp_path / "payments.yaml").write_text(block("yaml", "rate_limits:"))
    limits = load_policy_dir(tmp_path).x402_limits
    assert [(b.scope.value, b.limit, b.window) for b in limits.budgets] == [
        ("tenant", 50_000_000, "24h"),
        ("agent", 5_000_000, "1h"),
    ]
    assert [(r.scope.value, r.max_payments) for r in limits.rate_limits] == [("agent", 20)]


def test_the_pegs_on_the_page_load_and_convert_a_cent(tmp_path: Path) -> None:
    """The page's pegs file loads: USDC on Base is USD at 6 decimals, a cent 10000 units."""
    (tmp_path / "paid.yaml").write_text(block("yaml", "provider:"))
    (tmp_path / "payments.yaml").write_text(block("yaml", "pegs:"))
    limits = load_policy_dir(tmp_path).x402_limits
    [peg] = limits.pegs
    assert limits.peg(peg.network, peg.asset.upper().replace("0X", "0x")) == peg
    assert to_atomic(peg, 1, "USD") == 10_000
