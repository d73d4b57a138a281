"""The official MCP conformance suite against opgate's endpoint: every server scenario of the
pinned suite, each outcome compared with tests/mcp/conformance/expected.yaml (pass, or the
documented reason it does not apply, naming the checks that fail or warn). Skipped, saying
how to install them, without Node.js 22+ or the suite (tests/mcp/conformance/install.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mcp_conformance import (
    SUITE_BIN,
    expected,
    expected_outcome,
    node,
    outcome,
    run_suite,
    token_relay,
)
from tests.support.opgate import AGENT_TOKEN, SHIPPED_POLICIES, StartOpgate

NODE = node()
pytestmark = pytest.mark.skipif(
    NODE is None or not SUITE_BIN.exists(),
    reason="Node.js 22+ or the MCP conformance suite is not installed "
    "(tests/mcp/conformance/install.sh installs both)",
)


async def test_every_scenario_of_the_suite_ends_as_expected(
    start_opgate: StartOpgate, localstripe_url: str, tmp_path: Path
) -> None:
    """Each scenario the suite runs is named in expected.yaml, and fails or warns on exactly
    the checks named there (none for a pass)."""
    assert NODE is not None
    async with (
        token_relay(AGENT_TOKEN) as relay,
        start_opgate(
            policy_dir=SHIPPED_POLICIES,
            upstream_overrides={"stripe": localstripe_url},
            # the suite's own loopback origin (its DNS-rebinding case); any other is refused
            mcp_allowed_origins=[relay.origin],
            console_url="https://console.example.test/console",
        ) as gate,
    ):
        relay.target = f"{gate.agent_url}/_opgate/mcp"
        run = await run_suite(NODE, relay.url, tmp_path / "results", "--suite", "all")
    stated = expected()["scenarios"]
    assert run.scenarios, run.output
    assert sorted(run.scenarios) == sorted(stated), run.output
    found = {name: outcome(checks) for name, checks in run.scenarios.items()}
    want = {name: expected_outcome(entry) for name, entry in stated.items()}
    differing = {name: found[name] for name in found if found[name] != want[name]}
    assert differing == {}, "\n".join(
        f"{name}: found {found[name]}, expected {want[name]}" for name in differing
    )
