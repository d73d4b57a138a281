"""``opgate audit`` as real processes, for the transparency log's tests: a command run against
the test database, and ``verify-bundle`` run as a reviewer would, with no database and no
OPGATE_* setting in its environment."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from proxy.cli import main
from proxy.transparency import note
from tests.support.paths import REPO
from tests.support.transparency import (
    LOG_SIGNER,
    ORIGIN,
    WITNESS_SIGNER,
    audit_path,
    leaf,
    mth,
)


def audit_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m proxy audit ARGS`` with this environment (plus ``env``)."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "audit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=120,
        check=False,
    )


def offline_env() -> dict[str, str]:
    """The environment of a reviewer's machine: no OPGATE_* setting, no PostgreSQL variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPGATE_", "PG"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def verify_offline(path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``opgate audit verify-bundle PATH ARGS`` in ``cwd``, offline."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "audit", "verify-bundle", str(path), *args],
        capture_output=True,
        text=True,
        env=offline_env(),
        cwd=cwd,
        timeout=120,
        check=False,
    )


async def audit_in_process(*args: str) -> tuple[int, str, str]:
    """``opgate audit ARGS`` in this process (its own thread and event loop), as the CLI parses
    and runs it: exit code, stdout, stderr. A second faster than a process, where the test is
    about what the command finds rather than how it starts."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(["audit", *args])

    code = await asyncio.to_thread(run)
    return code, out.getvalue(), err.getvalue()


# --- minting valid bundles without a database -------------------------------------------------
# What ``opgate audit bundle`` would make for one operation, written from the formats in
# docs/audit.md (the record hash, the tree, the stream heads' map) rather than with the code
# that checks them (proxy/observe/auditlog/bundle.py), so that one bug cannot hide in both.
MINTED_OPERATION = "op_minted"
MINTED_INSTANCE = "requests/gw-1"
MINTED_ANSWER = b'{"id": "re_1", "amount": 500}'
MINTED_EVENTS = (
    (
        "created",
        {
            "approved_by": "alice",
            "action": "refund.create",
            "provider": "fault",
            "amount": 500,
            "currency": "usd",
            "approval_ref": "ref-1",
        },
    ),
    ("claimed", {"attempt": 1}),
    ("unknown", {"attempt": 1, "outcome": "unknown:timeout"}),
    ("claimed", {"attempt": 2}),
    ("confirmed", {"provider_status": 200, "object_id": "re_1"}),
)
_T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _field(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    data = value.encode("utf-8")
    return len(data).to_bytes(4, "big", signed=True) + data


def minted_hash(
    prev: bytes,
    stream: str,
    seq: int,
    at: datetime,
    kind: str,
    operation_id: str | None,
    record: str,
) -> bytes:
    """A record's chain hash, as docs/audit.md (*Tamper evidence*) defines it."""
    micros = (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    content = (
        b"opgate-audit-v1"
        + prev
        + b"".join(_field(v) for v in (stream, str(seq), str(micros), kind, operation_id, record))
    )
    return hashlib.sha256(content).digest()


def _heads_bucket(stream: str) -> int:
    return int.from_bytes(hashlib.sha256(stream.encode()).digest()[:2], "big") >> 4


def _heads_bucket_hash(entries: list[tuple[str, int, bytes]]) -> bytes:
    data = b"\x02opgate-heads/1"
    for stream, seq, digest in sorted(entries):
        name = stream.encode()
        data += len(name).to_bytes(4, "big") + name + seq.to_bytes(8, "big") + digest
    return hashlib.sha256(data).digest()


def _heads_tree(buckets: dict[int, bytes]) -> list[list[bytes]]:
    empty = _heads_bucket_hash([])
    level = [buckets.get(i, empty) for i in range(4096)]
    levels = [level]
    while len(level) > 1:
        level = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level), 2)
        ]
        levels.append(level)
    return levels


