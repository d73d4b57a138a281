"""Offline evidence for one operation (``opgate audit bundle``), and its verifier
(``opgate audit verify-bundle``), which needs no database and no settings: the bundle, and the
log's public key and the witnesses' keys obtained some other way (``--log-key``,
``--witness-key``), are all it reads. docs/audit.md, *Bundles*, describes the fields, and *What
a bundle proves* what it proves and what it cannot.

The verifier decides only on what it requires to be present (a bundle's author may leave
anything out, so "not shown" is never read as "not there"):

- every record hashes (chain.py) to the leaf the signed checkpoint's tree holds at its index
  (an RFC 6962 inclusion proof), or is listed as unproven (written after the checkpoint) and
  then says nothing;
- every stream of ``records`` chains between its present records: a gap is a break, whatever
  the unsigned ``since`` says;
- each operation the verifier speaks about (the bundle's, and every one whose transitions are
  here) has its whole stream, from seq 1 to the head the checkpoint signs for it
  (proxy/transparency/heads.py): so a stream whose middle or tail was dropped fails;
- the checkpoint is signed by one of the log's keys given, and cosigned by the witnesses the
  reviewer names (every one of them, unless the reviewer gives a smaller quorum). Keys and
  quorum from the bundle itself are never trusted.

``referenced`` records (request records of other streams that name the operation: replays,
reads, refusals, a mandate's presentation) are proven one by one; the bundle cannot show that
none was left out, so what is read from them is never a count the reviewer relies on.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from proxy.observe.auditlog import evidence, integrator
from proxy.observe.auditlog.chain import GENESIS, StoredRecord, epoch_micros
from proxy.store import transparency as tstore
from proxy.transparency import heads, merkle, note
from proxy.transparency.checkpoint import open_checkpoint, parse_checkpoint

FORMAT = "opgate-audit-bundle/2"
_EARLIER_FORMATS = ("opgate-audit-bundle/1",)
_MAX_SEQ = 2**63 - 1
_MAX_PROOF = 64  # an inclusion proof in a tree of fewer than 2^64 leaves


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class BundleError(ValueError):
    """Not a bundle this verifier reads (the message says why; nothing of it is echoed)."""


# --- making a bundle ------------------------------------------------------------------------
async def build(
    conn: asyncpg.Connection,
    operation_id: str | None,
    log: note.Verifier,
    witness_keys: Sequence[str],
    quorum: int,
    window: tuple[datetime, datetime] | None = None,
    earlier_logs: Sequence[str] = (),
) -> dict[str, Any]:
    """The operation's records (or, with ``window``, the records written in [since, until),
    of the operation if one is named) with their inclusion proofs in the latest checkpoint,
    and, for each operation among them, its whole stream and the proof of where it ends, all
    read in one snapshot (the vkeys and the quorum opgate was configured with are recorded for
    the reviewer's information: the verifier never trusts them)."""
    if operation_id is None and window is None:
        raise BundleError("name an operation, or a time window")
    if conn.is_in_transaction():
        return await _build(conn, operation_id, log, witness_keys, quorum, window, earlier_logs)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await _build(conn, operation_id, log, witness_keys, quorum, window, earlier_logs)


async def _build(
    conn: asyncpg.Connection,
    operation_id: str | None,
    log: note.Verifier,
    witness_keys: Sequence[str],
    quorum: int,
    window: tuple[datetime, datetime] | None,
    earlier_logs: Sequence[str],
) -> dict[str, Any]:
    latest = await tstore.latest_checkpoint(conn)
    if latest is None:
        raise BundleError("no checkpoint yet: is the integrator running (transparency_key?)")
    size = latest["tree_size"]
    signed = await tstore.checkpoint_at(conn, size)
    assert signed is not None
    checkpoint = note.parse_note(signed["note"])
    cosigned = [
        note.parse_signature_line(line) for s in signed["cosignatures"] for line in s.splitlines()
    ]
    rendered = note.Note(checkpoint.text, (*checkpoint.signatures, *cosigned)).render()
    if window is None:
        assert operation_id is not None
        rows = list(await tstore.operation_records(conn, operation_id))
    else:
        rows = list(await tstore.records_between(conn, *window, operation_id))
    operations = sorted(
        {
            r["stream"]
            for r in rows
            if r["kind"] == "transition" and r["stream"] == r["operation_id"]
        }
        | ({operation_id} if operation_id else set())
    )
    whole, others = await _streams(conn, rows, operations, window is not None)
    # what the records refer to: a mandate's presentation record (outside a window too), and
    # the stored provider answers, which no record holds whole (evidence.py checks them)
    have = {(r["stream"], r["seq"]) for r in whole + others}
    presented = await tstore.mandate_records(conn, operations)
    referenced = [] if window is not None else others
    referenced += [r for r in presented if (r["stream"], r["seq"]) not in have]
    answers = {
        a["operation_id"]: _answer(a) for a in await tstore.operation_answers(conn, operations)
    }
    kept = whole + (others if window is not None else [])
    records = [await _entry(conn, r, size) for r in kept if r["hash"] is not None]
    missing = [_missing(r) for r in kept if r["hash"] is None]
    signed_root = heads.signed_root(parse_checkpoint(checkpoint.text).extensions)
    ends = {}
    for stream in operations:
        bucket_heads, siblings, root = await integrator.heads_proof(conn, stream)
        if root == signed_root:  # else the heads moved since (or predate 0025): no proof
            ends[stream] = {
                "heads": [[h.stream, h.seq, h.record_hash.hex()] for h in bucket_heads],
                "path": [_b64(s) for s in siblings],
            }
    return {
        "format": FORMAT,
        "operation_id": operation_id,
        "since": window[0].isoformat() if window else None,
        "until": window[1].isoformat() if window else None,
        "log": log.vkey(),
        "earlier_logs": [note.Verifier.from_vkey(k).vkey() for k in earlier_logs],
        "witnesses": [note.Verifier.from_vkey(k).vkey() for k in witness_keys],
        "quorum": quorum,
        "checkpoint": rendered,
        "records": records,
        "referenced": [await _entry(conn, r, size) for r in referenced if r["hash"] is not None],
        "missing": missing,
        "ends": ends,
        "answers": answers,
    }


async def _streams(
    conn: asyncpg.Connection, rows: list[asyncpg.Record], operations: list[str], window: bool
) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    """(each operation's whole stream, the other records): for a window, every stream's run
    made contiguous between its first and last record in the window (``at`` is the inserting
    transaction's start, so a window can leave out a record between two it holds)."""
    whole: list[asyncpg.Record] = []
    for stream in operations:
        if window:
            found = await tstore.operation_records(conn, stream)
        else:
            found = rows
        whole += [r for r in found if r["stream"] == stream]
    others = [r for r in rows if r["stream"] not in operations]
    if not window:
        return whole, others
    runs: dict[str, list[asyncpg.Record]] = {}
    for row in others:
        runs.setdefault(row["stream"], []).append(row)
    filled: list[asyncpg.Record] = []
    for stream, run in sorted(runs.items()):
        seqs = sorted(r["seq"] for r in run)
        if seqs[-1] - seqs[0] + 1 != len(set(seqs)):
            run = list(await tstore.stream_records(conn, stream, seqs[0], seqs[-1]))
        filled += run
    return whole, filled


async def _entry(conn: asyncpg.Connection, row: asyncpg.Record, size: int) -> dict[str, Any]:
    index = row["leaf_index"]
    proven = index is not None and index < size
    return {
        "stream": row["stream"],
        "seq": row["seq"],
        "at": row["at"].isoformat(),
        "kind": row["kind"],
        "operation_id": row["operation_id"],
        "record": row["record"],
        "prev_hash": bytes(row["prev_hash"]).hex(),
        "hash": bytes(row["hash"]).hex(),
        "leaf_index": index if proven else None,
        "inclusion": [_b64(p) for p in await integrator.inclusion(conn, index, size)]
        if proven
        else None,
    }


def _missing(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "stream": row["stream"],
        "seq": row["seq"],
        "leaf_index": row["leaf_index"],
        "record_hash": bytes(row["record_hash"]).hex(),
    }


def _answer(row: Any) -> dict[str, Any]:
    """What the operation row keeps of the provider's answer (the body base64, or null)."""
    body = row["response_body"]
    return {
        "status": row["status"],
        "settled_reason": row["settled_reason"],
        "provider_status": row["provider_status"],
        "object_id": row["provider_object_id"],
        "content_type": row["response_content_type"],
        "body": None if body is None else _b64(bytes(body)),
    }


def dumps(bundle: dict[str, Any]) -> str:
    return json.dumps(bundle, indent=1, sort_keys=True) + "\n"


# --- reading one, strictly --------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One record of a bundle, parsed: the record, and its leaf and proof (None: unproven)."""

    record: StoredRecord
    leaf_index: int | None
    inclusion: tuple[bytes, ...]


@dataclass(frozen=True)
class End:
    """A proof of where a stream ends: its bucket's heads and the sibling hashes."""

    bucket_heads: tuple[heads.Head, ...]
    path: tuple[bytes, ...]


@dataclass(frozen=True)
class Parsed:
    operation_id: str | None
    log: tuple[str, ...]  # the bundle's own vkeys of the log: used only when none is given
    checkpoint: str
    records: tuple[Entry, ...]
    referenced: tuple[Entry, ...]
    missing: tuple[tuple[str, int, int | None], ...]
    ends: dict[str, End]
    answers: dict[str, dict[str, Any]]


def _field(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BundleError(f"{where} is not a {kind.__name__}")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate, which JSON's \u escapes can spell
            raise BundleError(f"{where} is not text (a lone surrogate)") from None
    return value


def _number(value: Any, where: str, low: int = 0) -> int:
    number: int = _field(value, int, where)
    if not low <= number <= _MAX_SEQ:
        raise BundleError(f"{where} is out of range")
    return number


def _digest(text: Any, where: str) -> bytes:
    value = _field(text, str, where)
    try:
        data = bytes.fromhex(value) if len(value) == 64 else b""
    except ValueError:
        data = b""
    if len(data) != 32:
        raise BundleError(f"{where} is not a SHA-256 hash in hex")
    return data


def _b64_digest(text: Any, where: str) -> bytes:
    value = _field(text, str, where)
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if len(data) != merkle.HASH_SIZE:
        raise BundleError(f"{where} is not a base64 SHA-256 hash")
    return data


def _list(value: Any, where: str, limit: int | None = None) -> list[Any]:
    items: list[Any] = _field(value, list, where)
    if limit is not None and len(items) > limit:
        raise BundleError(f"{where} has more than {limit} items")
    return items


def _entry_of(raw: Any, where: str) -> Entry:
    item = _field(raw, dict, where)
    stream = _field(item.get("stream"), str, f"{where}: stream")
    seq = _number(item.get("seq"), f"{where}: seq", 1)
    place = f"{where} (stream {_shown(stream)} seq {seq})"
    try:
        at = datetime.fromisoformat(_field(item.get("at"), str, f"{place}: at"))
        if at.tzinfo is None:
            raise ValueError("no zone")
        epoch_micros(at)
    except (ValueError, OverflowError) as exc:
        raise BundleError(f"{place}: at is not a time with a zone") from exc
    operation_id = item.get("operation_id")
    if operation_id is not None:
        _field(operation_id, str, f"{place}: operation_id")
    record = StoredRecord(
        stream=stream,
        seq=seq,
        at=at,
        kind=_field(item.get("kind"), str, f"{place}: kind"),
        operation_id=operation_id,
        record=_field(item.get("record"), str, f"{place}: record"),
        prev_hash=_digest(item.get("prev_hash"), f"{place}: prev_hash"),
        hash=_digest(item.get("hash"), f"{place}: hash"),
    )
    index = item.get("leaf_index")
    if index is None:
        return Entry(record, None, ())
    index = _number(index, f"{place}: leaf_index")
    proof = _list(item.get("inclusion"), f"{place}: inclusion", _MAX_PROOF)
    return Entry(record, index, tuple(_b64_digest(p, f"{place}: inclusion") for p in proof))


def _end_of(raw: Any, where: str) -> End:
    item = _field(raw, dict, where)
    found = []
    for head in _list(item.get("heads"), f"{where}: heads"):
        stream, seq, digest = _list(head, f"{where}: a head", 3) + [None] * (3 - len(head))
        found.append(
            heads.Head(
                _field(stream, str, f"{where}: a head's stream"),
                _number(seq, f"{where}: a head's seq", 1),
                _digest(digest, f"{where}: a head's hash"),
            )
        )
    siblings = _list(item.get("path"), f"{where}: path", heads.DEPTH)
    return End(tuple(found), tuple(_b64_digest(s, f"{where}: path") for s in siblings))


def parse(bundle: Any) -> Parsed:
    """A bundle's required parts, typed and in range; BundleError names the first that is not."""
    document = _field(bundle, dict, "the bundle")
    if document.get("format") in _EARLIER_FORMATS:
        raise BundleError(
            f"an {document['format']} file proves no stream's end: make it again with"
            " `opgate audit bundle` (this opgate reads {FORMAT})"
        )
    if document.get("format") != FORMAT:
        raise BundleError(f"not an {FORMAT} file")
    operation_id = document.get("operation_id")
    if operation_id is not None:
        _field(operation_id, str, "operation_id")
    log = [_field(document.get("log"), str, "log")]
    log += [
        _field(k, str, "earlier_logs")
        for k in _list(document.get("earlier_logs", []), "earlier_logs")
    ]
    missing = []
    for raw in _list(document.get("missing", []), "missing"):
        item = _field(raw, dict, "missing")
        index = item.get("leaf_index")
        missing.append(
            (
                _field(item.get("stream"), str, "missing: stream"),
                _number(item.get("seq"), "missing: seq", 1),
                None if index is None else _number(index, "missing: leaf_index"),
            )
        )
    ends = {
        _field(stream, str, "ends"): _end_of(raw, f"ends: {_shown(stream)}")
        for stream, raw in _field(document.get("ends", {}), dict, "ends").items()
    }
    answers = {
        _field(op, str, "answers"): _field(answer, dict, f"answers: {_shown(op)}")
        for op, answer in _field(document.get("answers") or {}, dict, "answers").items()
    }
    return Parsed(
        operation_id=operation_id,
        log=tuple(log),
        checkpoint=_field(document.get("checkpoint"), str, "checkpoint"),
        records=tuple(
            _entry_of(r, f"records[{i}]")
            for i, r in enumerate(_list(document.get("records"), "records"))
        ),
        referenced=tuple(
            _entry_of(r, f"referenced[{i}]")
            for i, r in enumerate(_list(document.get("referenced", []), "referenced"))
        ),
        missing=tuple(missing),
        ends=ends,
        answers=answers,
    )


def _shown(text: str) -> str:
    """A name from the bundle as it may be printed: at most 80 characters, and no character
    a terminal would act on or that could reorder the line (controls, bidi, surrogates)."""
    return evidence.printable(text[:80])


# --- verifying it -----------------------------------------------------------------------------
@dataclass
class BundleReport:
    """What verify-bundle found: breaks (exit 1), unproven records, and what was checked."""

    breaks: list[str] = field(default_factory=list)
    unproven: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    proven: int = 0
    tree_size: int = 0
    signed_by: str = "-"  # the log's key that signed the checkpoint (name+key ID)
    cosigners: list[str] = field(default_factory=list)
    operations: list[evidence.OperationEvidence] = field(default_factory=list)


def verify(
    bundle: Any,
    log_keys: str | Sequence[str] = (),
    witness_keys: Sequence[str] = (),
    quorum: int | None = None,
) -> BundleReport:
    """Check a bundle with the log's keys given (its current key and the earlier ones it was
    rotated from; else the bundle's own, which proves less: said), and the witnesses' keys
    given: every one of them must have cosigned, unless ``quorum`` says how many."""
    parsed = parse(bundle)
    report = BundleReport()
    given = [log_keys] if isinstance(log_keys, str) else list(log_keys)
    if not given:
        report.notes.append(
            "the log's key was taken from the bundle itself: pass --log-key (obtained from the"
            " operator beforehand) so that a re-signed bundle cannot pass"
        )
        given = list(parsed.log)
    try:
        log = [note.Verifier.from_vkey(k) for k in given]
        witnesses = [note.Verifier.from_vkey(k) for k in witness_keys]
    except note.NoteError as exc:
        raise BundleError(f"a key: {exc}") from None
    named = len({w.name for w in witnesses})  # a witness given by several keys is one
    needed = named if quorum is None else quorum
    if not witnesses:
        report.notes.append(
            "no witness key given: the checkpoint's cosignatures are not counted (pass"
            " --witness-key for each witness you trust)"
        )
    try:
        opened = open_checkpoint(parsed.checkpoint, log, witnesses)
    except note.NoteError as exc:
        report.breaks.append(f"checkpoint: {exc}")
        return report
    size, root = opened.checkpoint.size, opened.checkpoint.root
    report.tree_size = size
    report.cosigners = sorted({s.name for s in opened.cosignatures})
    report.signed_by = next(f"{k.name}+{k.key_id:08x}" for k in log if k.key_id == opened.signed_by)
    if not opened.witnessed(needed):
        report.breaks.append(
            f"checkpoint: cosigned by {len(report.cosigners)} of the {named} witnesses"
            f" given, {needed} needed"
        )
    proven = _prove(parsed, size, root, report)
    operations = _operations(parsed)
    for entry in parsed.referenced:
        if entry.record.stream in operations:
            report.breaks.append(
                f"stream {_shown(entry.record.stream)} seq {entry.record.seq}: an operation's"
                " own record among the referenced ones (its stream is proven whole, in records)"
            )
    seen: dict[tuple[str, int], int] = {}
    for entry in (*parsed.records, *parsed.referenced):
        position = (entry.record.stream, entry.record.seq)
        seen[position] = seen.get(position, 0) + 1
    for (stream, seq), times in sorted(seen.items()):
        if times > 1:  # a record shown twice would be counted twice (a replay, a claim)
            report.breaks.append(f"stream {_shown(stream)} seq {seq}: more than once in the bundle")
    missing = {(stream, seq) for stream, seq, _ in parsed.missing}
    for stream, seq, index in parsed.missing:
        report.breaks.append(
            f"stream {_shown(stream)} seq {seq}: the log holds leaf {index} for it, but the"
            " record is gone (deleted)"
        )
    streams: dict[str, list[StoredRecord]] = {}
    for entry in parsed.records:
        streams.setdefault(entry.record.stream, []).append(entry.record)
    for stream, present in sorted(streams.items()):
        _check_run(stream, present, missing, stream in operations, report)
    for present in _by_stream(parsed.referenced).values():
        _check_links(present, report)  # sparse: linked where adjacent, no gap rule
    ends = _check_ends(parsed, operations, opened.checkpoint.extensions, proven, report)
    # what the records say of each operation (evidence.py): only proven records speak, and of
    # an operation's stream only what the checkpoint covers, up to its signed end
    speaking = [
        entry.record
        for entry in (*parsed.records, *parsed.referenced)
        if (entry.record.stream, entry.record.seq) in proven
        and entry.record.seq <= ends.get(entry.record.stream, _MAX_SEQ)
    ]
    for found in evidence.operations(speaking, parsed.answers):
        shown = _shown(found.operation_id)
        if any(b.startswith((f"stream {shown}:", f"stream {shown} seq ")) for b in report.breaks):
            # its stream is not the one the log holds: what it would say is not said at all
            found.lines = [
                "not proven: its stream in this bundle is not whole, or not the one the log"
                " holds (the problems below): how often it was sent is not known from it"
            ]
        report.operations.append(found)
        report.breaks.extend(found.breaks)
        report.unproven.extend(found.unproven)
    return report


def _operations(parsed: Parsed) -> set[str]:
    """The operations the verifier speaks about: the bundle's, and every one whose own
    transitions are here. Each must be here whole."""
    found = {
        entry.record.stream
        for entry in (*parsed.records, *parsed.referenced)
        if entry.record.kind == "transition" and entry.record.stream == entry.record.operation_id
    }
    return found | ({parsed.operation_id} if parsed.operation_id else set())


def _prove(parsed: Parsed, size: int, root: bytes, report: BundleReport) -> set[tuple[str, int]]:
    """Each record's content against its hash, and its leaf against the checkpoint's root: the
    positions proven (a record that fails, or is not covered, is not)."""
    proven: set[tuple[str, int]] = set()
    for entry in (*parsed.records, *parsed.referenced):
        record = entry.record
        where = f"stream {_shown(record.stream)} seq {record.seq}"
        expected = record.expected_hash()
        if expected != record.hash:
            report.breaks.append(f"{where}: content does not match its hash (rewritten)")
        if entry.leaf_index is None:
            report.unproven.append(f"{where}: not in the checkpoint (written after it)")
            continue
        leaf = integrator.record_leaf(expected)
        if entry.leaf_index < size and merkle.verify_inclusion(
            leaf, entry.leaf_index, size, list(entry.inclusion), root
        ):
            report.proven += 1
            proven.add((record.stream, record.seq))
        else:
            report.breaks.append(
                f"{where}: is not the record the signed log holds at leaf {entry.leaf_index}"
                " (rewritten, replaced or inserted)"
            )
    return proven


def _by_stream(entries: Sequence[Entry]) -> dict[str, list[StoredRecord]]:
    found: dict[str, list[StoredRecord]] = {}
    for entry in entries:
        found.setdefault(entry.record.stream, []).append(entry.record)
    return found


def _check_run(
    stream: str,
    present: list[StoredRecord],
    missing: set[tuple[str, int]],
    whole: bool,
    report: BundleReport,
) -> None:
    """A stream's records here chain between each other without a gap (an operation's from
    seq 1); a position listed missing counts as present (it is a break of its own)."""
    shown = _shown(stream)
    seqs = sorted(r.seq for r in present)  # (a seq twice is a break of its own, in verify)
    held = set(seqs) | {seq for s, seq in missing if s == stream}
    start = 1 if whole else min(held)
    for gap in _gaps(held, start, max(held)):
        report.breaks.append(f"stream {shown}: {gap} missing")
    _check_links(present, report)


def _gaps(held: set[int], first: int, last: int) -> list[str]:
    """The runs of positions in [first, last] not held, as "record N" or "records N-M"."""
    runs: list[str] = []
    seq = first
    for present in [*sorted(s for s in held if first <= s <= last), last + 1]:
        if present > seq:
            end = present - 1
            runs.append(f"record {seq} is" if end == seq else f"records {seq}-{end} are")
        seq = max(seq, present + 1)
    return runs


def _check_links(present: list[StoredRecord], report: BundleReport) -> None:
    """Each record that follows another here links to it; a first record to the genesis."""
    by_seq = {r.seq: r for r in present}
    for record in present:
        where = f"stream {_shown(record.stream)} seq {record.seq}"
        if record.seq == 1 and record.prev_hash != GENESIS:
            report.breaks.append(f"{where}: not the stream's first record")
        before = by_seq.get(record.seq - 1)
        if before is not None and record.prev_hash != before.hash:
            report.breaks.append(f"{where}: does not chain to the record before it")


def _check_ends(
    parsed: Parsed,
    operations: set[str],
    extensions: Sequence[str],
    proven: set[tuple[str, int]],
    report: BundleReport,
) -> dict[str, int]:
    """Where each operation's stream ends at the checkpoint (heads.py), and that everything up
    to there is here and proven; the end of each, by stream (0: no proof, nothing speaks)."""
    ends: dict[str, int] = {}
    try:
        signed = heads.signed_root(extensions)
    except heads.HeadsError as exc:
        report.breaks.append(f"checkpoint: {exc}")
        signed = None
    entries = (*parsed.records, *parsed.referenced)
    held = {(e.record.stream, e.record.seq): e.record for e in entries}
    # said to be written after the checkpoint: below a signed end, that is a record hidden
    # from what the records say (a claim marked unproven would not be counted)
    uncovered = {(e.record.stream, e.record.seq) for e in entries if e.leaf_index is None}
    for stream in sorted(operations):
        shown = _shown(stream)
        ends[stream] = 0
        proof = parsed.ends.get(stream)
        if signed is None:
            report.breaks.append(
                f"stream {shown}: where it ends is not proven (the checkpoint signs no stream"
                " heads: made before migration 0025, or its line is malformed)"
            )
            continue
        if proof is None:
            report.breaks.append(f"stream {shown}: where it ends is not proven (no proof given)")
            continue
        try:
            head = heads.head_of(stream, proof.bucket_heads, proof.path, signed)
        except heads.HeadsError as exc:
            report.breaks.append(f"stream {shown}: {exc}")
            continue
        end = head.seq if head is not None else 0
        ends[stream] = end
        if (
            head is not None
            and (stream, end) in held
            and held[stream, end].hash != head.record_hash
        ):
            report.breaks.append(
                f"stream {shown} seq {end}: is not the head the checkpoint signs for the stream"
            )
        positions = {seq for s, seq in held if s == stream} | {
            seq for s, seq, _ in parsed.missing if s == stream
        }
        last = max(positions, default=0)
        if last < end:  # a dropped tail: the signed head says the stream goes on
            report.breaks.append(f"stream {shown}: {_gaps(set(), last + 1, end)[0]} missing")
        for seq in sorted(positions):
            if seq <= end and (stream, seq) in uncovered:
                report.breaks.append(
                    f"stream {shown} seq {seq}: at or before the end the checkpoint signs for"
                    f" the stream (seq {end}), yet not proven in it"
                )
            elif seq > end and (stream, seq) in proven:
                report.breaks.append(
                    f"stream {shown} seq {seq}: proven in the checkpoint beyond the end it"
                    f" signs for the stream (seq {end})"
                )
    return ends
