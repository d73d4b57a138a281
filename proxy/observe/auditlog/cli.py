"""``opgate audit``: the audit log for security review and SIEMs, and the transparency log over
it (docs/audit.md). The one command module: it reads the database, the settings and files, and
prints what the verifiers (verify, treecheck, bundle, evidence, proofs over the pure
proxy/transparency/) found, as reports.py words it.

    opgate audit verify [--since T] [--until T] [--log-key K ...]
                                                    exit 0: intact; 1: names the first break
                                                    (of the chains, else of the tree)
    opgate audit show OPERATION_ID                  one operation's timeline, as a table;
                                                    exit 1: a record is marked BROKEN
    opgate audit export --since T --until T [-o F]  JSON Lines (redacted), for a SIEM
    opgate audit export --after CURSOR_FILE [--follow]   resumable: what was not exported yet
    opgate audit grant-reviewer ROLE [--apply]      a read-only database role for reviewers
    opgate audit prune --through-checkpoint N --archive F   archive, then delete old records
                                                    (N: a seal's number)
    opgate audit checkpoint                      the latest signed checkpoint, with cosignatures
    opgate audit prove STREAM:SEQ [--size N]     a record's inclusion proof (JSON)
    opgate audit consistency OLD NEW             a consistency proof between two tree sizes
    opgate audit verify-tree [--log-key K ...]   the stored records against the signed tree
    opgate audit bundle --operation OP [-o F]    offline evidence for one operation
    opgate audit bundle --since T --until T      ... for what was written in a window
    opgate audit verify-bundle F [--log-key K ...]   check a bundle: no database, no settings
    opgate audit witness --key F --log K ...     a minimal C2SP tlog-witness (its own process)
    opgate audit new-key NAME [--cosigner] -o F  an Ed25519 key: the log's, or a witness's

``verify-bundle``, ``witness`` and ``new-key`` read neither the database nor any setting.
Times are ISO 8601 (``2026-05-01T12:00:00Z``); a time without a zone is read as UTC. The
database is ``--database-url`` (or ``OPGATE_DATABASE_URL``), else the embedded PostgreSQL in
``data_dir``, as ``opgate serve`` uses; the checkpoint key is the same secret opgate signs
with (``OPGATE_SECRET_AUDIT_KEY`` or ``<secrets_dir>/audit_key``). ``--dev`` (the log of an
``opgate serve --dev``) is resolved by the process (proxy/cli.py) before a command runs.

The export cursor is a JSON file ``{"stream": seq, ...}``: per stream, the last record
exported. Within a stream, seq order is commit order (the stream's head row is locked from a
record's insert to its commit), so "every record after the cursor" misses none that commits
late, unlike a window by ``at`` (the inserting transaction's start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import asyncpg
from aiohttp import web

from proxy.errors import StoreUnavailable, store_unavailable_line
from proxy.observe.auditlog import bundle, evidence, proofs, records, retention
from proxy.observe.auditlog.chain import StoredRecord, check_record
from proxy.observe.auditlog.redact import Redactor
from proxy.observe.auditlog.reports import (
    bundle_report_lines,
    export_line,
    render_table,
    timeline_rows,
    tree_summary,
)
from proxy.observe.auditlog.treecheck import TreeReport, check_tree
from proxy.observe.auditlog.verify import VerifyReport, verify
from proxy.observe.auditlog.witness_server import WitnessState, witness_app
from proxy.observe.observer import transparency_signer
from proxy.settings import Secrets, Settings, load_settings
from proxy.store import audit as audit_store
from proxy.store.embedded import database_dsn
from proxy.store.faults import is_unavailable
from proxy.store.migrate import migrate
from proxy.transparency import note

_BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)
_END = datetime(9999, 1, 1, tzinfo=UTC)
_SHOWN_PROBLEMS = 50
_EXPORT_PAGE = 1000


def add_audit_commands(commands: Any) -> None:
    audit = commands.add_parser("audit", help="verify, show and export the audit log")
    audit_commands = audit.add_subparsers()

    check = audit_commands.add_parser(
        "verify", help="check the hash chains, checkpoints and the transparency tree"
    )
    _flags(check)
    check.add_argument("--since", type=_time, help="records recorded at or after (default: all)")
    check.add_argument("--until", type=_time, help="records recorded before (default: all)")
    _log_keys_flag(check)
    check.set_defaults(handler=_runner(_verify))

    show = audit_commands.add_parser(
        "show", help="one operation's timeline, each record's hash and link checked"
    )
    _flags(show)
    show.add_argument("operation_id")
    show.set_defaults(handler=_runner(_show))

    export = audit_commands.add_parser("export", help="write records as JSON Lines")
    _flags(export)
    export.add_argument("--since", type=_time, help="records recorded at or after")
    export.add_argument("--until", type=_time, help="records recorded before")
    export.add_argument(
        "--after",
        type=Path,
        metavar="CURSOR_FILE",
        help="export what follows this cursor (a missing file: from the start); the file is"
        " rewritten after each batch written, so a rerun resumes",
    )
    export.add_argument(
        "--follow", action="store_true", help="with --after: keep polling until Ctrl-C"
    )
    export.add_argument("--poll-seconds", type=float, default=2.0, help="--follow's interval")
    export.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    export.set_defaults(handler=_runner(_export))

    grant = audit_commands.add_parser(
        "grant-reviewer",
        help="print (or --apply) the GRANTs of a read-only role on the audit tables",
    )
    _flags(grant)
    grant.add_argument("role", help="an existing database role (CREATE ROLE is yours to run)")
    grant.add_argument("--apply", action="store_true", help="run them instead of printing")
    grant.set_defaults(handler=_runner(_grant_reviewer))

    prune = audit_commands.add_parser(
        "prune", help="archive, then delete the records signed up to a checkpoint"
    )
    _flags(prune)
    prune.add_argument("--through-checkpoint", type=int, required=True, metavar="N")
    prune.add_argument(
        "--archive", type=Path, required=True, help="file to archive them in (must not exist)"
    )
    prune.set_defaults(handler=_runner(_prune))

    latest = audit_commands.add_parser("checkpoint", help="the latest signed checkpoint")
    _flags(latest)
    latest.set_defaults(handler=_runner(_checkpoint))

    prove = audit_commands.add_parser("prove", help="one record's inclusion proof")
    _flags(prove)
    prove.add_argument("record", help="STREAM:SEQ (e.g. op_4f2a...:3, requests/host:1:812)")
    prove.add_argument("--size", type=int, help="in the checkpoint of this size (default: latest)")
    prove.set_defaults(handler=_runner(_prove))

    consistency = audit_commands.add_parser("consistency", help="a consistency proof OLD -> NEW")
    _flags(consistency)
    consistency.add_argument("old", type=int)
    consistency.add_argument("new", type=int)
    consistency.set_defaults(handler=_runner(_consistency))

    tree = audit_commands.add_parser(
        "verify-tree", help="the stored records against the signed tree"
    )
    _flags(tree)
    _log_keys_flag(tree)
    tree.set_defaults(handler=_runner(_verify_tree))

    make = audit_commands.add_parser("bundle", help="offline evidence for one operation")
    _flags(make)
    make.add_argument("--operation", metavar="OP", help="its records (default: all, in a window)")
    make.add_argument("--since", type=_time, help="records written at or after (with --until)")
    make.add_argument("--until", type=_time, help="records written before")
    make.add_argument("--log-key", help="the log's vkey (default: from transparency_key)")
    make.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    make.set_defaults(handler=_runner(_bundle))

    check = audit_commands.add_parser("verify-bundle", help="check a bundle, offline")
    check.add_argument("file", type=Path)
    check.add_argument(
        "--log-key",
        action="append",
        default=[],
        help="a vkey of the log, obtained from the operator beforehand (repeatable: its"
        " current key and the earlier ones it was rotated from)",
    )
    check.add_argument(
        "--witness-key", action="append", default=[], help="a witness's vkey (repeatable)"
    )
    check.add_argument(
        "--quorum",
        type=int,
        help="cosignatures required among the --witness-key given (default: every one of them)",
    )
    check.set_defaults(handler=_verify_bundle)

    witness = audit_commands.add_parser("witness", help="run a minimal C2SP tlog-witness")
    witness.add_argument("--key", type=Path, required=True, help="file with its PRIVATE+KEY")
    witness.add_argument(
        "--log",
        action="append",
        required=True,
        help="a trusted log's vkey (repeatable; a log that rotated its key: each of its keys)",
    )
    witness.add_argument("--state", type=Path, required=True, help="its state file (JSON)")
    witness.add_argument("--listen", default="127.0.0.1:8465", help="HOST:PORT (port 0: any)")
    witness.set_defaults(handler=_witness)

    key = audit_commands.add_parser(
        "new-key", help="make an Ed25519 key (the log's or a witness's)"
    )
    key.add_argument("name", help="its name: the log's origin, or the witness's name")
    key.add_argument("--cosigner", action="store_true", help="a witness's cosigning key")
    key.add_argument("-o", "--output", type=Path, required=True, help="secret file (0600)")
    key.set_defaults(handler=_new_key)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="PostgreSQL primary (default: OPGATE_DATABASE_URL)")
    parser.add_argument("--secrets-dir", type=Path, help="where audit_key is (if not in env)")
    parser.add_argument("--data-dir", type=Path, help="the embedded database's (no URL given)")
    parser.add_argument(
        "--dev",
        action="store_true",
        dest="audit_dev",  # resolved by the process (proxy/cli.py), which reads dev mode's files
        help="the log of an `opgate serve --dev`: its database and its log's key, as recorded"
        " in the data directory",
    )


def _log_keys_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-key",
        action="append",
        default=[],
        help="a vkey of the log (repeatable; default: transparency_key's, and"
        " audit_earlier_log_keys)",
    )


def _time(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


Command = Callable[[asyncpg.Connection, argparse.Namespace, Any], Coroutine[Any, Any, int]]


def _runner(command: Command) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        given = {
            "database_url": args.database_url,
            "secrets_dir": args.secrets_dir,
            "data_dir": args.data_dir,
        }
        settings = load_settings(given)

        async def run() -> int:
            # the embedded PostgreSQL when no URL is given, like `opgate serve`
            async with database_dsn(settings.database_url, settings.data_dir) as dsn:
                if settings.database_url is None:
                    await migrate(dsn)  # a fresh data_dir: an empty, verifiable log
                conn = await asyncpg.connect(dsn)
                try:
                    return await command(conn, args, settings)
                finally:
                    await conn.close()

        try:
            return asyncio.run(run())
        except KeyboardInterrupt:  # Ctrl-C ends --follow; the cursor is already saved
            return 0
        except StoreUnavailable as exc:  # migrating the embedded database
            print(store_unavailable_line(exc), file=sys.stderr)
            return 2
        except Exception as exc:
            # a statement's error too: the command cannot go on either way (one line, exit 2)
            if not (isinstance(exc, asyncpg.PostgresError) or is_unavailable(exc)):
                raise
            print(f"opgate audit: database error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2

    return handler


def _key(settings: Settings) -> bytes | None:
    secret = Secrets(settings.secrets_dir).secret("audit_key")
    return secret.encode("utf-8") if secret else None


async def _verify(conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings) -> int:
    whole = args.since is None and args.until is None
    since, until = args.since or _BEGINNING, args.until or _END
    try:
        keys = log_keys(args, settings)
    except note.NoteError as exc:
        print(f"opgate audit verify: the log's key: {exc}", file=sys.stderr)
        return 2
    report = await verify(conn, since, until, key=_key(settings), whole_log=whole)
    # "seals": the HMAC-signed heads of the chains (audit_checkpoints), a word of their own so
    # that "checkpoint" names only the transparency log's signed tree heads
    signed = (
        "signatures verified"
        if report.checkpoints_authenticated
        else "signatures NOT verified (no audit key)"
    )
    last = report.last_checkpoint
    summary = f"{report.records} records, {report.checkpoints} seals ({signed})" + (
        f"; last seal {last.checkpoint_id} mac {last.mac.hex()}" if last else ""
    )
    if report.pruned_through is not None:
        summary += f"; pruned through seal {report.pruned_through}"
    if report.unstorable:
        summary += f"; {report.unstorable} request records unstorable (placeholders)"
    tree, unchecked = await _tree(conn, keys, settings, whole, report)
    tree_broken = tree is not None and bool(tree.breaks)
    first = report.first_break()
    if first is not None:
        print(f"BROKEN: first broken record: {first.describe()}")
        print(f"{len(report.breaks)} problems in {summary}:")
        for problem in report.breaks[:_SHOWN_PROBLEMS]:
            print(f"  {problem.describe()}")
    elif tree is not None and tree.breaks:
        print(f"BROKEN: the tree: {tree.breaks[0]}")
        print(f"chains ok: {summary}")
    else:
        print(f"ok: {summary}")
    if tree is None:
        print(f"tree: not checked ({unchecked})")
    elif tree.breaks:
        print(f"tree: BROKEN: {len(tree.breaks)} problems; {tree_summary(tree)}")
        for line in tree.breaks[:_SHOWN_PROBLEMS]:
            print(f"  {line}")
    else:
        print(f"tree: ok: {tree_summary(tree)}")
    _print_losses(report)
    return 1 if first is not None or tree_broken else 0


async def _tree(
    conn: asyncpg.Connection,
    keys: list[note.Verifier] | None,
    settings: Settings,
    whole: bool,
    chains: VerifyReport,
) -> tuple[TreeReport | None, str]:
    """The transparency tree checked with the log's keys (treecheck.py), or why it was not;
    the records pruned at or before the retention's cuts (which verify read, authenticated
    with the audit key when given) are counted as pruned, not deleted."""
    if not whole:
        return None, "--since/--until: the tree is checked on the whole log"
    if keys is None:
        return None, "no transparency_key; give --log-key"
    witnesses = [w.vkey for w in settings.audit_witnesses]
    return await check_tree(conn, keys, witnesses, chains.retention), ""


def _print_losses(report: VerifyReport) -> None:
    """What was lost before storage: not breaks (nothing stored was altered), never silent."""
    dropped = f"{len(report.dropped)} ranges of request records were dropped before storage:"
    _print_lines(report.dropped, dropped)
    _print_lines(
        report.unaccounted,
        f"{len(report.unaccounted)} instance runs may have lost request records at their end:",
    )
    _print_lines(report.running, f"{len(report.running)} instances running:")


def _print_lines(lines: list[str], heading: str) -> None:
    if lines:
        print(heading)
    for line in lines[:_SHOWN_PROBLEMS]:
        print(f"  {line}")


async def _prune(conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings) -> int:
    key = _key(settings)
    if key is None:
        print("opgate audit prune: needs the audit key (its record is signed)", file=sys.stderr)
        return 2
    report = await verify(conn, _BEGINNING, _END, key=key, whole_log=True)
    first = report.first_break()
    if first is not None:
        print(f"refused: the log does not verify: {first.describe()}", file=sys.stderr)
        return 1
    try:
        pruned = await retention.prune(conn, key, args.through_checkpoint, args.archive)
    except retention.PruneRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    except FileExistsError:
        print(f"refused: {args.archive} exists", file=sys.stderr)
        return 1
    print(
        f"pruned {pruned.records} records of {pruned.streams} streams through seal"
        f" {pruned.through_checkpoint}; archive {args.archive} sha256 {pruned.archive_sha256}"
    )
    return 0


async def chain_problems(
    conn: asyncpg.Connection, stored: list[StoredRecord], key: bytes | None
) -> list[str | None]:
    """For each record, why it does not verify (its hash, or its link to the record before it
    in its stream), or None: verify's own check (chain.check_record), record by record."""
    before = [(r.stream, r.seq - 1) for r in stored if r.seq > 1]
    predecessors = await records.hashes_at(conn, before) if before else {}
    cps = await records.checkpoints(conn)
    pruned, _ = retention.retention_from(await records.retention_records(conn), cps, key)
    return [
        check_record(
            record,
            predecessors.get((record.stream, record.seq - 1)),
            pruned.pruned_hash(record.stream, record.seq),
        )
        for record in stored
    ]


