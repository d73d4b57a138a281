"""opgate's exceptions: "could not decide" or "could not forward". A rejection is not one of
these; it is a ``Deny`` value (decision.py).

    OpgateError
    ├── StoreUnavailable          the primary cannot be reached or did not answer in time
    ├── ConfigurationError        settings or credentials are missing or invalid
    │   ├── ListenFailed          a listener's address cannot be bound (in use, not this host's)
    │   └── ReplicationNotDurable  asynchronous standbys, not accepted by a setting
    ├── IdempotencyKeyInUse       another operation of the provider holds that key
    ├── AlreadySuperseded         another operation already supersedes that one
    └── UpstreamError             the provider exchange did not produce a complete answer
        ├── UpstreamNotSent       the connection never opened: no byte of the request left
        ├── UpstreamTimeout       sent (perhaps), no complete answer in time
        ├── UpstreamDropped       the connection broke after the request may have left
        └── UpstreamTruncated     the answer was larger than the policy allows

Third-party errors (asyncpg, aiohttp, OSError) are translated at the module that calls them.
"""

from __future__ import annotations


class OpgateError(Exception):
    pass


class StoreUnavailable(OpgateError):
    pass


def store_unavailable_line(exc: StoreUnavailable) -> str:
    """What a command that cannot reach or use the database prints, alone, before exit 2: the
    driver's sentence (it names the host, the role or the database, never the password) on one
    line, and no traceback."""
    return "opgate: the database is unavailable: " + " ".join(str(exc).split())


class ConfigurationError(OpgateError):
    pass


class ListenFailed(ConfigurationError):
    """A listener's address cannot be bound (in use, not this host's, not permitted): said in
    one line naming the address and the setting that gave it."""

    def __init__(self, address: str, setting: str, cause: OSError) -> None:
        reason = (cause.strerror or str(cause)).lower()
        super().__init__(f"cannot listen on {address} ({setting}): {reason}")


class ReplicationNotDurable(ConfigurationError):
    """The database's replication can lose an acknowledged claim in a failover, and the
    operator has not accepted that (``accept_async_replication``): said in one line."""


class IdempotencyKeyInUse(OpgateError):
    pass


class AlreadySuperseded(OpgateError):
    pass


class UpstreamError(OpgateError):
    pass


class UpstreamNotSent(UpstreamError):
    pass


class UpstreamTimeout(UpstreamError):
    pass


class UpstreamDropped(UpstreamError):
    pass


class UpstreamTruncated(UpstreamError):
    pass
