"""Retention: removing old audit records without making ``opgate audit verify`` meaningless.

``audit_log`` only grows. The practice (docs/audit.md, *Retention*) is to archive, then delete
whole old segments, and only behind a checkpoint. ``opgate audit prune --through-checkpoint N
--archive FILE``:

1. refuses unless the whole log verifies, with the audit key;
2. takes, for each stream, the last position the checkpoints up to N signed (its *cut*):
   everything at or before a cut is covered by a signature;
3. writes those records verbatim to FILE (JSON Lines with their hashes: each line can be
   re-hashed with ``chain.record_hash``), and syncs it to disk;
4. in one transaction, appends a ``retention`` record (the checkpoint, the archive's SHA-256,
   the count, each request stream's numbering floor, and an HMAC over them with the audit key)
   and deletes the records.

``verify`` then reads the cuts from the latest authentic ``retention`` record and the
checkpoints (which are never pruned): the first record after a cut must chain to the hash that
was signed for the cut; signed positions at or before a cut are not expected; a stream whose
records were all pruned must have its head at its cut; request numbers at or before a floor
are not expected. Deleting records without such a record, or forging one without the key,
remains a break.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from proxy.observe.audit import AUDIT_SCHEMA_VERSION
from proxy.observe.auditlog import records
from proxy.observe.auditlog.chain import Checkpoint, Head, StoredRecord, retention_mac


class PruneRefused(Exception):
    """The prune would make the log unverifiable, or cannot be done as asked."""


@dataclass(frozen=True)
class Retention:
    """What the prunes so far removed: each stream's cut, and request streams' floors."""

    through_checkpoint: int | None = None
    cuts: dict[str, Head] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)

    def pruned(self, stream: str, seq: int) -> bool:
        cut = self.cuts.get(stream)
        return cut is not None and seq <= cut.seq

    def pruned_hash(self, stream: str, seq: int) -> bytes | None:
        """The signed hash of the record before ``seq``, when that record was pruned."""
        cut = self.cuts.get(stream)
        return cut.hash if cut is not None and seq == cut.seq + 1 else None


@dataclass(frozen=True)
class Pruned:
    through_checkpoint: int
    records: int
    streams: int
    archive_sha256: str


def cuts_through(checkpoints: list[Checkpoint], checkpoint_id: int) -> dict[str, Head]:
    """Per stream, the last head the checkpoints up to ``checkpoint_id`` signed."""
    cuts: dict[str, Head] = {}
    for checkpoint in checkpoints:
        if checkpoint.checkpoint_id > checkpoint_id:
            continue
        for head in checkpoint.heads:
            known = cuts.get(head.stream)
            if head.stream != records.STREAM_RETENTION and (known is None or head.seq > known.seq):
                cuts[head.stream] = head
    return cuts


def floors_text(floors: dict[str, int]) -> str:
    return json.dumps(floors, sort_keys=True, separators=(",", ":"))


def retention_from(
    stored: list[dict[str, Any]], checkpoints: list[Checkpoint], key: bytes | None
) -> tuple[Retention, list[str]]:
    """The retention the records declare (the furthest authentic one), and the problems found:
    a malformed record, or one whose MAC does not verify with ``key`` (when given)."""
    problems: list[str] = []
    furthest: tuple[int, dict[str, int]] | None = None
    for record in stored:
        try:
            through = int(record["through_checkpoint"])
            digest = str(record["archive_sha256"])
            floors = {str(s): int(f) for s, f in dict(record["floors"]).items()}
            mac = bytes.fromhex(str(record["mac"]))
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"a retention record is malformed ({exc})")
            continue
        if key is not None:
            expected = retention_mac(key, through, digest, floors_text(floors))
            if not hmac.compare_digest(expected, mac):
                problems.append(
                    f"the retention record through checkpoint {through} does not verify with"
                    " the audit key (forged or edited)"
                )
                continue
        if furthest is None or through > furthest[0]:
            furthest = (through, floors)
    if furthest is None:
        return Retention(), problems
    through, floors = furthest
    return Retention(through, cuts_through(checkpoints, through), floors), problems


async def in_force(conn: asyncpg.Connection, key: bytes | None) -> tuple[Retention, list[str]]:
    """The retention the database's records declare (``retention_from``), read from them."""
    return retention_from(
        await records.retention_records(conn), await records.checkpoints(conn), key
    )


