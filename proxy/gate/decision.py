"""What the pure checks decide about one request: a value, never an exception.

A request starts denied and is only forwarded by getting through every check (see checks.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from proxy.gate.reasons import Reason


@dataclass(frozen=True)
class Deny:
    reason: Reason
    detail: str
    retry_after_seconds: int | None = None
    # more members of the problem body (budget_exceeded: the remaining budget)
    extra: Mapping[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Replay:
    """The operation is confirmed: answer with the stored provider response, send nothing."""

    would_deny: Deny | None = None  # shadow mode: what an enforcing rule would have refused


class ClaimKind(StrEnum):
    NONE = "none"  # a read the rule lets through without an operation
    FIRST = "first"  # created -> dispatched
    # dispatched, nothing in flight: the last attempt never left, or the provider still
    # deduplicates its key
    RESEND = "resend"
    # dispatched, outcome unknown, the rule declares lookups: ask the provider first
    # (proxy/gate/resend.py); found -> replay, conclusively absent -> re-send, else only as RESEND.
    # Also any row, created included, that a timeline switch put in doubt (lookup_before_send):
    # there, only after the lookup.
    RESEND_AFTER_LOOKUP = "resend_after_lookup"


@dataclass(frozen=True)
class Forward:
    claim: ClaimKind
    would_deny: Deny | None = None  # shadow mode: what an enforcing rule would have refused


Decision = Deny | Replay | Forward