async def _show(conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings) -> int:
    stored = await records.operation_records(conn, args.operation_id)
    if not stored:
        print(f"no audit records for {args.operation_id}", file=sys.stderr)
        return 1
    redactor = Redactor(settings.audit_redact_fields, secrets=_secrets(settings))
    problems = await chain_problems(conn, stored, _key(settings))
    broken = [(r, p) for r, p in zip(stored, problems, strict=True) if p is not None]
    header = ["chain", "time (UTC)", "kind", "event", "status", "by", "details"]
    rows = [
        ["ok" if problem is None else "BROKEN", *row]
        for problem, row in zip(problems, timeline_rows(stored, redactor), strict=True)
    ]
    print(
        f"operation {args.operation_id}: {len(stored)} audit records"
        + (f", {len(broken)} BROKEN (not as recorded: do not trust them)" if broken else "")
    )
    print(render_table(header, rows))
    for record, problem in broken:
        print(f"BROKEN: stream {record.stream} seq {record.seq}: {problem}")
    return 1 if broken else 0


async def _export(conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings) -> int:
    if args.after is None and (args.since is None or args.until is None or args.follow):
        print(
            "opgate audit export: give --since and --until, or --after CURSOR_FILE"
            " (with --follow to keep going)",
            file=sys.stderr,
        )
        return 2
    if args.after is not None and (args.since is not None or args.until is not None):
        print("opgate audit export: --after does not combine with --since/--until", file=sys.stderr)
        return 2
    redactor = Redactor(settings.audit_redact_fields, secrets=_secrets(settings))
    mode = "a" if args.after is not None else "w"  # a resumed export appends to its file
    out: TextIO = args.output.open(mode, encoding="utf-8") if args.output else sys.stdout
    count = 0
    try:
        if args.after is None:
            async for record, _ in records.records_between(conn, args.since, args.until):
                out.write(export_line(record, redactor) + "\n")
                count += 1
        else:
            count = await _export_after(conn, args, redactor, out)
    finally:
        if args.output:
            out.close()
        print(f"exported {count} records", file=sys.stderr)
    return 0


