"""What a provider's answer means for the operation. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass

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
    for part in pointer.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isascii() and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node if isinstance(node, str) else None
