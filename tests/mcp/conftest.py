"""opgate with the shipped policies in front of localstripe, for the MCP tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

# The console tests' headless Chromium, for the approval where the agent asked.
from tests.console.conftest import chrome  # noqa: F401 (a fixture, found by name)

# The HTTP crash handoff's relay and opgate process settings, reused by the MCP one.
from tests.support.crash_handoff import (  # noqa: F401 (fixtures, found by name)
    crash_policy_dir,
    opgate_env,
    relay,
)
from tests.support.localstripe_server import create_charge
from tests.support.opgate import ADMIN_TOKEN, SHIPPED_POLICIES, Opgate, StartOpgate


@pytest_asyncio.fixture(loop_scope="session")
async def stripe_gate(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[Opgate]:
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"stripe": localstripe_url}
    ) as gate:
        yield gate


async def approved_refund(gate: Opgate, localstripe_url: str, **extra: Any) -> dict[str, Any]:
    """A 5.00 refund of a fresh 20.00 charge, approved through the operations API."""
    charge = await create_charge(localstripe_url, 2000)
    return await gate.approve(
        provider="stripe",
        action="refund.create",
        amount=500,
        currency=None,
        params={"charge": charge},
        **extra,
    )


async def revoke(gate: Opgate, operation_id: str) -> None:
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations/{operation_id}/revoke",
        json={"reason": "the customer withdrew the request"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        assert response.status == 200, await response.text()
