"""``opgate audit verify``: recompute every record's hash, follow each stream's chain, check the
signed checkpoints, and name the first broken record."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from proxy.observe.auditlog import records
from proxy.observe.auditlog.chain import Break, Checkpoint, check_checkpoint_chain, check_record

_CLAIMS_PER_QUERY = 5000
_LATEST = datetime.max.replace(tzinfo=None)


@dataclass
class VerifyReport:
    records: int = 0
    checkpoints: int = 0
    checkpoints_authenticated: bool = False  # False: no key given, MACs not checked
    last_checkpoint: Checkpoint | None = None
    breaks: list[Break] = field(default_factory=list)

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
    async for record, predecessor_hash in records.records_between(conn, since, until):
        report.records += 1
        problem = check_record(record, predecessor_hash)
        if problem is not None:
            report.breaks.append(Break(record.stream, record.seq, record.at, problem))

    cps = await records.checkpoints(conn)
    report.checkpoints = len(cps)
    report.last_checkpoint = cps[-1] if cps else None
    if key is not None:
        report.checkpoints_authenticated = True
        problem = check_checkpoint_chain(key, cps)
        if problem is not None:
            report.breaks.append(Break("(checkpoints)", None, None, problem))
    await _check_claims(conn, [cp for cp in cps if cp.at >= since], report)
    if whole_log:
        for row in await records.mismatched_heads(conn):
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
    conn: asyncpg.Connection, cps: list[Checkpoint], report: VerifyReport
) -> None:
    """Every (stream, seq, hash) a checkpoint signed must still be there, unchanged."""
    claims = {(h.stream, h.seq): (h.hash, cp.checkpoint_id) for cp in cps for h in cp.heads}
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
