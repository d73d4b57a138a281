"""A provider policy with spend budgets, and a request sent against them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.opgate import (
    Opgate,
    admin_headers,
    fault_policy,
)

REFUND = "/fault/v1/refunds"


BODY = "amount=500&currency=usd&charge=ch_1"


def budgeted(policy_dir: Path, budgets: str, *, deduplicates: bool = False, mode: str = "") -> None:
    text = fault_policy(deduplicates=deduplicates).replace("rules:\n", f"{budgets}\nrules:\n", 1)
    if mode:
        text = text.replace("provider: fault\n", f"provider: fault\nmode: {mode}\n")
    (policy_dir / "fault.yaml").write_text(text)


def tenant_budget(limit: int, window: str = "24h", mode: str = "enforce") -> str:
    return (
        f"budgets: [{{scope: tenant, currency: usd, limit: {limit}, window: {window}, "
        f"mode: {mode}}}]"
    )


async def send(gate: Opgate, op: dict[str, Any], token: str | None = None) -> tuple[int, bytes]:
    extra = {"token": token} if token else {}
    status, _, body = await gate.send(
        REFUND, data=BODY, headers={"X-Operation-Id": op["operation_id"]}, **extra
    )
    return status, body


async def budgets(gate: Opgate, query: str = "") -> list[dict[str, Any]]:
    async with gate.http.get(f"{gate.ops_url}/v1/budgets{query}", headers=admin_headers()) as r:
        assert r.status == 200
        found: list[dict[str, Any]] = (await r.json())["budgets"]
        return found