def mint_bundle(replays: int = 1, after_checkpoint: int = 0) -> dict[str, Any]:
    """A valid bundle of an operation sent twice (an unknown outcome, then a re-send), with the
    request record that settled it in its stream (migration 0022), ``replays`` replays in an
    instance's stream among other requests, and ``after_checkpoint`` records of the operation
    written after the checkpoint; cosigned by the test witness."""
    rows: list[dict[str, Any]] = []
    heads: dict[str, tuple[int, bytes]] = {}

    def add(stream: str, kind: str, operation_id: str | None, fields: dict[str, Any]) -> None:
        seq = heads.get(stream, (0, b""))[0] + 1
        prev = heads.get(stream, (0, bytes(32)))[1]
        at = _T0 + timedelta(seconds=len(rows))
        record = json.dumps(fields, sort_keys=True)
        digest = minted_hash(prev, stream, seq, at, kind, operation_id, record)
        rows.append(
            {
                "stream": stream,
                "seq": seq,
                "at": at.isoformat(),
                "kind": kind,
                "operation_id": operation_id,
                "record": record,
                "prev_hash": prev.hex(),
                "hash": digest.hex(),
            }
        )
        heads[stream] = (seq, digest)

    op = MINTED_OPERATION
    answer_sha = hashlib.sha256(MINTED_ANSWER).hexdigest()
    add("policy", "policy_load", None, {"event": "policy_loaded"})
    for event, detail in MINTED_EVENTS:
        add(
            op,
            "transition",
            op,
            {
                "event": event,
                "operation_id": op,
                "detail": detail,
                "status_after": "confirmed" if event == "confirmed" else "x",
            },
        )
        add(MINTED_INSTANCE, "request", None, {"decision": "deny", "reason": "no_route"})
    add(
        op,
        "request",
        op,
        {
            "decision": "allow",
            "operation_id": op,
            "status_after": "confirmed",
            "provider_answer_sha256": answer_sha,
        },
    )
    for _ in range(replays):
        add(
            MINTED_INSTANCE,
            "request",
            op,
            {
                "decision": "replay",
                "operation_id": op,
                "status_after": "confirmed",
                "provider_answer_sha256": answer_sha,
            },
        )
    size = len(rows)
    signed_heads = {s: h for s, h in heads.items()}
    for n in range(after_checkpoint):
        add(op, "transition", op, {"event": "revoked", "operation_id": op, "n": n})
    leaves = [leaf(bytes.fromhex(r["hash"])) for r in rows[:size]]
    buckets: dict[int, list[tuple[str, int, bytes]]] = {}
    for stream, (seq, digest) in signed_heads.items():
        buckets.setdefault(_heads_bucket(stream), []).append((stream, seq, digest))
    levels = _heads_tree({b: _heads_bucket_hash(e) for b, e in buckets.items()})
    root64 = base64.b64encode(mth(leaves)).decode()
    heads64 = base64.b64encode(levels[-1][0]).decode()
    text = f"{ORIGIN}\n{size}\n{root64}\nopgate-heads/1 {heads64}\n"
    cosignature = WITNESS_SIGNER.sign(text, timestamp=1_790_000_000).line()
    checkpoint = note.sign_note(text, [LOG_SIGNER]) + cosignature
    bucket = _heads_bucket(op)

    def entry(index: int) -> dict[str, Any]:
        proven = index < size
        return {
            **rows[index],
            "leaf_index": index if proven else None,
            "inclusion": [base64.b64encode(p).decode() for p in audit_path(index, leaves)]
            if proven
            else None,
        }

    return {
        "format": "opgate-audit-bundle/2",
        "operation_id": op,
        "since": None,
        "until": None,
        "log": LOG_SIGNER.verifier().vkey(),
        "earlier_logs": [],
        "witnesses": [],
        "quorum": 0,
        "checkpoint": checkpoint,
        "records": [entry(i) for i, r in enumerate(rows) if r["stream"] == op],
        "referenced": [
            entry(i) for i, r in enumerate(rows) if r["stream"] != op and r["operation_id"] == op
        ],
        "missing": [],
        "ends": {
            op: {
                "heads": [[s, q, d.hex()] for s, q, d in sorted(buckets[bucket])],
                "path": [
                    base64.b64encode(levels[d][(bucket >> d) ^ 1]).decode() for d in range(12)
                ],
            }
        },
        "answers": {
            op: {
                "status": "confirmed",
                "settled_reason": None,
                "provider_status": 200,
                "object_id": "re_1",
                "content_type": "application/json",
                "body": base64.b64encode(MINTED_ANSWER).decode(),
            }
        },
    }
