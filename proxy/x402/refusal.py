"""Why a challenge or a settlement answer is refused: a value, never an exception."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Why(StrEnum):
    """What was wrong, in words the gate maps to its own reason codes."""

    MALFORMED = "malformed"  # not the protocol's form (base64, JSON, depth, size, types)
    NOT_APPROVED = "not_approved"  # well formed, but no requirement fits the approval


@dataclass(frozen=True)
class Refused:
    why: Why
    detail: str  # a sentence for the agent; never the upstream's bytes
