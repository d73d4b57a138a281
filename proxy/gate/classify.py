"""What a provider's answer means for the operation. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass

from proxy.policy import pointers
from proxy.policy.model import Classification
from proxy.store.operation import LastOutcome, Status


@dataclass(frozen=True)
class Settled:
    status: Status  # confirmed or failed
    object_id: str | None


@dataclass(frozen=True)
class Unknown:
    outcome: LastOutcome


Classified = Settled | Unknown


def classify_answer(classification: Classification, status: int, body: bytes) -> Classified:
    """Only a status the policy names settles the operation; everything else stays unknown."""
    if classification.is_confirmed(status):
        return Settled(Status.CONFIRMED, object_id_from(classification.object_id, body))
    if classification.is_failed(status):
        return Settled(Status.FAILED, None)
    return Unknown(LastOutcome.UNKNOWN_STATUS)


def object_id_from(pointer: str | None, body: bytes) -> str | None:
    if pointer is None:
        return None
    try:
        node: object = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    found = pointers.resolve(node, pointer)
    return found if isinstance(found, str) else None
