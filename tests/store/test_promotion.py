"""The proof that a promotion lost no acknowledged claim (proxy/store/promotion.py), without IO:
which standbys every commit needed, which name a standby streamed under, and each condition
of the proof withheld in turn."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from proxy.store.promotion import SwitchFacts, SyncWitness, prove, required_standbys, streamed_as


@pytest.mark.parametrize(
    ("names", "required"),
    [
        ("", set()),
        ("a", {"a"}),
        ("A", {"a"}),  # compared as PostgreSQL does: ASCII case-insensitively
        ('"Standby A"', {"standby a"}),
        ("a, b", set()),  # FIRST 1 of two: b confirms when a is gone
        ("FIRST 1 (a)", {"a"}),
        ("first 2 (a, b)", {"a", "b"}),
        ("2 (a, b)", {"a", "b"}),
        ("FIRST 1 (a, b)", set()),
        ("ANY 1 (a, b)", set()),  # a quorum: either alone confirms
        ("ANY 2 (a, b)", {"a", "b"}),
        ("*", set()),
        ("FIRST 1 (*)", set()),
        ("ANY 1 (a, *)", set()),
        ('"*"', set()),
        ("FIRST 1 (a", set()),  # unreadable: nothing proven
        ("a,, b", set()),
        ("FIRST (a)", set()),
        ("ANY a", set()),
        ("FIRST", set()),
    ],
)
def test_required_standbys(names: str, required: set[str]) -> None:
    """Only names that every commit must be confirmed by count; anything else proves nothing."""
    assert required_standbys(names) == required


@pytest.mark.parametrize(
    ("conninfo", "name"),
    [
        (None, None),
        ("", None),
        ("host=127.0.0.1 port=5432 user=postgres", None),  # a default: from the environment
        ("host=db application_name=Standby_A port=5432", "standby_a"),
        ("application_name = 'b c' host=db", "b c"),
        (r"application_name='it\'s' host=db", "it's"),
        ("host=db application_name=a application_name=b", "b"),  # libpq: the last wins
        ("postgresql://rep@db:5432/?application_name=node2", "node2"),
        ("host='unterminated application_name=a", None),
        ("application_name=caf\u00e9", None),  # PostgreSQL would not keep it as written
    ],
)
def test_streamed_as(conninfo: str | None, name: str | None) -> None:
    """The application_name a standby streamed under, only where its own conninfo says it."""
    assert streamed_as(conninfo) == name


_PROVEN = SwitchFacts(
    current=3,
    previous=2,
    witness=SyncWitness(2, "FIRST 1 (node_b)", ("node_b",), "0", datetime(2026, 12, 6, tzinfo=UTC)),
    streamed=True,
    primary_conninfo="host=node_a port=5432 application_name=node_b",
)
_WITNESS = _PROVEN.witness
assert _WITNESS is not None


def test_a_standby_every_commit_needed_lost_nothing() -> None:
    """All conditions held: nothing lost, and the sentence names the standby."""
    proof = prove(_PROVEN)
    assert proof.nothing_lost
    assert "'node_b'" in proof.why


@pytest.mark.parametrize(
    ("scenario", "facts", "said"),
    [
        ("no witness", replace(_PROVEN, witness=None), "no synchronous witness"),
        ("a timeline skipped", replace(_PROVEN, current=4), "does not follow"),
        (
            "asynchronous",
            replace(_PROVEN, witness=replace(_WITNESS, standby_names="")),
            "no standby was needed",
        ),
        (
            "a quorum",
            replace(_PROVEN, witness=replace(_WITNESS, standby_names="ANY 1 (node_b, node_c)")),
            "no standby was needed",
        ),
        (
            "a server-side timeout",
            replace(_PROVEN, witness=replace(_WITNESS, statement_timeout="5s")),
            "statement_timeout",
        ),
        ("archive only", replace(_PROVEN, streamed=False), "by streaming"),
        ("conninfo unreadable", replace(_PROVEN, primary_conninfo=None), "pg_monitor"),
        (
            "another standby",
            replace(_PROVEN, primary_conninfo="host=node_a application_name=node_c"),
            "not among",
        ),
        (
            "senders unreadable",
            replace(_PROVEN, witness=replace(_WITNESS, wal_senders=(None,))),
            "not readable",
        ),
        (
            "two of its name",
            replace(_PROVEN, witness=replace(_WITNESS, wal_senders=("NODE_B", "node_b"))),
            "2 standbys streamed as",
        ),
    ],
)
def test_each_condition_withheld_proves_nothing(
    scenario: str, facts: SwitchFacts, said: str
) -> None:
    """Withhold any one part of the proof and the switch marks, with the reason said."""
    proof = prove(facts)
    assert not proof.nothing_lost, scenario
    assert said in proof.why, (scenario, proof.why)
