"""PostgreSQL's own CPU per approved operation, measured alone (bench/README.md).

One client, prepared statements, autocommit, on a scratch database migrated up to ``--upto``
(so one sitting can compare two schemas: the migrations before and after a change). For each
of ``--operations`` fresh operations: create (not counted), then load, claim and settle, the
statements of an approved operation's first send (with ``--request-record``, the settle carries
the request's record as opgate's does: migration 0022); then ``--records`` request records
appended in batches of ``--batch``, as the audit writer does. Reports the backend's CPU from
/proc (user + system, so the WAL flush of each commit counts) per operation and per record.

    python bench/pg_transitions.py --dsn postgresql://postgres@127.0.0.1:5432/postgres --upto 9
    python bench/pg_transitions.py --dsn postgresql://postgres@127.0.0.1:5432/postgres --upto 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from proxy.observe.auditlog import records
from proxy.store import queries
from proxy.store.migrate import load_migrations
from proxy.store.queries import QUERIES

_TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


async def scratch(dsn: str, upto: int, extra_sql: list[str]) -> tuple[str, str]:
    name = f"opgate_pgbench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    target = dsn.rsplit("/", 1)[0] + "/" + name
    conn = await asyncpg.connect(target)
    try:
        for migration in load_migrations():
            if migration.number <= upto:
                await conn.execute(migration.sql)
        await queries.execute(
            conn, "audit_set_instance_policy", instance_id="bench", policy_version="sha256:bench"
        )
        for sql in extra_sql:
            await conn.execute(sql)
    finally:
        await conn.close()
    return name, target


async def measure(
    target: str,
    operations: int,
    record_count: int,
    batch: int,
    settings: dict[str, str],
    untriggered: bool,
    request_record: bool,
    against: str | None = None,
    blocks: int = 1,
) -> dict[str, float]:
    conn = await asyncpg.connect(
        target, server_settings={"opgate.instance_id": "bench", **settings}
    )
    try:
        if untriggered:  # for the analysis only: what the transition records cost
            # (the event named in audit_event is then left on the row: its check goes too)
            await conn.execute(
                "ALTER TABLE operations DISABLE TRIGGER operations_audit,"
                " DROP CONSTRAINT operations_audit_event_consumed"
            )
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        expires = datetime.now(UTC) + timedelta(hours=1)
        ids = [f"op_{secrets.token_hex(8)}" for _ in range(operations)]
        create = await conn.prepare(QUERIES["create_operation"].sql)
        for i, operation_id in enumerate(ids):
            await create.fetchrow(
                *QUERIES["create_operation"].arguments(
                    {
                        "operation_id": operation_id,
                        "tenant": "t",
                        "agent_id": "agent",
                        "provider": "stripe",
                        "action": "charge",
                        "method": "POST",
                        "path": "/v1/charges",
                        "path_params": "{}",
                        "amount": 100,
                        "currency": "usd",
                        "params": '{"amount": 100}',
                        "idempotency_key": f"key-{operation_id}",
                        "approval_ref": f"ref-{i}",
                        "approved_by": "human",
                        "expires_at": expires,
                        "actor": "bench",
                        "supersedes": None,
                    }
                )
            )
        load = await conn.prepare(QUERIES["load_operation"].sql)
        claim = await conn.prepare(QUERIES["claim_operation"].sql)
        settle = await conn.prepare(QUERIES["settle_operation"].sql)

        async def send(operation_id: str, spent: dict[str, float]) -> None:
            at = backend_cpu(pid)
            await load.fetchrow(operation_id)
            after_load = backend_cpu(pid)
            claimed = await claim.fetchrow(
                *QUERIES["claim_operation"].arguments(
                    {
                        "operation_id": operation_id,
                        "owner": "bench",
                        "lease_seconds": 30.0,
                        "expected_attempts": 0,
                        "actor": None,
                        "dedup_window_seconds": 86400.0,
                        "after_lookup_by": None,
                        "unchanged_since": None,
                    }
                )
            )
            assert claimed is not None
            after_claim = backend_cpu(pid)
            settled = await settle.fetchrow(
                *QUERIES["settle_operation"].arguments(
                    {
                        "operation_id": operation_id,
                        "status": "confirmed",
                        "provider_status": 200,
                        "object_id": "ch_1",
                        "content_type": "application/json",
                        "body": b"{}",
                        "actor": "bench",
                        "request": _request_record(operation_id) if request_record else None,
                    }
                )
            )
            assert settled is not None
            spent["load"] += after_load - at
            spent["claim"] += after_claim - after_load
            spent["settle"] += backend_cpu(pid) - after_claim

        spent = {"load": 0.0, "claim": 0.0, "settle": 0.0}
        if against is None:
            for operation_id in ids:
                await send(operation_id, spent)
        else:
            # the same statements, blocks alternating between the trigger function the
            # migrations installed (B) and ``against`` (A), A B B A..., on one connection
            installed = await conn.fetchval(
                "SELECT tgfoid::regproc::text FROM pg_trigger WHERE tgname = 'operations_audit'"
            )
            sides = {"A": against, "B": installed}
            per_side = {side: {"load": 0.0, "claim": 0.0, "settle": 0.0} for side in sides}
            ratios = []
            size = operations // blocks
            for block in range(blocks):
                side = "AB"[(block + block // 2) % 2]  # A B B A A B B A...
                await conn.execute(
                    "CREATE OR REPLACE TRIGGER operations_audit BEFORE INSERT OR UPDATE ON"
                    " operations FOR EACH ROW WHEN (NEW.audit_event IS NOT NULL)"
                    f" EXECUTE FUNCTION {sides[side]}()"
                )
                block_spent = {"load": 0.0, "claim": 0.0, "settle": 0.0}
                for operation_id in ids[block * size : (block + 1) * size]:
                    await send(operation_id, block_spent)
                for name, value in block_spent.items():
                    per_side[side][name] += value
                ratios.append((side, sum(block_spent.values())))
            # each pair of blocks (A B, then B A) is one A/B: a drift falls on both alike
            pairs = [
                dict(pair)["B"] / dict(pair)["A"]
                for pair in zip(ratios[0::2], ratios[1::2], strict=True)
            ]
            half = size * blocks / 2
            return {
                **{
                    f"{side}_{name}_us": value / half * 1e6
                    for side in sides
                    for name, value in per_side[side].items()
                },
                "A_per_operation_us": sum(per_side["A"].values()) / half * 1e6,
                "B_per_operation_us": sum(per_side["B"].values()) / half * 1e6,
                "B/A": sum(per_side["B"].values()) / sum(per_side["A"].values()),
                "B/A per pair, median": statistics.median(pairs),
                "B/A per pair, min": min(pairs),
                "B/A per pair, max": max(pairs),
            }
        per_operation = sum(spent.values()) / operations
        record = {
            "schema_version": 1,
            "record_type": "request",
            "decision": "allow",
            "operation_id": None,
            "path": "/v1/charges",
            "status": 200,
        }
        texts = [json.dumps({**record, "instance_seq": n + 1}) for n in range(record_count)]
        before = backend_cpu(pid)
        for start in range(0, record_count, batch):
            await records.append_texts(
                conn, "requests/bench", "request", texts[start : start + batch]
            )
        per_record = (backend_cpu(pid) - before) / record_count
        return {
            "per_operation_us": per_operation * 1e6,
            **{f"{name}_us": value / operations * 1e6 for name, value in spent.items()},
            "per_record_us": per_record * 1e6,
        }
    finally:
        await conn.close()


def _request_record(operation_id: str) -> str:
    """An approved operation's request record, of opgate's shape and size (docs/audit.md)."""
    return json.dumps(
        {
            "schema_version": 1,
            "event": "request",
            "request_id": secrets.token_hex(8),
            "time": datetime.now(UTC).isoformat(),
            "listener": "agent",
            "source": "127.0.0.1",
            "method": "POST",
            "path": "/bench/v1/charges",
            "path_sha256": None,
            "query_sha256": None,
            "agent_id": "agent",
            "tenant": "t",
            "operation_id": operation_id,
            "provider": "stripe",
            "action": "charge",
            "rule": "charge",
            "decision": "allow",
            "reason": None,
            "response_status": 200,
            "provider_status": 200,
            "attempt": 1,
            "body_sha256": secrets.token_hex(32),
            "policy_version": "sha256:" + "0" * 64,
            "instance_id": "bench",
            "instance_seq": None,
            "latency_ms": 12.5,
            "upstream_ms": 10.1,
        }
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--upto", type=int, required=True, help="last migration applied")
    parser.add_argument("--operations", type=int, default=3000)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--setting", action="append", default=[], help="NAME=VALUE, a server setting (analysis)"
    )
    parser.add_argument(
        "--request-record", action="store_true", help="the settle carries the request's record"
    )
    parser.add_argument(
        "--against",
        metavar="FUNCTION",
        help="A/B in one sitting: blocks of operations alternate between the installed"
        " transition trigger function (B) and this one (A), e.g. opgate_audit_operation",
    )
    parser.add_argument("--blocks", type=int, default=16, help="with --against: A B B A...")
    parser.add_argument("--sql", action="append", default=[], help="run after the migrations")
    parser.add_argument(
        "--no-transition-records", action="store_true", help="analysis: the trigger disabled"
    )
    args = parser.parse_args()
    name, target = await scratch(args.dsn, args.upto, args.sql)
    try:
        settings = dict(item.split("=", 1) for item in args.setting)
        result = await measure(
            target,
            args.operations,
            args.records,
            args.batch,
            settings,
            args.no_transition_records,
            args.request_record,
            args.against,
            args.blocks,
        )
    finally:
        admin = await asyncpg.connect(args.dsn)
        try:
            await admin.execute(f'DROP DATABASE "{name}"')
        finally:
            await admin.close()
    print(json.dumps({"upto": args.upto, **{k: round(v, 3) for k, v in result.items()}}))


if __name__ == "__main__":
    asyncio.run(main())
