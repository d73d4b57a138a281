"""Whether a promotion can have lost an acknowledged claim: the proof, without IO.

A claim is lost by a failover when its commit was acknowledged (so its request left) and the
promoted standby does not have the commit. A standby's WAL is a prefix of its primary's, and
a promoted standby replays every record it received before it ends recovery, so it has every
commit up to where it stopped receiving (its fork point); what it can lack is only commits
after that. With synchronous replication, the old primary acknowledged a commit only once the
standbys ``synchronous_standby_names`` required had confirmed it (a claim waits at least at
``on``, whatever the server says: queries.sql claim_operation). So if the promoted standby
was one that every commit needed, nothing was acknowledged after its fork point (it confirmed
nothing more), and nothing can have been lost: the operations need no lookup before their next
send (queries.sql timeline_seen marks none).

The promoted standby must be provably that standby, from what it holds itself:

1. the last synchronous witness it received from the timeline opgate wrote on before
   (queries.sql record_sync_witness, written at every replication judgement: the old
   primary's ``synchronous_standby_names`` and the WAL senders connected then), and the
   switch is to the next timeline (no timeline between that opgate never saw);
2. ``synchronous_standby_names`` there requires every name it lists (``FIRST n`` or
   ``ANY n`` with n at least the number of names; one plain name), with no ``*``; and no
   server-side ``statement_timeout`` applied to opgate's connections (a timeout, like any
   cancel, ends a commit's wait for its standby, and PostgreSQL then acknowledges the
   commit with only a warning; opgate's own deadline is the client's, and a claim it cuts
   short is never sent);
3. this server received its WAL by streaming (``pg_last_wal_receive_lsn()`` is kept after the
   promotion), under an ``application_name`` given in its own ``primary_conninfo`` (readable
   with ``pg_read_all_settings``, part of ``pg_monitor``), that is one of the required names,
   and at most one WAL sender of that name was connected (names are not unique: another
   standby of the same name could have confirmed instead).

What it cannot see: a change after its last witness (the setting reloaded to drop it, or a
second standby of its name connecting) within one ``replication_check_seconds`` of its
losing the stream, followed by acknowledged claims and its promotion. An HA manager that
promotes only the standby it kept synchronous (Patroni's ``synchronous_mode``) never does
that; docs/running-ha.md says what to avoid.

Otherwise every unsettled operation is marked, as before (migration 0014).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import parse_qs, urlsplit

__all__ = ["Proof", "SwitchFacts", "SyncWitness", "prove", "required_standbys", "streamed_as"]

# The name a WAL sender takes is the application_name, at most NAMEDATALEN - 1 bytes.
_NAME_LIMIT = 63
_TOKEN = re.compile(r'\s*(?:("(?:[^"]|"")*")|([()*,])|([^\s(),"*]+))')


@dataclass(frozen=True)
class SyncWitness:
    """The old primary's synchronous settings as the promoted standby last received them."""

    timeline: int
    standby_names: str  # synchronous_standby_names
    wal_senders: tuple[str | None, ...]  # application_name of each connected (None: unreadable)
    statement_timeout: str  # opgate's connections' server-side timeout ("0": none)
    recorded_at: datetime


@dataclass(frozen=True)
class SwitchFacts:
    """What the promoted server holds about its promotion (queries.sql timeline_facts)."""

    current: int  # the timeline it writes on
    previous: int  # the greatest timeline opgate recorded before
    witness: SyncWitness | None  # the last witness of ``previous`` it has
    streamed: bool  # it received WAL by streaming (pg_last_wal_receive_lsn() is set)
    primary_conninfo: str | None  # None: not set, or this role may not read it


@dataclass(frozen=True)
class Proof:
    nothing_lost: bool
    why: str  # one sentence for the log and timelines.unmarked_because


