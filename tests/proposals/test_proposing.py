"""The cap on what waits for a human (proxy.proposals.proposing.py ``pending_cap_problem``):
pure, table-driven."""

from __future__ import annotations

import pytest

from proxy.proposals.proposing import pending_cap_problem
from proxy.settings import Settings
from proxy.store.proposal import PendingProposals

SETTINGS = Settings(max_pending_proposals_per_agent=3, max_pending_proposals_per_tenant=5)


@pytest.mark.parametrize(
    ("scenario", "waiting", "refused", "retry_after"),
    [
        ("below both caps", PendingProposals(2, 4, 30.0, 10.0), None, None),
        ("the agent's cap reached", PendingProposals(3, 3, 30.2, 30.2), "agent has 3", 31),
        ("the tenant's cap reached", PendingProposals(1, 5, 900.0, 12.0), "tenant has 5", 12),
        ("a far expiry is told as a minute", PendingProposals(3, 3, 86000.0, 86000.0), "3", 60),
        ("an expiry this second", PendingProposals(3, 3, 0.2, 0.2), "agent has 3", 1),
    ],
)
def test_pending_cap(
    scenario: str,
    waiting: PendingProposals,
    refused: str | None,
    retry_after: int | None,
) -> None:
    """Refused 429 rate_limited once a cap is reached, Retry-After the first expiry (1-60 s)."""
    problem = pending_cap_problem(waiting, SETTINGS)
    if refused is None:
        assert problem is None, scenario
        return
    assert problem is not None, scenario
    assert (problem.status, problem.code, problem.retry_after) == (
        429,
        "rate_limited",
        retry_after,
    )
    assert refused in problem.detail


def test_no_tenant_cap() -> None:
    """max_pending_proposals_per_tenant null: only the agent's cap counts."""
    settings = Settings(max_pending_proposals_per_tenant=None)
    assert pending_cap_problem(PendingProposals(19, 10_000, 5.0, 5.0), settings) is None
