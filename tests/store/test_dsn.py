"""Whether a database_url follows the primary (proxy/store/dsn.py): several hosts need
target_session_attrs=read-write or primary, one host is a warning, a standby is refused."""

from __future__ import annotations

import pytest

from proxy.errors import ConfigurationError
from proxy.store.dsn import check_follows_primary, database_hosts

OK, WARN, REFUSE = "ok", "warn", "refuse"

# (scenario, dsn, environment, expected)
CASES = [
    (
        "netloc_two_hosts_read_write",
        "postgresql://u:p@h1:1,h2:2/db?target_session_attrs=read-write",
        {},
        OK,
    ),
    (
        "netloc_two_hosts_primary",
        "postgresql://u@h1:1,h2:2/db?target_session_attrs=primary",
        {},
        OK,
    ),
    ("netloc_two_hosts_none", "postgresql://u:p@h1:1,h2:2/db", {}, REFUSE),
    ("netloc_two_hosts_any", "postgresql://u@h1:1,h2:2/db?target_session_attrs=any", {}, REFUSE),
    (
        "netloc_two_hosts_prefer_standby",
        "postgres://u@h1,h2/db?target_session_attrs=prefer-standby",
        {},
        REFUSE,
    ),
    ("netloc_ipv6_two_hosts_none", "postgresql://u@[::1]:1,[::2]:2/db", {}, REFUSE),
    ("query_hosts_none", "postgresql:///db?host=h1,h2&port=1,2", {}, REFUSE),
    (
        "query_hosts_read_write",
        "postgresql:///db?host=h1,h2&target_session_attrs=read-write",
        {},
        OK,
    ),
    ("unix_sockets_two", "postgresql:///db?host=/run/a,/run/b", {}, REFUSE),
    ("unix_socket_one", "postgresql:///db?host=/run/postgresql", {}, WARN),
    ("one_host", "postgresql://u:p@db.internal:5432/opgate", {}, WARN),
    (
        "one_host_read_write",
        "postgresql://u@db:5432/opgate?target_session_attrs=read-write",
        {},
        WARN,
    ),
    ("one_host_standby", "postgresql://u@db/opgate?target_session_attrs=standby", {}, REFUSE),
    ("one_host_read_only", "postgresql://u@db/opgate?target_session_attrs=read-only", {}, REFUSE),
    ("unknown_attrs", "postgresql://u@h1,h2/db?target_session_attrs=readwrite", {}, REFUSE),
    ("no_host_pghost_two", "postgresql:///db", {"PGHOST": "h1,h2"}, REFUSE),
    (
        "no_host_pghost_two_env_attrs",
        "postgresql:///db",
        {"PGHOST": "h1,h2", "PGTARGETSESSIONATTRS": "read-write"},
        OK,
    ),
    (
        "env_attrs_overridden_by_url",
        "postgresql://h1,h2/db?target_session_attrs=any",
        {"PGTARGETSESSIONATTRS": "read-write"},
        REFUSE,
    ),
    ("netloc_wins_over_pghost", "postgresql://u@h1/db", {"PGHOST": "h1,h2"}, WARN),
    ("no_host_at_all", "postgresql:///db", {}, WARN),
]


@pytest.mark.parametrize(
    ("dsn", "environment", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_dsn_check(dsn: str, environment: dict[str, str], expected: str) -> None:
    """Several hosts follow the primary only with read-write/primary; one host warns; a
    standby's attributes or an unknown value are refused, never naming the URL."""
    if expected == REFUSE:
        with pytest.raises(ConfigurationError) as refused:
            check_follows_primary(dsn, environment)
        assert ":p@" not in str(refused.value)
        assert "//" not in str(refused.value)
        assert "\n" not in str(refused.value)
    else:
        warning = check_follows_primary(dsn, environment)
        assert (warning is not None) == (expected == WARN), warning


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:p@h1:1,h2:2/db?target_session_attrs=read-write",
        "postgresql:///db?host=h1,h2,h3&port=1,2,3",
        "postgresql:///db?host=/run/a",
        "postgresql://u@[::1]:1,[::2]:2/db",
    ],
)
def test_the_hosts_counted_are_asyncpgs(dsn: str) -> None:
    """The hosts counted are the hosts asyncpg will try (its own DSN parser, private, as the
    reference)."""
    from asyncpg import connect_utils

    addrs, _params = connect_utils._parse_connect_dsn_and_args(  # type: ignore[attr-defined]
        dsn=dsn,
        host=None,
        port=None,
        user=None,
        password=None,
        passfile=None,
        database=None,
        ssl=None,
        service=None,
        servicefile=None,
        direct_tls=None,
        server_settings=None,
        target_session_attrs=None,
        krbsrvname=None,
        gsslib=None,
    )
    assert len(database_hosts(dsn, {})) == len(addrs)
