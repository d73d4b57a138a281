"""The console's budgets page: each budget and what is left of it, for either role."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp

from tests.console.helpers import REVIEWER_DIGEST, REVIEWER_TOKEN, sign_in
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import StartOpgate, fault_policy


async def test_a_reviewer_sees_what_is_left_of_each_budget(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """After a tenant spent 500 of 1200, the budgets page shows its row with 700 remaining,
    and the provider budget nobody spent from with all of it."""
    budgets = (
        "budgets:\n  - {scope: tenant, currency: usd, limit: 1200, window: 24h}\n"
        "  - {scope: provider, currency: usd, limit: 9000, window: 7d}\n"
    )
    text = fault_policy(deduplicates=False).replace("rules:\n", budgets + "rules:\n", 1)
    (policy_dir / "fault.yaml").write_text(text)
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, reviewer_token_sha256=REVIEWER_DIGEST
    ) as gate:
        op = await gate.approve()
        status, _, _ = await gate.send(
            "/fault/v1/refunds",
            data="amount=500&currency=usd&charge=ch_1",
            headers={"X-Operation-Id": op["operation_id"]},
        )
        assert status == 200
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar, trust_env=False) as session:
            await sign_in(gate, session, REVIEWER_TOKEN, identity="rita")
            async with session.get(f"{gate.ops_url}/console/budgets") as page:
                assert page.status == 200
                html = await page.text()
    rows = [
        re.sub(r"<[^>]+>", " ", row).split()
        for row in re.findall(r"<tr>(.*?)</tr>", html, re.DOTALL)
    ]

    def usd(minor_units: int) -> list[str]:
        """An amount as a human reads it: the currency's exponent, then the minor units."""
        return [
            f"{minor_units // 100}.{minor_units % 100:02d}",
            "USD",
            f"({minor_units}",
            "minor",
            "units)",
        ]

    provider_row = ["fault", "provider", "usd", "7d", *usd(9000), *usd(500), *usd(8500)]
    tenant_row = ["fault", "tenant", "t1", "usd", "24h", *usd(1200), *usd(500), *usd(700)]
    assert [*provider_row, "enforce"] in rows
    assert [*tenant_row, "enforce"] in rows
    assert 'href="/console/budgets"' in html
