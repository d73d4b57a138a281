"""Counting repeated pre-authentication denials instead of storing each one. Pure (the clock is
an argument).

Anyone who can reach the agent listener can make opgate refuse a request: no token, a path no
provider is routed at. Stored one row each, such refusals let an unauthenticated client fill
the primary's disk. So, within a window of ``window_seconds``:

- the first such denial of each (listener, source address, reason) is stored whole, up to
  ``max_whole`` per window (a flood from rotating addresses cannot buy a row per address);
- every other one is counted into one ``denials`` record per (listener, source, reason), up
  to ``max_sources`` keys per window; beyond that, into one per (listener, reason) with
  source ``*``.

A window's counts become records when it ends (the writer closes it on its own timer, and on
flush and shutdown). Each counted request still has its own log line (``aggregated: true``).
Denials of an authenticated agent are never counted: they are an agent's doing, on record one
by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.observe.audit import AUDIT_SCHEMA_VERSION
from proxy.observe.auditlog.storable import text_digest

WINDOW_SECONDS = 10.0
MAX_SOURCES = 100
MAX_WHOLE = 10
OTHER_SOURCES = "*"

Key = tuple[str, str, str]  # listener, source, reason


def aggregable(fields: dict[str, Any]) -> bool:
    """A denial before any agent was authenticated: what anyone can produce."""
    return fields.get("decision") == "deny" and fields.get("agent_id") is None


def _whole_path_digest(fields: dict[str, Any]) -> str | None:
    path = fields.get("path")
    if fields.get("path_sha256") is not None:
        return str(fields["path_sha256"])
    return text_digest(path) if isinstance(path, str) else None


@dataclass
class _Count:
    first: dict[str, Any]
    last_time: str
    last_path_sha256: str | None
    count: int = 1


class DenialCounter:
    def __init__(
        self,
        window_seconds: float = WINDOW_SECONDS,
        max_sources: int = MAX_SOURCES,
        max_whole: int = MAX_WHOLE,
    ) -> None:
        self.window_seconds = window_seconds
        self.max_sources = max_sources
        self.max_whole = max_whole
        self._ends_at: float | None = None
        self._stored_whole: set[Key] = set()
        self._counts: dict[Key, _Count] = {}

    def fold(self, fields: dict[str, Any], now: float) -> bool:
        """Take one aggregable denial: False if it is to be stored whole, True if counted."""
        if self._ends_at is None:
            self._ends_at = now + self.window_seconds
        listener, reason = str(fields.get("listener")), str(fields.get("reason"))
        key: Key = (listener, str(fields.get("source") or OTHER_SOURCES), reason)
        if key not in self._stored_whole and len(self._stored_whole) < self.max_whole:
            self._stored_whole.add(key)
            return False
        if key not in self._counts and len(self._counts) >= self.max_sources:
            key = (listener, OTHER_SOURCES, reason)
        digest = _whole_path_digest(fields)
        counted = self._counts.get(key)
        if counted is None:
            self._counts[key] = _Count(dict(fields), str(fields.get("time")), digest)
        else:
            counted.count += 1
            counted.last_time, counted.last_path_sha256 = str(fields.get("time")), digest
        return True

    def seconds_left(self, now: float) -> float | None:
        """Until the open window ends; None when no window is open."""
        return None if self._ends_at is None else max(0.0, self._ends_at - now)

    def due(self, now: float) -> bool:
        return self._ends_at is not None and now >= self._ends_at

    def close(self) -> list[dict[str, Any]]:
        """End the window: one ``denials`` record per key that counted anything."""
        closed = [_record(key, counted) for key, counted in self._counts.items()]
        self._ends_at = None
        self._stored_whole.clear()
        self._counts.clear()
        return closed


def _record(key: Key, counted: _Count) -> dict[str, Any]:
    listener, source, reason = key
    first = counted.first
    return {
        "schema_version": AUDIT_SCHEMA_VERSION,
        "record_type": "denials",
        "time": counted.last_time,
        "listener": listener,
        "source": source,
        "decision": "deny",
        "reason": reason,
        "response_status": first.get("response_status"),
        "policy_version": first.get("policy_version"),
        "count": counted.count,
        "first_time": first.get("time"),
        "last_time": counted.last_time,
        "first_path": first.get("path"),
        "first_path_sha256": _whole_path_digest(first),
        "last_path_sha256": counted.last_path_sha256,
    }