async def _export_after(
    conn: asyncpg.Connection, args: argparse.Namespace, redactor: Redactor, out: TextIO
) -> int:
    """Pages of records after the cursor; the cursor file is rewritten once each page is
    written and flushed (a crash between the two repeats a page, never skips one)."""
    cursor = records.read_cursor(args.after)
    count = 0
    while True:
        page = await records.records_after(conn, cursor, _EXPORT_PAGE)
        for record in page:
            out.write(export_line(record, redactor) + "\n")
            cursor[record.stream] = record.seq
        if page:
            out.flush()
            records.write_cursor(args.after, cursor)
            count += len(page)
        if len(page) == _EXPORT_PAGE:
            continue
        if not args.follow:
            return count
        await asyncio.sleep(args.poll_seconds)  # polling a table: no event to wait on


async def _grant_reviewer(
    conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings
) -> int:
    statements = await records.reviewer_grants(conn, args.role)
    if not args.apply:
        print("\n".join(f"{s};" for s in statements))
        return 0
    await audit_store.grant(conn, statements)
    print(f"granted {args.role} read-only access to the audit tables", file=sys.stderr)
    return 0


def _secrets(settings: Settings) -> list[str]:
    key = _key(settings)
    return [key.decode("utf-8")] if key else []


# --- the transparency log ----------------------------------------------------------------------
def _json(value: Any) -> int:
    print(json.dumps(value, indent=1))
    return 0


