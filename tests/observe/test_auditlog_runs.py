"""Each run of the request-record writer leaves a trace (audit_instance_runs, migration 0012)
against a real PostgreSQL: how far it numbered and stored, and its clean stop; verify names a
run that ended without one, and tells a running one apart."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg

from proxy.observe.auditlog.verify import unaccounted_runs
from proxy.observe.auditlog.writer import RequestRecordWriter
from proxy.store.store import Store

FLUSH_DEADLINE = 10.0


async def _run_row(database_url: str, run_id: str) -> dict[str, Any] | None:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow("SELECT * FROM audit_instance_runs WHERE run_id = $1", run_id)
    finally:
        await conn.close()
    return dict(row) if row is not None else None


async def _unaccounted(database_url: str) -> tuple[list[str], list[str]]:
    conn = await asyncpg.connect(database_url)
    try:
        return await unaccounted_runs(conn)
    finally:
        await conn.close()


def _numbered(writer: RequestRecordWriter, count: int) -> None:
    for i in range(count):
        fields: dict[str, Any] = {"request_id": f"r{i}", "decision": "allow", "agent_id": "a"}
        writer.admit(fields)
        writer.submit(fields)


async def _crash(writer: RequestRecordWriter) -> None:
    """What a SIGKILL leaves: the writer's tasks gone, no close, nothing more written."""
    for task in (writer._task, writer._beating):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_clean_stop_leaves_nothing_unaccounted(database_url: str) -> None:
    """A run's trace follows each stored batch; closed, the run is stopped and verify names
    nothing."""
    store = await Store.open(database_url, min_size=1, max_size=2)
    writer = RequestRecordWriter(store, "requests/clean", heartbeat_seconds=60)
    writer.start()
    try:
        _numbered(writer, 3)
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)
        row = await _run_row(database_url, writer.run_id)
        assert row is not None
        assert (row["instance_id"], row["numbered_seq"], row["stored_seq"]) == ("clean", 3, 3)
        assert row["stopped_at"] is None
    finally:
        await writer.close()
        await store.close()
    row = await _run_row(database_url, writer.run_id)
    assert row is not None
    assert row["stopped_at"] is not None
    assert await _unaccounted(database_url) == ([], [])


async def test_a_run_that_stops_tracing_is_named_with_what_it_numbered(
    database_url: str,
) -> None:
    """Records numbered and still queued are counted by the heartbeat; while its traces keep
    coming the run is running, once they stop it ended without a clean stop."""
    store = await Store.open(database_url, min_size=1, max_size=2)
    writer = RequestRecordWriter(
        store, "requests/crashing", heartbeat_seconds=0.1, linger_seconds=FLUSH_DEADLINE * 3
    )
    writer.start()
    try:
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)  # the started record
        _numbered(writer, 2)  # lingering: fewer than a batch, records keep coming

        async def traced() -> bool:
            row = await _run_row(database_url, writer.run_id)
            return row is not None and row["numbered_seq"] == 2

        async with asyncio.timeout(FLUSH_DEADLINE):
            while not await traced():  # noqa: ASYNC110 (a database read: no event to await)
                await asyncio.sleep(0.02)
        unaccounted, running = await _unaccounted(database_url)
        assert unaccounted == []
        assert [line.split(" (")[0] for line in running] == ["instance crashing is running"]
        await _crash(writer)
        async with asyncio.timeout(FLUSH_DEADLINE):  # three heartbeats of silence
            while not (await _unaccounted(database_url))[0]:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        [line] = (await _unaccounted(database_url))[0]
        assert line.startswith(
            "instance crashing ended without a clean stop; at least 2 records after seq 0 are"
            " unaccounted for: 2 numbered by its last trace at "
        )
    finally:
        await store.close()
