"""The tlog-witness exchange (c2sp.org/tlog-witness), pure: the ``add-checkpoint`` request body,
and the witness's decision on it.

    POST <prefix>/add-checkpoint
    old <size>\\n            the size of the last checkpoint this witness cosigned (0: none)
    <base64 hash>\\n ...     the consistency proof from that size (at most 63 lines)
    \\n
    <signed checkpoint>

A witness answers 200 with its cosignature lines; 404 for a log it does not know; 403 when the
log's signature is missing or does not verify; 400 for a malformed request or an old size above
the checkpoint's; 409 (``text/x.tlog.size``: its size) when the old size is not the size it last
cosigned (or, as plain text, when it is that size with another root); 422 when the proof does not
show the new checkpoint consistent with the last one it cosigned (a fork, or a rewritten history).
``decide`` makes that decision; keeping the state and signing are the process's (``opgate audit
witness``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.transparency import merkle
from proxy.transparency.checkpoint import Checkpoint, open_checkpoint
from proxy.transparency.note import NoteError, Verifier

SIZE_CONTENT_TYPE = "text/x.tlog.size"
MAX_PROOF_LINES = 63
_OLD = re.compile(r"old (0|[1-9][0-9]{0,19})")


@dataclass(frozen=True)
class AddCheckpoint:
    old_size: int
    proof: tuple[bytes, ...]
    checkpoint: str  # the signed note, verbatim


def add_checkpoint_body(old_size: int, proof: Sequence[bytes], signed_checkpoint: str) -> str:
    lines = [f"old {old_size}", *(base64.b64encode(p).decode("ascii") for p in proof)]
    return "".join(f"{line}\n" for line in lines) + "\n" + signed_checkpoint


@dataclass(frozen=True)
class Refusal(Exception):
    """The witness does not cosign: the HTTP status and a one-line reason (or its size)."""

    status: int
    reason: str
    content_type: str = "text/plain"


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Refusal(400, "the request is not UTF-8") from None
    head, blank, checkpoint = text.partition("\n\n")
    lines = head.split("\n")
    if not blank or not (match := _OLD.fullmatch(lines[0])):
        raise Refusal(400, "the request starts with 'old <size>', proof lines and a blank line")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise Refusal(400, f"more than {MAX_PROOF_LINES} proof lines")
    proof = []
    for line in lines[1:]:
        try:
            digest = base64.b64decode(line, validate=True)
        except ValueError:
            raise Refusal(400, "a proof line is not base64") from None
        if len(digest) != merkle.HASH_SIZE:
            raise Refusal(400, "a proof line is not a SHA-256 hash")
        proof.append(digest)
    return AddCheckpoint(int(match.group(1)), tuple(proof), checkpoint)


@dataclass(frozen=True)
class Cosigned:
    """What a witness keeps per log: the last checkpoint it cosigned."""

    size: int
    root: bytes


def origin_of(signed_checkpoint: str) -> str:
    return signed_checkpoint.partition("\n")[0]


def decide(
    request: AddCheckpoint,
    logs: Mapping[str, Verifier | Sequence[Verifier]],
    latest: Cosigned | None,
) -> Checkpoint:
    """The checkpoint to cosign, or the Refusal that says why not (in the specification's
    order). ``logs``: per origin, the log's keys this witness was given (several after the log
    rotated its key: each verifies, no other does); ``latest``: what this witness last
    cosigned for the checkpoint's origin, whichever key signed it."""
    log = logs.get(origin_of(request.checkpoint))
    if log is None:
        raise Refusal(404, "unknown log")
    try:
        checkpoint = open_checkpoint(request.checkpoint, log).checkpoint
    except NoteError as exc:
        raise Refusal(403, f"the checkpoint does not verify: {exc}") from None
    if request.old_size > checkpoint.size:
        raise Refusal(400, "the old size is above the checkpoint's size")
    known_size = latest.size if latest else 0
    if request.old_size != known_size:
        raise Refusal(409, f"{known_size}\n", SIZE_CONTENT_TYPE)
    if checkpoint.size == 0 and checkpoint.root != merkle.EMPTY_ROOT:
        raise Refusal(422, "an empty tree's root is the hash of the empty string")
    if request.old_size == 0:
        if request.proof:
            raise Refusal(422, "a proof from size 0 must be empty")
        return checkpoint
    assert latest is not None
    if request.old_size == checkpoint.size and checkpoint.root != latest.root:
        # the specification's own answer to the same size with another root: a conflict
        raise Refusal(409, "the checkpoint's root is not the one cosigned at its size")
    consistent = merkle.verify_consistency(
        latest.size, checkpoint.size, latest.root, checkpoint.root, request.proof
    )
    if not consistent:
        raise Refusal(422, "the checkpoint is not consistent with the last one cosigned")
    return checkpoint
