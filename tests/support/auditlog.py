"""The PostgreSQL audit log in tests: its key and CLI, the stored records read back, verified."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

import asyncpg
from yarl import URL

from proxy.observe.auditlog.verify import verify
from proxy.observe.auditlog.writer import RequestRecordWriter
from tests.support.opgate import Opgate

AUDIT_KEY = "test-audit-key-0123456789abcdef"


async def run_cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """``python -m proxy ARGS`` as a real process; its exit code and stdout."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args, env=env, stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, stdout.decode()


BEGINNING, END = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)


FLUSH_DEADLINE = 10.0


async def flushed(gate: Opgate) -> RequestRecordWriter:
    """The gate's writer once everything submitted so far is stored (bounded wait)."""
    observability = gate.running.gateway.observability
    assert observability is not None
    assert observability.writer is not None
    await asyncio.wait_for(observability.writer.flush(), FLUSH_DEADLINE)
    return observability.writer


async def stored_requests(database_url: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT record::text FROM audit_log WHERE kind = 'request' ORDER BY seq"
        )
    finally:
        await conn.close()
    return [json.loads(r[0]) for r in rows]


async def verified_ok(database_url: str) -> bool:
    conn = await asyncpg.connect(database_url)
    try:
        report = await verify(conn, BEGINNING, END, key=None, whole_log=True)
    finally:
        await conn.close()
    assert report.ok, [b.describe() for b in report.breaks]
    return report.ok


async def get(gate: Opgate, raw_path: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = URL(f"{gate.agent_url}{raw_path}", encoded=True)
    async with gate.http.get(url, headers=headers) as response:
        await response.read()
        return response.status