def archive_line(record: StoredRecord) -> str:
    """A record as archived: every column, verbatim, enough to recompute its hash."""
    return json.dumps(
        {
            "stream": record.stream,
            "seq": record.seq,
            "at": record.at.isoformat(),
            "kind": record.kind,
            "operation_id": record.operation_id,
            "record": record.record,
            "prev_hash": record.prev_hash.hex(),
            "hash": record.hash.hex(),
        },
        separators=(",", ":"),
    )


def _numbers(fields: dict[str, Any]) -> list[int]:
    seq = fields.get("instance_seq")
    numbers = [seq] if isinstance(seq, int) else []
    if fields.get("record_type") == "dropped":
        numbers += [int(last) for _, last in fields.get("dropped") or []]
    return numbers


class _Floors:
    """Request streams' floors: the highest number pruned in the run that continues after
    the cut (a ``started`` record in the pruned part begins a new run, from 0)."""

    def __init__(self, previous: dict[str, int]) -> None:
        self.floors = dict(previous)

    def see(self, record: StoredRecord) -> None:
        if not record.stream.startswith(records.REQUEST_STREAM_PREFIX):
            return
        fields = record.fields()
        floor = 0 if fields.get("record_type") == "started" else self.floors.get(record.stream, 0)
        self.floors[record.stream] = max([floor, *_numbers(fields)])


async def prune(
    conn: asyncpg.Connection, key: bytes, through_checkpoint: int, archive: Path
) -> Pruned:
    """Archive and delete every record at or before the cuts of ``through_checkpoint`` (the
    caller has verified the whole log). The archive must not exist yet."""
    checkpoints = await records.checkpoints(conn)
    if not any(cp.checkpoint_id == through_checkpoint for cp in checkpoints):
        raise PruneRefused(f"there is no seal {through_checkpoint}")
    current, problems = retention_from(await records.retention_records(conn), checkpoints, key)
    if problems:
        raise PruneRefused(problems[0])
    if current.through_checkpoint is not None and through_checkpoint <= current.through_checkpoint:
        raise PruneRefused(f"already pruned through seal {current.through_checkpoint}")
    cuts = cuts_through(checkpoints, through_checkpoint)
    positions = sorted((stream, head.seq) for stream, head in cuts.items())
    digest, count, floors = hashlib.sha256(), 0, _Floors(current.floors)
    out = archive.open("x", encoding="utf-8")  # never overwrites an earlier archive
    try:
        async with conn.transaction(isolation="repeatable_read"):
            with out:
                async for record in records.prunable(conn, positions):
                    line = archive_line(record) + "\n"
                    out.write(line)
                    digest.update(line.encode("utf-8"))
                    count += 1
                    floors.see(record)
                out.flush()
                os.fsync(out.fileno())
            archive_sha256 = digest.hexdigest()
            mac = retention_mac(key, through_checkpoint, archive_sha256, floors_text(floors.floors))
            entry = {
                "schema_version": AUDIT_SCHEMA_VERSION,
                "event": "pruned",
                "time": datetime.now(UTC).isoformat(),
                "through_checkpoint": through_checkpoint,
                "archive_sha256": archive_sha256,
                "records": count,
                "floors": floors.floors,
                "mac": mac.hex(),
            }
            deleted = await records.prune(conn, positions, entry)
            if deleted != count:
                raise PruneRefused(f"archived {count} records but {deleted} matched the delete")
    except BaseException:
        out.close()
        _discard(archive)  # nothing was deleted: an archive of it would mislead
        raise
    return Pruned(through_checkpoint, count, len(positions), archive_sha256)


def _discard(archive: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        archive.unlink()
