"""``opgate audit`` for the transparency log (docs/audit.md, *Transparency log*):

    opgate audit checkpoint                      the latest signed checkpoint, with cosignatures
    opgate audit prove STREAM:SEQ [--size N]     a record's inclusion proof (JSON)
    opgate audit consistency OLD NEW             a consistency proof between two tree sizes
    opgate audit verify-tree [--log-key K ...]   the stored records against the signed tree
    opgate audit bundle --operation OP [-o F]    offline evidence for one operation
    opgate audit bundle --since T --until T      ... for what was written in a window
    opgate audit verify-bundle F [--log-key K ...]   check a bundle: no database, no settings
    opgate audit witness --key F --log K ...     a minimal C2SP tlog-witness (its own process)
    opgate audit new-key NAME [--cosigner] -o F  an Ed25519 key: the log's, or a witness's

The commands that read the database run as the other ``opgate audit`` commands do (cli.py);
``verify-bundle``, ``witness`` and ``new-key`` read neither the database nor any setting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import web

from proxy.observe.auditlog import bundle, evidence, proofs, retention
from proxy.observe.auditlog.treecheck import TreeReport, check_tree
from proxy.observe.auditlog.witness_server import WitnessState, witness_app
from proxy.observe.observer import transparency_signer
from proxy.settings import Secrets, Settings
from proxy.transparency import note

Runner = Callable[[Any], Callable[[argparse.Namespace], int]]


def add_transparency_commands(
    commands: Any,
    run: Runner,
    flags: Callable[[argparse.ArgumentParser], None],
    time: Callable[[str], datetime],
) -> None:
    _time = time
    latest = commands.add_parser("checkpoint", help="the latest signed checkpoint")
    flags(latest)
    latest.set_defaults(handler=run(_checkpoint))

    prove = commands.add_parser("prove", help="one record's inclusion proof")
    flags(prove)
    prove.add_argument("record", help="STREAM:SEQ (e.g. op_4f2a...:3, requests/host:1:812)")
    prove.add_argument("--size", type=int, help="in the checkpoint of this size (default: latest)")
    prove.set_defaults(handler=run(_prove))

    consistency = commands.add_parser("consistency", help="a consistency proof OLD -> NEW")
    flags(consistency)
    consistency.add_argument("old", type=int)
    consistency.add_argument("new", type=int)
    consistency.set_defaults(handler=run(_consistency))

    tree = commands.add_parser("verify-tree", help="the stored records against the signed tree")
    flags(tree)
    add_log_keys(tree)
    tree.set_defaults(handler=run(_verify_tree))

    make = commands.add_parser("bundle", help="offline evidence for one operation")
    flags(make)
    make.add_argument("--operation", metavar="OP", help="its records (default: all, in a window)")
    make.add_argument("--since", type=_time, help="records written at or after (with --until)")
    make.add_argument("--until", type=_time, help="records written before")
    make.add_argument("--log-key", help="the log's vkey (default: from transparency_key)")
    make.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    make.set_defaults(handler=run(_bundle))

    check = commands.add_parser("verify-bundle", help="check a bundle, offline")
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

    witness = commands.add_parser("witness", help="run a minimal C2SP tlog-witness")
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

    key = commands.add_parser("new-key", help="make an Ed25519 key (the log's or a witness's)")
    key.add_argument("name", help="its name: the log's origin, or the witness's name")
    key.add_argument("--cosigner", action="store_true", help="a witness's cosigning key")
    key.add_argument("-o", "--output", type=Path, required=True, help="secret file (0600)")
    key.set_defaults(handler=_new_key)


def add_log_keys(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-key",
        action="append",
        default=[],
        help="a vkey of the log (repeatable; default: transparency_key's, and"
        " audit_earlier_log_keys)",
    )


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
    _print_bundle_report(report)
    return 1 if report.breaks else 0


def _print_bundle_report(report: bundle.BundleReport) -> None:
    """What the bundle proves, each line as the reviewer's terminal may show it (any value a
    record holds is escaped where a terminal would act on it, or it would reorder the line)."""

    def say(line: str) -> None:
        print(evidence.printable(line))

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
        return
    say(f"ok: {summary}")


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