def prove(facts: SwitchFacts) -> Proof:
    """Whether this switch provably lost no acknowledged claim (module docstring)."""
    w = facts.witness
    if w is None:
        return Proof(False, f"no synchronous witness of timeline {facts.previous}")
    if facts.current != facts.previous + 1:
        return Proof(False, f"timeline {facts.current} does not follow {facts.previous} directly")
    required = required_standbys(w.standby_names)
    if not required:
        return Proof(
            False,
            f"synchronous_standby_names was {w.standby_names!r}: no standby was needed by "
            "every commit",
        )
    if w.statement_timeout != "0":
        return Proof(
            False,
            f"statement_timeout was {w.statement_timeout!r}: a cancelled wait for the standby "
            "acknowledges the commit without it",
        )
    if not facts.streamed:
        return Proof(False, "this server did not receive its WAL by streaming")
    name = streamed_as(facts.primary_conninfo)
    if name is None:
        return Proof(
            False,
            "no application_name readable in this server's primary_conninfo (pg_monitor)",
        )
    if name not in required:
        return Proof(
            False,
            f"this server streamed as {name!r}, not among the standbys every commit needed "
            f"({', '.join(sorted(required))})",
        )
    if any(sender is None for sender in w.wal_senders):
        return Proof(False, "the WAL senders' names were not readable (pg_monitor)")
    namesakes = sum(1 for sender in w.wal_senders if _folded(sender or "") == name)
    if namesakes > 1:
        return Proof(False, f"{namesakes} standbys streamed as {name!r}")
    return Proof(
        True,
        f"this server ({name!r}) confirmed every commit of timeline {facts.previous} "
        f"(synchronous_standby_names {w.standby_names!r}, witnessed at "
        f"{w.recorded_at.isoformat()})",
    )


def required_standbys(standby_names: str) -> frozenset[str]:
    """The names (case-folded, as PostgreSQL compares them) that every commit must be
    confirmed by under this ``synchronous_standby_names``; empty where none is (no names, a
    ``*``, fewer required than listed) or where the value cannot be read as PostgreSQL's
    grammar: ``name [, ...]``, ``[FIRST] n (name [, ...])``, ``ANY n (name [, ...])``."""
    tokens = _tokens(standby_names)
    if tokens is None or not tokens:
        return frozenset()
    count = 1
    keyword = tokens[0][0] == "word" and tokens[0][1].upper() in ("FIRST", "ANY")
    if keyword:
        tokens = tokens[1:]
        if not tokens or tokens[0][0] != "word" or not tokens[0][1].isdigit():
            return frozenset()  # FIRST and ANY take a number of standbys
    if tokens[0][0] == "word" and tokens[0][1].isdigit() and len(tokens) > 1:
        if tokens[1] != ("punct", "(") or tokens[-1] != ("punct", ")"):
            return frozenset()
        count = int(tokens[0][1])
        tokens = tokens[2:-1]
    names: list[str] = []
    expect_name = True
    for kind, text in tokens:
        if expect_name and kind in ("word", "quoted"):
            names.append(text)
        elif expect_name and kind == "punct" and text == "*":
            return frozenset()  # any standby may confirm
        elif not expect_name and (kind, text) == ("punct", ","):
            pass
        else:
            return frozenset()
        expect_name = not expect_name
    if expect_name or not names or "*" in names:
        return frozenset()
    folded = frozenset(_folded(n) for n in names)
    return folded if count >= len(folded) else frozenset()


def streamed_as(primary_conninfo: str | None) -> str | None:
    """The ``application_name`` a standby streamed under, case-folded, if its
    ``primary_conninfo`` names one (``key=value`` or URI form); None otherwise (a default
    would come from the server's environment, which cannot be read)."""
    if not primary_conninfo:
        return None
    text = primary_conninfo.strip()
    if text.startswith(("postgresql://", "postgres://")):
        values = parse_qs(urlsplit(text).query).get("application_name")
        name = values[-1] if values else None
    else:
        name = _conninfo_value(text, "application_name")
    if not name or not name.isascii():
        return None
    return _folded(name[:_NAME_LIMIT])


def _conninfo_value(conninfo: str, key: str) -> str | None:
    """The last value of ``key`` in a libpq ``key = value`` string (values single-quoted with
    backslash escapes, or bare); None if absent or unreadable."""
    found: str | None = None
    pattern = re.compile(r"\s*(\w+)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|([^\s']*))")
    pos = 0
    while pos < len(conninfo):
        if not conninfo[pos:].strip():
            break
        match = pattern.match(conninfo, pos)
        if match is None:
            return None
        quoted, bare = match.group(2), match.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        if match.group(1) == key:
            found = value
        pos = match.end()
    return found


def _tokens(text: str) -> list[tuple[str, str]] | None:
    tokens: list[tuple[str, str]] = []
    pos = 0
    while text[pos:].strip():
        match = _TOKEN.match(text, pos)
        if match is None:
            return None
        quoted, punct, word = match.groups()
        if quoted is not None:
            tokens.append(("quoted", quoted[1:-1].replace('""', '"')))
        elif punct is not None:
            tokens.append(("punct", punct))
        else:
            tokens.append(("word", word))
        pos = match.end()
    return tokens


def _folded(name: str) -> str:
    # PostgreSQL compares standby names with pg_strcasecmp: ASCII letters only.
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
