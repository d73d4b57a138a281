"""C2SP tlog-checkpoints (c2sp.org/tlog-checkpoint): the note text that states a tree head.

    <origin>
    <tree size, decimal, no leading zero>
    <root hash, base64>
    [extension lines]

signed as a note by the log's Ed25519 key (whose name is the origin) and cosigned by witnesses
(note.COSIGNATURE_V1). ``open_checkpoint`` is what a verifier runs: the log's signature (by
one of the log's keys it is given: a rotated log has several) must verify; cosignatures by the
witnesses it is given are verified and returned.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.transparency import merkle
from proxy.transparency.note import Note, NoteError, Signature, Verifier, open_note

_SIZE = re.compile(r"0|[1-9][0-9]{0,19}")


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode("ascii")]
        return "\n".join([*lines, *self.extensions]) + "\n"


def parse_checkpoint(text: str) -> Checkpoint:
    """A checkpoint's note text, strictly: three lines at least, none empty."""
    if not text.endswith("\n"):
        raise NoteError("a checkpoint ends with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3 or any(not line for line in lines):
        raise NoteError("a checkpoint is at least 3 non-empty lines")
    origin, size, root = lines[:3]
    if not _SIZE.fullmatch(size):
        raise NoteError(f"not a tree size: {size[:24]!r}")
    try:
        digest = base64.b64decode(root, validate=True)
    except ValueError as exc:
        raise NoteError("the root hash is not base64") from exc
    if len(digest) != merkle.HASH_SIZE or base64.b64encode(digest).decode() != root:
        raise NoteError("the root hash is not a base64 SHA-256 hash")
    return Checkpoint(origin, int(size), digest, tuple(lines[3:]))


@dataclass(frozen=True)
class OpenedCheckpoint:
    checkpoint: Checkpoint
    note: Note
    cosignatures: tuple[Signature, ...]  # verified, by the witnesses given
    signed_by: int = 0  # the key ID of the log's key that signed it

    def witnessed(self, quorum: int) -> bool:
        return len({s.name for s in self.cosignatures}) >= quorum


def open_checkpoint(
    message: str | bytes, log: Verifier | Sequence[Verifier], witnesses: Sequence[Verifier] = ()
) -> OpenedCheckpoint:
    """Verify a signed checkpoint: the log's signature is required, its origin must be the
    log's name, and the witnesses' cosignatures found are verified.

    ``log`` may be several keys of one log: its current key and the earlier ones it was
    rotated from (docs/audit.md, *Rotating the log's key*); a signature by any of them is the
    log's, by any other key (its name, another key ID) is not."""
    keys = [log] if isinstance(log, Verifier) else list(log)
    opened = open_note(message, [*keys, *witnesses])
    own = {(k.name, k.key_id) for k in keys}
    by_log = [s for s in opened.verified if (s.name, s.key_id) in own]
    if not by_log:
        names = ", ".join(sorted({k.name for k in keys}))
        raise NoteError(f"the checkpoint is not signed by the log {names}")
    checkpoint = parse_checkpoint(opened.text)
    if checkpoint.origin not in {s.name for s in by_log}:
        raise NoteError(f"the checkpoint's origin {checkpoint.origin!r} is not the log's name")
    cosigned = tuple(s for s in opened.verified if (s.name, s.key_id) not in own)
    return OpenedCheckpoint(checkpoint, opened, cosigned, by_log[0].key_id)
