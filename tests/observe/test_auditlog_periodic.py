"""The periodic rounds of the checkpointer and the integrator."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from proxy.errors import StoreUnavailable
from proxy.observe.auditlog.periodic import Periodic


async def test_an_expected_failure_is_logged_and_the_job_runs_again() -> None:
    """A round that fails as expected (the store down) is one warning; the next round runs."""
    rounds: list[int] = []
    third = asyncio.Event()

    async def job() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 3:
            third.set()
        if len(rounds) < 3:
            raise StoreUnavailable("the store is down")

    periodic = Periodic("test-rounds", 0.001, job, (StoreUnavailable,), "test_rounds_failed")
    with capture_logs() as logs:
        periodic.start()
        await asyncio.wait_for(third.wait(), 10)
        await periodic.close()
    failures = [entry for entry in logs if entry["event"] == "test_rounds_failed"]
    assert [entry["error"] for entry in failures] == ["the store is down"] * 2
    assert len(rounds) >= 4  # the three rounds, and the last one on close


async def test_close_runs_the_job_once_more_and_keeps_quiet_about_an_expected_failure() -> None:
    """Closed before its first interval: the job runs once, on close; its expected failure
    is not raised (the process is stopping)."""
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        raise StoreUnavailable("the store is down")

    periodic = Periodic("test-rounds", 3600, job, (StoreUnavailable,), "test_rounds_failed")
    periodic.start()
    await periodic.close()
    assert calls == 1


async def test_an_unexpected_failure_is_not_swallowed_on_close() -> None:
    """Only the failures named as expected are suppressed."""

    async def job() -> None:
        raise ValueError("a bug")

    periodic = Periodic("test-rounds", 3600, job, (StoreUnavailable,), "test_rounds_failed")
    with pytest.raises(ValueError, match="a bug"):
        await periodic.close()
