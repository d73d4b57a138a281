"""Offline evidence for one operation (``opgate audit bundle``), and its verifier
(``opgate audit verify-bundle``), which needs no database and no settings: the bundle, and
ideally the log's public key and the witnesses' keys obtained some other way (``--log-key``,
``--witness-key``), are all it reads. docs/audit.md, *Bundles*, describes the fields.

What a bundle proves: each record's content hashes (chain.py) to the leaf the signed
checkpoint's tree holds at its index (an RFC 6962 inclusion proof), the operation's stream
chains from its first record without a gap, and the checkpoint is signed by the log and
cosigned by a quorum of witnesses. Records not yet integrated when the bundle was made (written
within the last ``audit_integrate_seconds``) are listed as unproven, not as breaks.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from proxy.observe.auditlog import evidence, integrator
from proxy.observe.auditlog.chain import GENESIS, StoredRecord
from proxy.store import transparency as tstore
from proxy.transparency import merkle, note
from proxy.transparency.checkpoint import open_checkpoint

FORMAT = "opgate-audit-bundle/1"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class BundleError(ValueError):
    """Not a bundle this verifier reads."""


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
    of the operation if one is named) with their inclusion proofs in the latest checkpoint
    (the log's vkey and those it was rotated from, the witnesses' vkeys and the quorum are
    recorded for the reviewer)."""
    if operation_id is None and window is None:
        raise BundleError("name an operation, or a time window")
    latest = await tstore.latest_checkpoint(conn)
    if latest is None:
        raise BundleError("no checkpoint yet: is the integrator running (transparency_key)?")
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
    # what the records refer to: a mandate's presentation record (outside a window too), and
    # the stored provider answers, which no record holds whole (evidence.py checks them)
    have = {(r["stream"], r["seq"]) for r in rows}
    presented = await tstore.mandate_records(conn, operations)
    rows += [r for r in presented if (r["stream"], r["seq"]) not in have]
    answers = {
        a["operation_id"]: _answer(a) for a in await tstore.operation_answers(conn, operations)
    }
    records, missing = [], []
    for row in rows:
        index = row["leaf_index"]
        if row["hash"] is None:
            missing.append(
                {
                    "stream": row["stream"],
                    "seq": row["seq"],
                    "leaf_index": index,
                    "record_hash": bytes(row["record_hash"]).hex(),
                }
            )
            continue
        proven = index is not None and index < size
        records.append(
            {
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
        )
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
        "missing": missing,
        "answers": answers,
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


def _stored(entry: dict[str, Any]) -> StoredRecord:
    return StoredRecord(
        stream=str(entry["stream"]),
        seq=int(entry["seq"]),
        at=datetime.fromisoformat(str(entry["at"])),
        kind=str(entry["kind"]),
        operation_id=entry["operation_id"],
        record=str(entry["record"]),
        prev_hash=bytes.fromhex(str(entry["prev_hash"])),
        hash=bytes.fromhex(str(entry["hash"])),
    )


def verify(
    bundle: dict[str, Any],
    log_keys: str | Sequence[str] = (),
    witness_keys: Sequence[str] = (),
    quorum: int | None = None,
) -> BundleReport:
    """Check a bundle with the log's keys given (its current key and the earlier ones it was
    rotated from; else the bundle's own, which proves less: said) and the witnesses' keys."""
    report = BundleReport()
    if bundle.get("format") != FORMAT:
        raise BundleError(f"not an {FORMAT} file")
    given = [log_keys] if isinstance(log_keys, str) else list(log_keys)
    if not given:
        report.notes.append(
            "the log's key was taken from the bundle itself: pass --log-key (obtained from the"
            " operator beforehand) so that a re-signed bundle cannot pass"
        )
        given = [bundle["log"], *bundle.get("earlier_logs", ())]
    log = [note.Verifier.from_vkey(k) for k in given]
    witnesses = [note.Verifier.from_vkey(k) for k in witness_keys or bundle["witnesses"]]
    needed = quorum if quorum is not None else int(bundle.get("quorum", 0))
    if needed and not witness_keys:
        report.notes.append(
            "the witnesses' keys were taken from the bundle itself: pass --witness-key for each"
            " witness you trust, or the cosignatures prove nothing"
        )
    try:
        opened = open_checkpoint(bundle["checkpoint"], log, witnesses)
    except note.NoteError as exc:
        report.breaks.append(f"checkpoint: {exc}")
        return report
    size, root = opened.checkpoint.size, opened.checkpoint.root
    report.tree_size = size
    report.cosigners = sorted({s.name for s in opened.cosignatures})
    report.signed_by = next(f"{k.name}+{k.key_id:08x}" for k in log if k.key_id == opened.signed_by)
    if not opened.witnessed(needed):
        report.breaks.append(
            f"checkpoint: cosigned by {len(report.cosigners)} known witnesses, {needed} needed"
        )
    by_stream: dict[str, list[StoredRecord]] = {}
    for entry in bundle["records"]:
        record = _stored(entry)
        where = f"stream {record.stream} seq {record.seq}"
        by_stream.setdefault(record.stream, []).append(record)
        expected = record.expected_hash()
        if expected != record.hash:
            report.breaks.append(f"{where}: content does not match its hash (rewritten)")
        index = entry.get("leaf_index")
        if index is None:
            report.unproven.append(f"{where}: not in the checkpoint (written after it)")
            continue
        proof = [base64.b64decode(p) for p in entry.get("inclusion") or ()]
        leaf = integrator.record_leaf(expected)
        if merkle.verify_inclusion(leaf, int(index), size, proof, root):
            report.proven += 1
        else:
            report.breaks.append(
                f"{where}: is not the record the signed log holds at leaf {index}"
                " (rewritten, replaced or inserted)"
            )
    operation_id = bundle.get("operation_id")
    for missing in bundle.get("missing", ()):
        report.breaks.append(
            f"stream {missing['stream']} seq {missing['seq']}: the log holds leaf"
            f" {missing['leaf_index']} for it, but the record is gone (deleted)"
        )
    if bundle.get("since") is None:  # a window need not hold a stream's first record
        chain = sorted(by_stream.get(str(operation_id), []), key=lambda r: r.seq)
        _check_chain(chain, {int(m["seq"]) for m in bundle.get("missing", ())}, report)
    # what the records say of each operation, and what they refer to (evidence.py); a record
    # found altered above still speaks here, so that a swapped item is named as well
    records = [record for stream in by_stream.values() for record in stream]
    for found in evidence.operations(records, bundle.get("answers") or {}):
        report.operations.append(found)
        report.breaks.extend(found.breaks)
        report.unproven.extend(found.unproven)
    return report


def _check_chain(chain: list[StoredRecord], missing: set[int], report: BundleReport) -> None:
    """The operation's own stream: from seq 1, without a gap, each linking to the one before."""
    previous: StoredRecord | None = None
    for record in chain:
        expected_seq = previous.seq + 1 if previous else 1
        if record.seq != expected_seq and not set(range(expected_seq, record.seq)) <= missing:
            report.breaks.append(
                f"stream {record.stream}: records {expected_seq}-{record.seq - 1} are missing"
            )
        elif previous is not None and record.seq == expected_seq:
            if record.prev_hash != previous.hash:
                report.breaks.append(
                    f"stream {record.stream} seq {record.seq}: does not chain to the record"
                    " before it"
                )
        elif previous is None and record.seq == 1 and record.prev_hash != GENESIS:
            report.breaks.append(f"stream {record.stream} seq 1: not the stream's first record")
        previous = record


def dumps(bundle: dict[str, Any]) -> str:
    return json.dumps(bundle, indent=1, sort_keys=True) + "\n"
