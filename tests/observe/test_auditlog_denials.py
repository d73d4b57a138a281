"""denials.py, pure: which denials are counted, per what key, per window, and what bounds the
rows a flood can produce."""

from __future__ import annotations

from typing import Any

from proxy.observe.auditlog.denials import DenialCounter, aggregable


def denial(source: str, reason: str = "agent_unauthenticated", **extra: Any) -> dict[str, Any]:
    return {
        "listener": "agent",
        "source": source,
        "decision": "deny",
        "reason": reason,
        "agent_id": None,
        "path": f"/p/{source}",
        "path_sha256": None,
        "time": "t",
        "response_status": 401,
        **extra,
    }


def test_only_denials_without_an_agent_are_counted() -> None:
    """An authenticated agent's denial, an allow or an error is never aggregable."""
    assert aggregable(denial("a"))
    assert not aggregable(denial("a", agent_id="agent-a"))
    assert not aggregable({**denial("a"), "decision": "error"})
    assert not aggregable({**denial("a"), "decision": "allow"})


def test_the_first_of_each_key_is_stored_whole_and_the_rest_counted() -> None:
    """Per (listener, source, reason): the first is stored, the repeats counted in one record."""
    counter = DenialCounter(window_seconds=10)
    folded = [counter.fold(denial("a"), 0.0) for _ in range(3)]
    folded += [counter.fold(denial("a", reason="no_route"), 1.0)]
    folded += [counter.fold(denial("b"), 2.0), counter.fold(denial("b"), 3.0)]
    assert folded == [False, True, True, False, False, True]
    closed = counter.close()
    assert sorted((r["source"], r["reason"], r["count"]) for r in closed) == [
        ("a", "agent_unauthenticated", 2),
        ("b", "agent_unauthenticated", 1),
    ]
    assert counter.fold(denial("a"), 4.0) is False  # a new window starts afresh


def test_the_window_ends_after_its_seconds() -> None:
    """A window opens with its first denial and is due window_seconds later."""
    counter = DenialCounter(window_seconds=10)
    assert counter.seconds_left(0.0) is None
    counter.fold(denial("a"), 5.0)
    assert counter.seconds_left(7.0) == 8.0
    assert not counter.due(14.9)
    assert counter.due(15.0)


def test_a_flood_from_many_sources_is_bounded() -> None:
    """10,000 sources in one window: at most max_whole stored whole and max_sources + 1 counted
    records (the last one, source `*`, for all the others), every denial accounted for."""
    counter = DenialCounter(window_seconds=10, max_sources=100, max_whole=10)
    stored_whole = sum(
        not counter.fold(denial(f"10.0.{i // 256}.{i % 256}"), 0.0) for i in range(10_000)
    )
    closed = counter.close()
    assert stored_whole == 10
    assert len(closed) == 101
    assert [r["source"] for r in closed].count("*") == 1
    assert stored_whole + sum(r["count"] for r in closed) == 10_000
