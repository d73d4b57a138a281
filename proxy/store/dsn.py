"""Whether a ``database_url`` follows the primary: checked once when opgate starts.

opgate writes (every claim, every settle), so it must only ever be connected to the primary.
With several hosts, asyncpg tries them in order and takes the first that answers: without
``target_session_attrs=read-write`` (or ``primary``) that may be a standby, or the old primary
come back as one, and every write then fails. So several hosts without it are refused. With
one host, a promotion elsewhere is never followed: that is allowed (a managed service's single
endpoint, PgBouncer, a virtual IP move the host themselves) but said once, as a warning.

The hosts are counted the way asyncpg reads them: the URL's netloc (``h1:5432,h2:5432``), else
the ``host=`` query parameter (a unix-socket directory is a host too), else ``PGHOST``; the
attribute from the ``target_session_attrs`` query parameter, else ``PGTARGETSESSIONATTRS``.
A ``service=`` file is not read. The embedded default (no ``database_url``) is not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit

from proxy.errors import ConfigurationError

# What asyncpg accepts (connect_utils.SessionAttribute): opgate may use only the first two.
_FOLLOWS_PRIMARY = ("read-write", "primary")
_ACCEPTED = (*_FOLLOWS_PRIMARY, "any", "standby", "prefer-standby", "read-only")


def database_hosts(dsn: str, environment: Mapping[str, str]) -> list[str]:
    """The hosts (host, host:port, or a socket directory) a DSN names, in asyncpg's order of
    precedence."""
    parts = urlsplit(dsn)
    hostspec = parts.netloc.rpartition("@")[2]
    if not hostspec:
        hostspec = _query(dsn).get("host") or environment.get("PGHOST", "")
    return [host for host in hostspec.split(",") if host]


def session_attrs(dsn: str, environment: Mapping[str, str]) -> str:
    """The ``target_session_attrs`` asyncpg will use (its default: ``any``)."""
    return _query(dsn).get("target_session_attrs") or environment.get("PGTARGETSESSIONATTRS", "any")


def check_follows_primary(dsn: str, environment: Mapping[str, str]) -> str | None:
    """None when ``dsn`` follows the primary across a failover; a warning when it names one
    host; ConfigurationError (a sentence, never the URL: it may hold a password) when it
    names several without ``target_session_attrs=read-write`` or ``primary``, or asks for a
    standby."""
    attrs = session_attrs(dsn, environment)
    if attrs not in _ACCEPTED:
        raise ConfigurationError(
            f"database_url: target_session_attrs={attrs!r} is not one of {', '.join(_ACCEPTED)}"
        )
    if attrs not in (*_FOLLOWS_PRIMARY, "any"):
        raise ConfigurationError(
            f"database_url: target_session_attrs={attrs} would connect to a standby; opgate "
            "writes, so it needs read-write (or primary)"
        )
    hosts = database_hosts(dsn, environment)
    if len(hosts) > 1 and attrs not in _FOLLOWS_PRIMARY:
        raise ConfigurationError(
            f"database_url names {len(hosts)} hosts without target_session_attrs=read-write "
            "(or primary): opgate could connect to a standby and refuse every write"
        )
    if len(hosts) <= 1:
        return (
            "database_url names one host: opgate follows a failover only if that address moves "
            "to the new primary (give every host and target_session_attrs=read-write to follow "
            "a promotion)"
        )
    return None


def _query(dsn: str) -> dict[str, str]:
    """The query parameters, the last of a repeated one winning (as asyncpg reads them)."""
    try:
        parsed = parse_qs(urlsplit(dsn).query, keep_blank_values=True)
    except ValueError:
        return {}
    return {key: values[-1] for key, values in parsed.items()}
