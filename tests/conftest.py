"""Fixtures shared by the whole suite: real PostgreSQL, localstripe, the fault provider, opgate."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Mapping
from types import FrameType

import pytest

# Before any test module imports the x402 SDK's EVM code: proxy.x402 imports py_ecc keeping the
# recursion limit it would raise to 100,000 (under which deeply nested JSON crashes a test
# process instead of raising RecursionError; proxy/x402/__init__.py says why).
import proxy.x402  # noqa: F401

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


# What makes a test slow here: a real server or process started for it (PostgreSQL, opgate,
# the providers' fakes, a standby cluster, a browser). `--quick` leaves out every test that
# asks for one of these fixtures, every test marked `slow`, and the modules of SLOW_MODULES
# (they start processes of their own: opgate's CLI, an embedded server, a cluster); what
# remains is the pure and in-process part of the suite. The whole suite is still `./dev test`.
SLOW_FIXTURES = frozenset(
    {
        "pg_server_dsn",
        "pg_template",
        "database_url",
        "localstripe_url",
        "fault_provider",
        "start_opgate",
        "cluster",
        "relay",
        "receiver",
        "stripe_gate",
        "fault_gate",
        "paypal_gate",
        "square_gate",
        "adyen_gate",
    }
)


SLOW_MODULES = (
    "tests/test_cli.py",
    "tests/test_conftest.py",
    "tests/test_deploy.py",
    "tests/authoring/test_commands.py",
    "tests/faults/",
    "tests/observe/test_auditlog_review.py",
    "tests/observe/test_auditlog_tlog_cli.py",
    "tests/store/test_embedded.py",
    "tests/store/test_timelines.py",
    "tests/support/test_cluster.py",
    "tests/support/test_localstripe_server.py",
)


def _is_slow(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0]
    return (
        item.get_closest_marker("slow") is not None
        or path.startswith(SLOW_MODULES)
        or bool(SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    )


if os.environ.get("OPGATE_EVENT_LOOP", "asyncio") != "asyncio":
    # Only when asked for: with this hook pytest-asyncio parametrizes a session fixture with
    # the loop factory for async tests only, so a synchronous test that uses an async fixture
    # (database_url) between two async ones tore down every session fixture above it ("The
    # fixture value for 'pg_template' is not available"). Without it the in-process tests run
    # on asyncio's own loop; the opgate processes they start run on the server's default
    # (``event_loop: uvloop``) unless OPGATE_EVENT_LOOP names one (tests/support/environment.py).

    def pytest_asyncio_loop_factories(
        config: pytest.Config, item: pytest.Item
    ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
        """Every in-process test runs on the event loop ``OPGATE_EVENT_LOOP`` names, so that
        forward mode's tunnels, the listeners and the clients are tested on the loop a server
        would run on (``OPGATE_EVENT_LOOP=uvloop ./dev test``)."""
        return _LOOP_FACTORIES

    from proxy.server import event_loop_factory

    _LOOP_FACTORIES = {
        os.environ["OPGATE_EVENT_LOOP"]: event_loop_factory(os.environ["OPGATE_EVENT_LOOP"])
    }


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="only the tests that start no server or process (about a minute; see SLOW_FIXTURES)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--quick"):
        return
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        (left_out if _is_slow(item) else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: starts a server or process without a fixture; left out by --quick"
    )
    # A run stopped by SIGTERM (a CI timeout, `timeout`) unwinds as Ctrl-C does: pytest's
    # teardown then stops what the session started (the embedded PostgreSQL, PgBouncer,
    # opgate processes), which the signal's default action would leave running.
    signal.signal(signal.SIGTERM, _interrupted)
