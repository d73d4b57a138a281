"""The audit chain's arithmetic, pure: record hashes, checkpoint MACs, and the verifier's rules.

The record hash is computed by PostgreSQL (``opgate_audit_hash``: migration 0003, the same
encoding in PL/pgSQL since 0004; an operation's records by one SQL expression each in its
trigger since 0028) when a record is appended, and recomputed here, independently, when it is
verified. The encodings must stay identical; ``tests/observe/test_auditlog_chain.py``,
``tests/store/test_migrate.py`` and ``tests/store/test_transition_records_in_sql.py`` check them
against each other.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

GENESIS = bytes(32)  # the prev_hash of a stream's first record, and of the first checkpoint
_HASH_TAG = b"opgate-audit-v1"
_MAC_TAG = b"opgate-audit-checkpoint-v1"
_RETENTION_TAG = b"opgate-audit-retention-v1"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NULL_FIELD = b"\xff\xff\xff\xff"


def encode_field(value: str | None) -> bytes:
    """Length-prefixed UTF-8, so that no two different field lists encode alike."""
    if value is None:
        return _NULL_FIELD
    data = value.encode("utf-8")
    return struct.pack(">i", len(data)) + data


def epoch_micros(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class StoredRecord:
    """One ``audit_log`` row as read back (``record`` is PostgreSQL's jsonb text, verbatim)."""

    stream: str
    seq: int
    at: datetime
    kind: str
    operation_id: str | None
    record: str
    prev_hash: bytes
    hash: bytes

    def expected_hash(self) -> bytes:
        return record_hash(
            self.prev_hash,
            self.stream,
            self.seq,
            self.at,
            self.kind,
            self.operation_id,
            self.record,
        )

    def fields(self) -> dict[str, object]:
        parsed: dict[str, object] = json.loads(self.record)
        return parsed


def record_hash(
    prev_hash: bytes,
    stream: str,
    seq: int,
    at: datetime,
    kind: str,
    operation_id: str | None,
    record_text: str,
) -> bytes:
    content = (
        _HASH_TAG
        + prev_hash
        + encode_field(stream)
        + encode_field(str(seq))
        + encode_field(str(epoch_micros(at)))
        + encode_field(kind)
        + encode_field(operation_id)
        + encode_field(record_text)
    )
    return hashlib.sha256(content).digest()


@dataclass(frozen=True)
class Head:
    stream: str
    seq: int
    hash: bytes


@dataclass(frozen=True)
class Checkpoint:
    checkpoint_id: int
    at: datetime
    writer: str
    heads: tuple[Head, ...]
    prev_mac: bytes
    mac: bytes


def heads_json(heads: Iterable[Head]) -> str:
    """The stored (and signed) form of a checkpoint's heads: compact, in the given order."""
    return json.dumps([[h.stream, h.seq, h.hash.hex()] for h in heads], separators=(",", ":"))


def heads_from_json(text: str) -> tuple[Head, ...]:
    return tuple(Head(s, int(q), bytes.fromhex(h)) for s, q, h in json.loads(text))


def checkpoint_mac(key: bytes, prev_mac: bytes, at: datetime, writer: str, heads: str) -> bytes:
    """HMAC-SHA256 over the previous MAC and the checkpoint's content (heads as signed JSON)."""
    content = (
        _MAC_TAG
        + prev_mac
        + encode_field(str(epoch_micros(at)))
        + encode_field(writer)
        + encode_field(heads)
    )
    return hmac.new(key, content, hashlib.sha256).digest()


def retention_mac(key: bytes, through_checkpoint: int, archive_sha256: str, floors: str) -> bytes:
    """HMAC-SHA256 of a prune's facts: without the key, nobody can declare a cut legitimate."""
    content = (
        _RETENTION_TAG
        + encode_field(str(through_checkpoint))
        + encode_field(archive_sha256)
        + encode_field(floors)
    )
    return hmac.new(key, content, hashlib.sha256).digest()


@dataclass(frozen=True)
class Break:
    """Where the chain is broken, and how: what ``opgate audit verify`` names."""

    stream: str
    seq: int | None
    at: datetime | None
    problem: str

    def describe(self) -> str:
        where = f"stream {self.stream}" + (f" seq {self.seq}" if self.seq is not None else "")
        when = f" (recorded {self.at.isoformat()})" if self.at else ""
        return f"{where}{when}: {self.problem}"


def check_record(
    record: StoredRecord, predecessor_hash: bytes | None, pruned_hash: bytes | None = None
) -> str | None:
    """Why this record breaks its chain, or None. ``predecessor_hash``: the stored hash of the
    record before it in its stream (None when that record is missing); ``pruned_hash``: when
    the record before it was pruned (retention.py), the hash a checkpoint signed for it."""
    if record.seq < 1:
        return "sequence number below 1"
    if record.expected_hash() != record.hash:
        return "content does not match its hash (edited, or moved from another position)"
    if record.seq == 1:
        if record.prev_hash != GENESIS:
            return "first record of its stream does not start from the genesis hash"
        return None
    if predecessor_hash is None and pruned_hash is not None:
        if pruned_hash != record.prev_hash:
            return "does not chain to the signed record before it, which was pruned"
        return None
    if predecessor_hash is None:
        return f"record {record.seq - 1} of this stream is missing (deleted)"
    if predecessor_hash != record.prev_hash:
        return "does not chain to the stored record before it (inserted, reordered or replaced)"
    return None


def check_checkpoint_chain(key: bytes, checkpoints: Iterable[Checkpoint]) -> str | None:
    """Why the checkpoint sequence is not authentic, or None."""
    expected_prev = GENESIS
    for cp in checkpoints:
        if cp.prev_mac != expected_prev:
            return f"checkpoint {cp.checkpoint_id}: does not follow the previous checkpoint"
        mac = checkpoint_mac(key, cp.prev_mac, cp.at, cp.writer, heads_json(cp.heads))
        if not hmac.compare_digest(mac, cp.mac):
            return f"checkpoint {cp.checkpoint_id}: signature does not verify (forged or edited)"
        expected_prev = cp.mac
    return None
