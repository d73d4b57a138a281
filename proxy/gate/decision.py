"""What the pure checks decide about one request: a value, never an exception.

A request starts denied and is only forwarded by getting through every check (see checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from proxy.gate.reasons import Reason


@dataclass(frozen=True)
class Deny:
    reason: Reason
    detail: str
    retry_after_seconds: int | None = None


@dataclass(frozen=True)
class Replay:
    """The operation is confirmed: answer with the stored provider response, send nothing."""

    would_deny: Deny | None = None  # shadow mode: what an enforcing rule would have refused


class ClaimKind(StrEnum):
    NONE = "none"  # a read the rule lets through without an operation
    FIRST = "first"  # created -> dispatched
    RESEND = "resend"  # dispatched, last outcome unknown, the provider deduplicates on the key


@dataclass(frozen=True)
class Forward:
    claim: ClaimKind
    would_deny: Deny | None = None  # shadow mode: what an enforcing rule would have refused


Decision = Deny | Replay | Forward