async def _checkpoint(
    conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings
) -> int:
    try:
        sys.stdout.write(await proofs.signed_checkpoint(conn))
    except proofs.NotProvable as exc:
        print(f"opgate audit checkpoint: {exc}", file=sys.stderr)
        return 1
    return 0


async def _prove(conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings) -> int:
    try:
        stream, seq = proofs.parse_record(args.record)
        return _json(await proofs.inclusion_document(conn, stream, seq, args.size))
    except proofs.NotProvable as exc:
        print(f"opgate audit prove: {exc}", file=sys.stderr)
        return 1


async def _consistency(
    conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings
) -> int:
    try:
        return _json(await proofs.consistency_document(conn, args.old, args.new))
    except proofs.NotProvable as exc:
        print(f"opgate audit consistency: {exc}", file=sys.stderr)
        return 1


def log_keys(args: argparse.Namespace, settings: Settings) -> list[note.Verifier] | None:
    """The log's keys to verify with: those given (``--log-key``), else the configured key's
    and the earlier ones (``audit_earlier_log_keys``); None when there is none. Raises
    ``note.NoteError`` for one that is not a vkey."""
    if args.log_key:
        return [note.Verifier.from_vkey(k) for k in args.log_key]
    signer = transparency_signer(Secrets(settings.secrets_dir))
    earlier = [note.Verifier.from_vkey(k) for k in settings.audit_earlier_log_keys]
    if signer is None and not earlier:
        return None
    return ([signer.verifier()] if signer else []) + earlier


