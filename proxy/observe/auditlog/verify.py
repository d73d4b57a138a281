"""``opgate audit verify``: recompute every record's hash, follow each stream's chain, check the
signed checkpoints, check that each instance's request records are all there (their numbers,
``instance_seq``), and name the first broken record.

It also names each run of an instance that ended without a clean stop (``audit_instance_runs``,
migration 0012), with what its last trace says it had numbered and not stored. That is what
it can know: the records numbered after that trace never reached the database at all (the log
stream has them). A run is taken as still running, not ended, while its last trace is
younger than ``MISSED_HEARTBEATS`` of its heartbeats: a running writer leaves one at least
every heartbeat (``audit_heartbeat_seconds``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from proxy.observe.auditlog import records
from proxy.observe.auditlog.chain import Break, Checkpoint, check_checkpoint_chain, check_record
from proxy.observe.auditlog.retention import Retention, retention_from

_CLAIMS_PER_QUERY = 5000
_UNSTORABLE = '"record_type": "unstorable"'  # as jsonb prints it
_LATEST = datetime.max.replace(tzinfo=None)
# A run silent for this many of its heartbeats has ended (a busy event loop or a slow
# database can delay one or two).
MISSED_HEARTBEATS = 3.0


@dataclass
class VerifyReport:
    records: int = 0
    checkpoints: int = 0
    checkpoints_authenticated: bool = False  # False: no key given, MACs not checked
    last_checkpoint: Checkpoint | None = None
    breaks: list[Break] = field(default_factory=list)
    # Request records the writer dropped before storage and said so (a `dropped` record): not
    # a break, the log stream has them; shown so that a loss is never silent.
    dropped: list[str] = field(default_factory=list)
    unstorable: int = 0  # placeholders for records the database refused
    pruned_through: int | None = None  # the seal old records were pruned through
    retention: Retention = field(default_factory=Retention)  # the cuts in force
    # Runs that ended without a clean stop (or stopped with numbers never stored), and runs
    # still running: not breaks (nothing stored was altered), shown so no loss is silent.
    unaccounted: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.breaks

    def first_break(self) -> Break | None:
        """The earliest broken place: by recording time, then stream and position."""
        if not self.breaks:
            return None
        return min(
            self.breaks,
            key=lambda b: (b.at.replace(tzinfo=None) if b.at else _LATEST, b.stream, b.seq or 0),
        )


async def verify(
    conn: asyncpg.Connection,
    since: datetime,
    until: datetime,
    *,
    key: bytes | None,
    whole_log: bool,
) -> VerifyReport:
    report = VerifyReport()
    cps = await records.checkpoints(conn)
    # Where old records were pruned (retention.py): read before the records, so that a stream's
    # new beginning is checked against the hash signed for what was cut.
    retention, problems = retention_from(await records.retention_records(conn), cps, key)
    report.breaks.extend(Break(records.STREAM_RETENTION, None, None, p) for p in problems)
    report.pruned_through = retention.through_checkpoint
    report.retention = retention
    async for record, predecessor_hash in records.records_between(conn, since, until):
        report.records += 1
        pruned_hash = retention.pruned_hash(record.stream, record.seq)
        problem = check_record(record, predecessor_hash, pruned_hash)
        if problem is not None:
            report.breaks.append(Break(record.stream, record.seq, record.at, problem))
        if record.kind == "request" and _UNSTORABLE in record.record:
            report.unstorable += 1

    report.checkpoints = len(cps)
    report.last_checkpoint = cps[-1] if cps else None
    if key is not None:
        report.checkpoints_authenticated = True
        problem = check_checkpoint_chain(key, cps)
        if problem is not None:
            report.breaks.append(Break("(checkpoints)", None, None, problem))
    await _check_claims(conn, [cp for cp in cps if cp.at >= since], retention, report)
    if whole_log:
        report.unaccounted, report.running = await unaccounted_runs(conn)
        await _check_numbering(conn, retention, report)
        for row in await records.mismatched_heads(conn):
            cut = retention.cuts.get(row["stream"])
            if (
                row["last_seq"] is None
                and cut is not None
                and (cut.seq, cut.hash) == (row["head_seq"], bytes(row["head_hash"]))
            ):
                continue  # every record of the stream was pruned, up to its signed head
            report.breaks.append(
                Break(
                    row["stream"],
                    row["head_seq"],
                    None,
                    f"the stream's head is at seq {row['head_seq']} but its last record is "
                    f"{row['last_seq']} (tail deleted, or appended around the chain)",
                )
            )
    return report


async def _check_claims(
    conn: asyncpg.Connection, cps: list[Checkpoint], retention: Retention, report: VerifyReport
) -> None:
    """Every (stream, seq, hash) a checkpoint signed must still be there, unchanged (unless a
    prune removed it)."""
    claims = {
        (h.stream, h.seq): (h.hash, cp.checkpoint_id)
        for cp in cps
        for h in cp.heads
        if not retention.pruned(h.stream, h.seq)
    }
    positions = list(claims)
    for start in range(0, len(positions), _CLAIMS_PER_QUERY):
        found = await records.hashes_at(conn, positions[start : start + _CLAIMS_PER_QUERY])
        for position, actual in found.items():
            signed, checkpoint_id = claims[position]
            if actual is None:
                problem = f"signed by checkpoint {checkpoint_id} but missing (deleted)"
            elif actual != signed:
                problem = (
                    f"differs from the hash checkpoint {checkpoint_id} signed (chain rewritten)"
                )
            else:
                continue
            report.breaks.append(Break(position[0], position[1], None, problem))


async def _check_numbering(
    conn: asyncpg.Connection, retention: Retention, report: VerifyReport
) -> None:
    """Every number an instance gave a request record is stored, or declared dropped (or was
    pruned)."""
    for row in await records.request_numbering(conn, retention.floors):
        stream, problem = row["stream"], row["problem"]
        instance = stream.removeprefix(records.REQUEST_STREAM_PREFIX)
        numbers = f"{row['first']}" + (f"-{row['last']}" if row["last"] != row["first"] else "")
        run = f" (run {row['run']} of the stream)" if row["run"] > 1 else ""
        if problem == "dropped":
            report.dropped.append(
                f"stream {stream}: request records of instance {instance} dropped before"
                f" storage: {numbers}{run} (in the log stream only)"
            )
        elif problem == "missing":
            report.breaks.append(
                Break(
                    stream,
                    None,
                    None,
                    f"request records of instance {instance} missing: {numbers}{run}"
                    " (logged by the instance, never stored or deleted since)",
                )
            )
        else:
            report.breaks.append(
                Break(
                    stream,
                    None,
                    None,
                    f"request records of instance {instance} stored twice: {numbers}{run}",
                )
            )


async def unaccounted_runs(conn: asyncpg.Connection) -> tuple[list[str], list[str]]:
    """What each run's trace (migration 0012) says about its tail: the runs that ended without
    a clean stop or stopped with numbers never stored, and the runs still running."""
    unaccounted, running = [], []
    for row in await records.runs_unaccounted(conn, MISSED_HEARTBEATS):
        instance, after = row["instance_id"], row["stored_seq"]
        lost = row["numbered_seq"] - after
        seen = row["last_seen_at"].isoformat(timespec="seconds")
        run = f"run {row['run_id']} started {row['started_at'].isoformat(timespec='seconds')}"
        if row["stopped_at"] is not None:
            unaccounted.append(
                f"instance {instance} stopped with {lost} records after seq {after} never"
                f" stored ({run}; in the log stream only)"
            )
        elif row["running"]:
            running.append(
                f"instance {instance} is running ({run}; last trace"
                f" {row['seconds_since_seen']:.0f} s ago): the records it has queued are not"
                " counted"
            )
        else:
            unaccounted.append(
                f"instance {instance} ended without a clean stop; at least {lost} records"
                f" after seq {after} are unaccounted for: {lost} numbered by its last trace at"
                f" {seen} and never stored, and any it numbered after that trace, which the"
                f" database never saw ({run}; the log stream has them)"
            )
    return unaccounted, running
