"""Fixtures shared by the whole suite: real PostgreSQL, localstripe, the fault provider, opgate."""

pytest_plugins = [
    "tests.support.postgres",
    "tests.support.localstripe_server",
    "tests.support.fault_provider",
    "tests.support.opgate",
]