async def _verify_tree(
    conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings
) -> int:
    try:
        keys = log_keys(args, settings)
    except note.NoteError as exc:
        print(f"opgate audit verify-tree: the log's key: {exc}", file=sys.stderr)
        return 2
    if keys is None:
        print("opgate audit: give --log-key or configure transparency_key", file=sys.stderr)
        return 2
    secret = Secrets(settings.secrets_dir).secret("audit_key")
    pruned, _ = await retention.in_force(conn, secret.encode("utf-8") if secret else None)
    report = await check_tree(conn, keys, [w.vkey for w in settings.audit_witnesses], pruned)
    summary = tree_summary(report)
    if report.breaks:
        print(f"BROKEN: {len(report.breaks)} problems; {summary}")
        for line in report.breaks[:50]:
            print(f"  {line}")
        return 1
    print(f"ok: {summary}")
    return 0


async def _bundle(conn: asyncpg.Connection, args: argparse.Namespace, settings: Settings) -> int:
    if args.log_key is not None:
        log = note.Verifier.from_vkey(args.log_key)
    else:
        signer = transparency_signer(Secrets(settings.secrets_dir))
        if signer is None:
            print("opgate audit: give --log-key or configure transparency_key", file=sys.stderr)
            return 2
        log = signer.verifier()
    witnesses = [w.vkey for w in settings.audit_witnesses]
    if (args.since is None) != (args.until is None) or (args.operation is None and not args.since):
        print(
            "opgate audit bundle: give --operation, --since and --until, or all three",
            file=sys.stderr,
        )
        return 2
    window = (args.since, args.until) if args.since else None
    try:
        made = await bundle.build(
            conn,
            args.operation,
            log,
            witnesses,
            settings.audit_witness_quorum,
            window,
            earlier_logs=settings.audit_earlier_log_keys,
        )
    except bundle.BundleError as exc:
        print(f"opgate audit bundle: {exc}", file=sys.stderr)
        return 1
    text = bundle.dumps(made)
    if args.output:
        args.output.write_text(text, "utf-8")
    else:
        sys.stdout.write(text)
    print(
        f"{len(made['records'])} records, {len(made['referenced'])} referenced, the ends of"
        f" {len(made['ends'])} operation streams; checkpoint of"
        f" {made['checkpoint'].splitlines()[1]} records",
        file=sys.stderr,
    )
    return 0


