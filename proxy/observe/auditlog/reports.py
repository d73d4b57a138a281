"""What ``opgate audit`` prints, made from what the verifiers found: pure text, no IO (cli.py
prints it). A timeline's rows and their table (``show``), a record as a JSON Lines entry
(``export``), the tree's summary (``verify``, ``verify-tree``) and a bundle's report
(``verify-bundle``).
"""

from __future__ import annotations

import json
from datetime import UTC

from proxy.observe.auditlog.bundle import BundleReport
from proxy.observe.auditlog.chain import StoredRecord
from proxy.observe.auditlog.evidence import printable
from proxy.observe.auditlog.redact import Redactor
from proxy.observe.auditlog.treecheck import TreeReport


def timeline_rows(stored: list[StoredRecord], redactor: Redactor) -> list[list[str]]:
    """One row per record: time, kind, event, status change, who, details."""
    rows = []
    for record in stored:
        fields = redactor.mapping(record.fields())
        if record.kind == "request":
            event = str(fields.get("decision")) + (
                f" {fields['reason']}" if fields.get("reason") else ""
            )
            who = fields.get("agent_id") or "-"
            details = {
                k: fields.get(k)
                for k in ("request_id", "attempt", "provider_status", "response_status")
                if fields.get(k) is not None
            }
        else:
            event = str(fields.get("event"))
            who = fields.get("actor") or "-"
            details = fields.get("detail") or {}
        before, after = fields.get("status_before"), fields.get("status_after")
        change = f"{before or '-'} -> {after or '-'}" if before or after else ""
        rows.append(
            [
                record.at.astimezone(UTC).isoformat(timespec="milliseconds"),
                record.kind,
                event,
                change,
                str(who),
                json.dumps(details, separators=(",", ":"), sort_keys=True, default=str),
            ]
        )
    return rows


def render_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, ["-" * w for w in widths], *rows]
    ]
    return "\n".join(lines)


def export_line(record: StoredRecord, redactor: Redactor) -> str:
    """One JSON Lines entry: the record's own fields, plus where it sits in its chain."""
    line = {
        **redactor.mapping(record.fields()),
        "recorded_at": record.at.isoformat(),
        "audit_kind": record.kind,
        "audit_stream": record.stream,
        "audit_seq": record.seq,
        "audit_hash": record.hash.hex(),
        "audit_prev_hash": record.prev_hash.hex(),
    }
    return json.dumps(line, separators=(",", ":"), default=str)


def tree_summary(report: TreeReport) -> str:
    summary = (
        f"{report.leaves} leaves, {report.nodes} nodes, {report.checkpoints} checkpoints"
        f" signed by {', '.join(report.signers) or '-'}; the latest cosigned by"
        f" {len(report.cosigners)} witnesses ({', '.join(report.cosigners) or '-'})"
    )
    if report.pruned:
        summary += (
            f"; {report.pruned} records pruned (at or before the cuts of seal"
            f" {report.pruned_through}: in the prune's archive)"
        )
    if report.pending:
        assert report.oldest_pending is not None
        summary += (
            f"; {report.pending} records not integrated yet (oldest written"
            f" {report.oldest_pending.isoformat()}): not covered by any checkpoint"
        )
    return summary


def bundle_report_lines(report: BundleReport) -> list[str]:
    """What the bundle proves, each line as the reviewer's terminal may show it (any value a
    record holds is escaped where a terminal would act on it, or it would reorder the line)."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(printable(line))

    for line in report.notes:
        say(f"note: {line}")
    summary = (
        f"{report.proven} records proven in a checkpoint of {report.tree_size} records"
        f" signed by {report.signed_by}, cosigned by {len(report.cosigners)} witnesses"
        f" ({', '.join(report.cosigners) or '-'})"
    )
    for found in report.operations:  # did opgate send it, how often, who approved it
        say(f"operation {found.operation_id}:")
        for line in found.lines:
            say(f"  {line}")
    for line in report.unproven:
        say(f"unproven: {line}")
    if report.breaks:
        say(f"BROKEN: {len(report.breaks)} problems; {summary}")
        for line in report.breaks:
            say(f"  {line}")
        return lines
    say(f"ok: {summary}")
    return lines
