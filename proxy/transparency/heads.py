"""Where each stream ends, as the log signs it: an authenticated map from every stream to its
head (the last record of it the tree holds), whose root each checkpoint carries in an extension
line (``opgate-heads/1 <base64 root>``). With it a bundle proves a stream's end: without it,
nothing in a tree of records says that no later record of a stream exists, so a bundle whose
tail was dropped would verify (docs/audit.md, *What a bundle proves*).

The map, pure (the integrator keeps it, migration 0025):

    bucket(stream)   the first 12 bits of SHA-256(stream): one of 4096 buckets
    bucket hash      SHA-256(0x02 || "opgate-heads/1" || every head of the bucket, sorted by
                     stream, each as len(stream) (4 bytes) || stream || seq (8 bytes) || record
                     hash (32 bytes)); an empty bucket's is the same with no heads
    root             the RFC 6962 interior hashes (0x01 || left || right) of a full binary tree
                     of depth 12 over the bucket hashes, bucket 0 leftmost

A proof of one stream's end is its bucket's heads (all of them: that the stream is among them
once, or not at all, is read from the whole bucket) and the 12 sibling hashes from the bucket to
the root. Pure: no IO.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.transparency import merkle

DEPTH = 12
BUCKETS = 1 << DEPTH
EXTENSION = "opgate-heads/1"  # the checkpoint extension line's first word, and the hash tag
_BUCKET_PREFIX = b"\x02"
MAX_STREAM_BYTES = 4096


class HeadsError(ValueError):
    """A heads proof that is malformed, or does not lead to the signed root."""


@dataclass(frozen=True)
class Head:
    """A stream's last record in the tree: its seq and its chain hash."""

    stream: str
    seq: int
    record_hash: bytes


def bucket_of(stream: str) -> int:
    return int.from_bytes(hashlib.sha256(stream.encode("utf-8")).digest()[:2], "big") >> 4


def bucket_hash(heads: Sequence[Head]) -> bytes:
    """The hash of one bucket's heads (in any order given; hashed sorted by stream)."""
    digest = hashlib.sha256(_BUCKET_PREFIX + EXTENSION.encode("ascii"))
    for head in sorted(heads, key=lambda h: h.stream):
        name = head.stream.encode("utf-8")
        digest.update(len(name).to_bytes(4, "big") + name)
        digest.update(head.seq.to_bytes(8, "big") + head.record_hash)
    return digest.digest()


EMPTY_BUCKET = bucket_hash(())


def _levels(buckets: Mapping[int, bytes]) -> list[list[bytes]]:
    """Every level of the tree, the buckets' hashes first, the root last."""
    level = [buckets.get(i, EMPTY_BUCKET) for i in range(BUCKETS)]
    levels = [level]
    while len(level) > 1:
        level = [merkle.node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        levels.append(level)
    return levels


def root(buckets: Mapping[int, bytes]) -> bytes:
    """The map's root from the non-empty buckets' hashes (bucket -> hash)."""
    return _levels(buckets)[-1][0]


def path(buckets: Mapping[int, bytes], bucket: int) -> list[bytes]:
    """The sibling hashes from ``bucket`` up to the root, bottom first."""
    levels = _levels(buckets)
    return [levels[depth][(bucket >> depth) ^ 1] for depth in range(DEPTH)]


def root_from(bucket: int, digest: bytes, siblings: Sequence[bytes]) -> bytes:
    if len(siblings) != DEPTH or not 0 <= bucket < BUCKETS:
        raise HeadsError(f"a heads proof has {DEPTH} sibling hashes")
    for depth, sibling in enumerate(siblings):
        if len(sibling) != merkle.HASH_SIZE:
            raise HeadsError("a heads proof's sibling is not a SHA-256 hash")
        left = (bucket >> depth) & 1 == 0
        digest = merkle.node_hash(digest, sibling) if left else merkle.node_hash(sibling, digest)
    return digest


def extension_line(digest: bytes) -> str:
    return f"{EXTENSION} {base64.b64encode(digest).decode('ascii')}"


def signed_root(extensions: Sequence[str]) -> bytes | None:
    """The map's root a checkpoint's extension lines carry; None when it carries none (a
    checkpoint signed before migration 0025). Two such lines, or a malformed one: HeadsError."""
    found = [line for line in extensions if line.split(" ", 1)[0] == EXTENSION]
    if not found:
        return None
    if len(found) > 1:
        raise HeadsError(f"the checkpoint carries {len(found)} {EXTENSION} lines")
    encoded = found[0].removeprefix(EXTENSION + " ")
    try:
        digest = base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise HeadsError(f"the checkpoint's {EXTENSION} line is not base64") from exc
    if len(digest) != merkle.HASH_SIZE or base64.b64encode(digest).decode("ascii") != encoded:
        raise HeadsError(f"the checkpoint's {EXTENSION} line is not a base64 SHA-256 hash")
    return digest


def head_of(
    stream: str, bucket_heads: Sequence[Head], siblings: Sequence[bytes], signed: bytes
) -> Head | None:
    """The head of ``stream`` the signed root vouches for (None: the tree holds no record of
    it), from its bucket's heads and the sibling hashes; HeadsError when they do not lead to
    ``signed``, or the bucket is not well-formed (another bucket's stream, a stream twice)."""
    bucket = bucket_of(stream)
    seen: set[str] = set()
    for head in bucket_heads:
        if bucket_of(head.stream) != bucket:
            raise HeadsError(f"the heads of stream {stream}'s bucket hold another bucket's")
        if head.stream in seen:
            raise HeadsError(f"the heads of stream {stream}'s bucket hold a stream twice")
        if head.seq < 1 or len(head.record_hash) != merkle.HASH_SIZE:
            raise HeadsError(f"the heads of stream {stream}'s bucket hold a malformed head")
        seen.add(head.stream)
    if root_from(bucket, bucket_hash(bucket_heads), siblings) != signed:
        raise HeadsError(f"the heads proof of stream {stream} does not lead to the signed root")
    return next((h for h in bucket_heads if h.stream == stream), None)
