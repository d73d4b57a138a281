"""Which errors mean "the store cannot be reached or used", by class: the one place that says
so. Every caller that runs SQL translates with :func:`is_unavailable` into ``StoreUnavailable``
(503 ``store_unavailable``, fail closed); any other error is a statement's own result (a
unique or check violation, a syntax error: handled where it is expected, else a bug).

    unavailable
    ├── no connection          OSError (TimeoutError, asyncio's included; ConnectionError...),
    │                          asyncpg's InterfaceError and InternalClientError
    ├── SQLSTATE 08            connection exception (the connection broke or never opened)
    ├── SQLSTATE 28            invalid authorization: a revoked login, a rotated password
    ├── SQLSTATE 53            insufficient resources: too many connections, disk full
    ├── SQLSTATE 57            operator intervention: admin or crash shutdown, cannot connect
    │                          now, statement cancelled (a timeout), database dropped
    ├── SQLSTATE 58            system error outside PostgreSQL (I/O)
    ├── while connecting       any error PostgreSQL sends before a statement of opgate's
    │                          ran, e.g. 55000 "database ... is not currently accepting
    │                          connections" (ALLOW_CONNECTIONS false), 3D000 no such
    │                          database; on a statement, 55000 is the statement's own
    └── not a primary          25006 read-only transaction (a standby, or a read-only
                               default), and a recovery conflict ("... due to conflict with
                               recovery", 40001/40P01 on a hot standby): the connection is
                               dropped (:func:`drops_connection`) so that the pool connects
                               again, to the new primary when the DSN names it.
"""

from __future__ import annotations

import asyncpg

# SQLSTATE classes (the first two characters) whose every condition means the store, not the
# statement: https://www.postgresql.org/docs/current/errcodes-appendix.html
_UNAVAILABLE_CLASSES = frozenset({"08", "28", "53", "57", "58"})
_READ_ONLY = "25006"
# A hot standby cancels a statement that conflicts with replay: serialization_failure or
# deadlock_detected by SQLSTATE, told apart from a primary's own by the message.
_RECOVERY_CONFLICT_STATES = frozenset({"40001", "40P01"})
_RECOVERY_CONFLICT = "conflict with recovery"
_NO_CONNECTION = (
    OSError,  # TimeoutError (asyncio's too) and ConnectionError included
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)


def _sqlstate(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None) if isinstance(exc, asyncpg.PostgresError) else None
    return state if isinstance(state, str) else ""


def drops_connection(exc: BaseException) -> bool:
    """The connection reached a server that is not a writable primary (a standby, a read-only
    database, a recovery conflict): end it, so that the pool's next connection is made anew."""
    state = _sqlstate(exc)
    return state == _READ_ONLY or (
        state in _RECOVERY_CONFLICT_STATES and _RECOVERY_CONFLICT in str(exc)
    )


def is_unavailable(exc: BaseException, *, connecting: bool = False) -> bool:
    """Whether ``exc`` means the store cannot be reached or used (see the module's tree).
    ``connecting``: raised while opening a connection (the pool's connect and login), where
    no statement of opgate's ran: every error PostgreSQL sends then is the store's."""
    if isinstance(exc, _NO_CONNECTION):
        return True
    state = _sqlstate(exc)
    if not state:
        return False
    if connecting:
        return True
    return state[:2] in _UNAVAILABLE_CLASSES or drops_connection(exc)
