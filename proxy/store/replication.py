"""Whether a commit on opgate's database survives a failover: the decision, without IO.

A claim is durable where a failover can go only if the commit that made it reached a standby
before it was acknowledged: ``synchronous_standby_names`` names standbys, one of them is
connected as ``sync`` or ``quorum`` (``pg_stat_replication``), and ``synchronous_commit`` is at
least ``remote_write``. With asynchronous standbys only, a promoted standby can lack a claim
whose request had already left: the operation is back at ``created`` and is sent again (measured:
11 second effects in 22 failovers). A single node has no failover to lose a commit to.

:func:`judge` reads :class:`ReplicationFacts` (queries.sql ``replication_state``) and says what
opgate does about them: at start (:attr:`Verdict.refuse_start`), in ``/readyz``
(:attr:`Verdict.ready`, :attr:`Verdict.note`) and, judged again every
``replication_check_seconds`` while running, to claims (:attr:`Verdict.refuses_claims`):
replication made asynchronous under a running opgate (``synchronous_standby_names`` cleared,
``synchronous_commit`` set to ``local``) is refused as it is at start, until it is synchronous
again.

Reading other roles' rows of ``pg_stat_replication`` (the walsenders' ``state`` and
``sync_state``) needs ``pg_monitor`` (or ``pg_read_all_stats``); without it they read NULL, and
the verdict is :attr:`Durability.UNVERIFIED` (docs/running-ha.md). ``/readyz``'s heartbeat
commit still proves that commits are acknowledged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Durability", "ReplicationFacts", "Standby", "Verdict", "facts_from_row", "judge"]

# synchronous_commit levels at which a commit waits for a synchronous standby.
_WAITS_FOR_STANDBY = frozenset({"remote_write", "on", "remote_apply"})
_SYNC_STATES = frozenset({"sync", "quorum"})


class Durability(StrEnum):
    SINGLE_NODE = "single_node"  # no standby, no synchronous names: nothing to fail over to
    SYNCHRONOUS = "synchronous"  # a sync/quorum standby acknowledges every commit
    ASYNCHRONOUS = "asynchronous"  # standbys that may lack an acknowledged commit
    SYNC_STANDBY_MISSING = "sync_standby_missing"  # names set, none connected: commits hang
    UNVERIFIED = "unverified"  # standbys whose state this role may not read (pg_monitor)


@dataclass(frozen=True)
class Standby:
    application_name: str | None
    state: str | None  # NULL without pg_monitor
    sync_state: str | None  # NULL without pg_monitor


@dataclass(frozen=True)
class ReplicationFacts:
    in_recovery: bool
    synchronous_standby_names: str
    synchronous_commit: str
    standbys: tuple[Standby, ...]


@dataclass(frozen=True)
class Verdict:
    durability: Durability
    note: str  # one sentence for the log and /readyz's body
    refuse_start: bool  # asynchronous replication not accepted by the operator
    ready: bool  # False: /readyz answers 503

    @property
    def refuses_claims(self) -> bool:
        """Claims are refused (503, nothing sent) while it holds: replication that became
        asynchronous at run time, not accepted. (A synchronous standby missing needs no
        refusal: every claim's commit waits for one, and ends 503 on its own.)"""
        return self.refuse_start


def facts_from_row(
    in_recovery: bool, standby_names: str, synchronous_commit: str, standbys_json: str
) -> ReplicationFacts:
    """The facts from queries.sql ``replication_state``'s columns."""
    standbys = tuple(
        Standby(s.get("application_name"), s.get("state"), s.get("sync_state"))
        for s in json.loads(standbys_json)
    )
    return ReplicationFacts(in_recovery, standby_names.strip(), synchronous_commit, standbys)


def judge(facts: ReplicationFacts, *, accept_async: bool) -> Verdict:
    """What opgate does about these facts (module docstring)."""
    if facts.in_recovery:
        return Verdict(
            Durability.UNVERIFIED,
            "the database is a standby; opgate writes only to the primary",
            refuse_start=False,
            ready=False,
        )
    names_set = facts.synchronous_standby_names not in ("", "''")
    if not names_set and not facts.standbys:
        return Verdict(
            Durability.SINGLE_NODE,
            "single PostgreSQL node (no standby, synchronous_standby_names empty): "
            "not highly available, and no failover can lose a claim",
            refuse_start=False,
            ready=True,
        )
    if not names_set:
        return _asynchronous(
            f"{len(facts.standbys)} asynchronous standby(s) and synchronous_standby_names "
            "empty: a failover can lose a claim whose request has left, and send it again",
            accept_async,
        )
    if facts.synchronous_commit not in _WAITS_FOR_STANDBY:
        return _asynchronous(
            f"synchronous_commit is {facts.synchronous_commit!r}: approvals and settles are "
            "not replicated before they are acknowledged (claims set their own), so a "
            "failover can lose them",
            accept_async,
        )
    synchronous = [s for s in facts.standbys if s.sync_state in _SYNC_STATES]
    if any(s.state == "streaming" for s in synchronous):
        names = ", ".join(sorted(str(s.application_name) for s in synchronous))
        return Verdict(
            Durability.SYNCHRONOUS,
            f"commits are synchronously replicated (to {names})",
            refuse_start=False,
            ready=True,
        )
    if facts.standbys and all(s.sync_state is None for s in facts.standbys):
        return Verdict(
            Durability.UNVERIFIED,
            "standbys are connected but this role cannot read their state in "
            "pg_stat_replication (grant it pg_monitor); readiness relies on the heartbeat commit",
            refuse_start=False,
            ready=True,
        )
    return Verdict(
        Durability.SYNC_STANDBY_MISSING,
        f"synchronous_standby_names is {facts.synchronous_standby_names!r} but no synchronous "
        "standby is streaming: commits wait until one is",
        refuse_start=False,
        ready=False,
    )


def _asynchronous(why: str, accept_async: bool) -> Verdict:
    if accept_async:
        return Verdict(
            Durability.ASYNCHRONOUS,
            why + " (accepted: accept_async_replication)",
            refuse_start=False,
            ready=True,
        )
    return Verdict(
        Durability.ASYNCHRONOUS,
        why + "; set accept_async_replication (OPGATE_ACCEPT_ASYNC_REPLICATION=true) to run "
        "anyway, or make a standby synchronous (docs/running-ha.md)",
        refuse_start=True,
        ready=False,  # appeared at run time: no claim is taken until it is synchronous again
    )
