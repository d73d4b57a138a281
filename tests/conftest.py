"""Fixtures shared by the whole suite: real PostgreSQL, localstripe, the fault provider, opgate."""

from __future__ import annotations

import signal
from types import FrameType

import pytest

pytest_plugins = [
    "tests.support.postgres",
    "tests.support.localstripe_server",
    "tests.support.fault_provider",
    "tests.support.opgate",
    "tests.support.cluster",
    "tests.support.crash_handoff",  # relay, crash_policy_dir, opgate_env
    "tests.support.webhooks",  # receiver
]


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped by SIGTERM (a CI timeout, `timeout`) unwinds as Ctrl-C does: pytest's
    # teardown then stops what the session started (the embedded PostgreSQL, PgBouncer,
    # opgate processes), which the signal's default action would leave running.
    signal.signal(signal.SIGTERM, _interrupted)