def _verify_bundle(args: argparse.Namespace) -> int:
    refused = f"opgate audit verify-bundle: {evidence.printable(args.file)}"
    try:
        loaded = json.loads(args.file.read_bytes())
    except OSError as exc:
        print(f"{refused}: cannot read it ({exc.strerror})", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"{refused}: not a bundle (JSON nested too deeply)", file=sys.stderr)
        return 2
    except ValueError as exc:  # not JSON, not UTF-8, a number too long to read
        print(f"{refused}: not a bundle (not JSON: {type(exc).__name__})", file=sys.stderr)
        return 2
    try:
        report = bundle.verify(loaded, args.log_key, args.witness_key, args.quorum)
    except bundle.BundleError as exc:  # a part required, missing or malformed: said which
        print(f"{refused}: {exc}", file=sys.stderr)
        return 2
    for line in bundle_report_lines(report):
        print(line)
    return 1 if report.breaks else 0


def _witness(args: argparse.Namespace) -> int:
    signer = note.Signer.from_skey(args.key.read_text("utf-8").strip())
    if signer.sig_type != note.COSIGNATURE_V1:
        print(
            "opgate audit witness: the key is not a cosigner key (new-key --cosigner)",
            file=sys.stderr,
        )
        return 2
    logs = [note.Verifier.from_vkey(k) for k in args.log]
    app = witness_app(signer, logs, WitnessState(args.state))
    host, _, port = args.listen.rpartition(":")

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host.strip("[]"), int(port))
        await site.start()
        bound = runner.addresses[0]
        print(f"witness {signer.name} listening on http://{host}:{bound[1]}", flush=True)
        print(signer.verifier().vkey(), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())
    return 0


def _new_key(args: argparse.Namespace) -> int:
    kind = note.COSIGNATURE_V1 if args.cosigner else note.ED25519
    try:
        signer = note.Signer.generate(args.name, kind)
    except note.NoteError as exc:
        print(f"opgate audit new-key: {exc}", file=sys.stderr)
        return 2
    try:
        descriptor = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        print(f"opgate audit new-key: {args.output} exists (never overwritten)", file=sys.stderr)
        return 2
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(signer.skey() + "\n")
    print(signer.verifier().vkey())
    return 0
