"""The request-record writer (proxy/observe/auditlog/writer.py) against real PostgreSQL and a
real opgate: no record can stall it, a bad record is isolated into a placeholder, and a writer
that cannot write is visible (metric, log line, readiness)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import string
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs
from yarl import URL

from proxy.observe.auditlog.records import MANY_RECORDS
from proxy.observe.auditlog.writer import RequestRecordWriter
from proxy.store.store import Store
from tests.support.auditlog import FLUSH_DEADLINE, flushed, get, stored_requests, verified_ok
from tests.support.fault_provider import FaultProvider
from tests.support.forward import LOOPBACK_ALLOWED
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, fault_policy
from tests.support.polling import until


@pytest.mark.parametrize(
    ("scenario", "raw_path"),
    [
        ("NUL", "/x%00"),
        ("NUL in a routed path", "/fault/v1/%00"),
    ],
)
async def test_an_unstorable_path_does_not_stall_the_writer(
    fault_gate: Opgate, database_url: str, scenario: str, raw_path: str
) -> None:
    """An unauthenticated request whose decoded path PostgreSQL cannot store is recorded with
    its raw, percent-encoded path; the normal request after it is stored and verify is ok."""
    assert await get(fault_gate, raw_path) in (400, 401, 404)
    with capture_logs() as logs:
        assert await get(fault_gate, "/fault/v1/charges/ch_1", token=AGENT_TOKEN) == 200
    [later] = [e for e in logs if e["event"] == "request"]
    await flushed(fault_gate)
    stored = await stored_requests(database_url)
    assert [r["path"] for r in stored if r.get("request_id")] == [
        raw_path,
        "/fault/v1/charges/ch_1",
    ]
    assert stored[-1]["request_id"] == later["request_id"]
    assert await verified_ok(database_url)


async def _raw_request(url: str, request_line: str, headers: dict[str, str]) -> int:
    """One request written byte for byte (clients normalise absolute-form targets)."""
    parsed = URL(url)
    assert parsed.host is not None
    assert parsed.port is not None
    reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
    try:
        head = [request_line, *(f"{k}: {v}" for k, v in headers.items()), "Connection: close"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("ascii"))
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), FLUSH_DEADLINE)
        await reader.read()
        return int(status_line.split()[1])
    finally:
        writer.close()


async def test_forward_listener_records_are_storable(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Forward mode: an unauthenticated absolute-form request with %00 in its path (refused by
    the listener) and an authenticated one (decided by the pipeline) are stored with their
    raw paths, and so is the request after them."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False) + LOOPBACK_ALLOWED)
    async with start_opgate(
        forward_listen="127.0.0.1:0",
        ca_dir=tmp_path / "ca",
        upstream_overrides={"fault": fault_provider.url},
    ) as gate:
        assert gate.running.forward_url is not None
        origin = fault_provider.url
        authority = URL(origin).raw_authority
        credentials = base64.b64encode(f"agent:{AGENT_TOKEN}".encode()).decode()
        proxy_auth = {"Host": authority, "Proxy-Authorization": f"Basic {credentials}"}
        sent = [
            (f"GET {origin}/x%00?q=1 HTTP/1.1", {"Host": authority}, 407),
            (f"GET {origin}/v1/%00 HTTP/1.1", proxy_auth, 400),
            (f"GET {origin}/v1/charges/ch_1 HTTP/1.1", proxy_auth, 200),
        ]
        for line, headers, status in sent:
            assert await _raw_request(gate.running.forward_url, line, headers) == status
        await flushed(gate)
    stored = await stored_requests(database_url)
    assert [(r["listener"], r["path"], r["reason"]) for r in stored if r.get("request_id")] == [
        ("forward", "/x%00", "proxy_auth_required"),
        ("forward", "/v1/%00", "path_not_canonical"),
        ("forward", "/v1/charges/ch_1", None),
    ]
    assert await verified_ok(database_url)


async def test_nul_and_lone_surrogates_anywhere_in_a_record_are_stored(
    database_url: str,
) -> None:
    """Strings PostgreSQL refuses (NUL: jsonb and text; lone surrogates: not UTF-8), in any
    value or key, nested or not, are made storable in one place; the record after is stored."""
    store = await Store.open(database_url, min_size=1, max_size=2)
    writer = RequestRecordWriter(store, "requests/strings-test")
    writer.start()
    try:
        writer.submit(
            {
                "request_id": "odd",
                "path": "/a\x00b",
                "destination": "h\udced.test",
                "detail": {"k\x00": ["\ud800", "ok"]},
            }
        )
        writer.submit({"request_id": "after", "path": "/fine"})
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)
    finally:
        await writer.close()
        await store.close()
    stored = {r.get("request_id"): r for r in await stored_requests(database_url)}
    assert stored["odd"]["path"] == "/a\ufffdb"
    assert stored["odd"]["destination"] == "h\ufffd.test"
    assert stored["odd"]["detail"] == {"k\ufffd": ["\ufffd", "ok"]}
    assert stored["after"]["path"] == "/fine"
    assert await verified_ok(database_url)


async def test_a_few_records_wait_for_others_and_a_flush_does_not(database_url: str) -> None:
    """While records keep coming (one was just stored), a record queued alone waits for others
    to join it: with more queued after a database round trip, all are stored by one statement
    (one transaction's time); a flush does not wait out the linger, with or without company."""
    stream = "requests/linger-test"
    store = await Store.open(database_url, min_size=1, max_size=2)
    writer = RequestRecordWriter(store, stream, linger_seconds=FLUSH_DEADLINE * 3)
    writer.start()
    conn = await asyncpg.connect(database_url)
    try:
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)  # the started record
        writer.submit({"request_id": "first"})
        await conn.fetchval("SELECT 1")  # the writer has had its turns meanwhile
        for i in range(MANY_RECORDS - 1):
            writer.submit({"request_id": f"r{i}"})
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)
        rows = await conn.fetch(
            "SELECT DISTINCT at FROM audit_log WHERE stream = $1 AND seq > 1", stream
        )
        assert len(rows) == 1
        writer.submit({"request_id": "alone"})
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)
        count = await conn.fetchval("SELECT count(*) FROM audit_log WHERE stream = $1", stream)
        assert count == 1 + MANY_RECORDS + 1
    finally:
        await conn.close()
        await writer.close()
        await store.close()
    assert await verified_ok(database_url)


async def test_a_lingering_writer_is_woken_by_a_full_batch_not_by_each_record(
    database_url: str,
) -> None:
    """While the writer lingers for a batch, a record that leaves it short of one does not wake
    it: each request's record would otherwise cost a turn of the writer task that finds it must
    go on waiting. The records still go in one statement, as soon as the batch is full."""
    stream = "requests/wakeup-test"
    store = await Store.open(database_url, min_size=1, max_size=2)
    writer = RequestRecordWriter(store, stream, linger_seconds=FLUSH_DEADLINE * 3)
    writer.start()
    conn = await asyncpg.connect(database_url)
    try:
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)  # the started record
        writer.submit({"request_id": "first"})  # wakes the writer, which then lingers
        await until(lambda: writer._wake_at == MANY_RECORDS, "the writer lingers for a batch")
        for i in range(MANY_RECORDS - 2):
            writer.submit({"request_id": f"r{i}"})
        assert not writer._wakeup.is_set()  # one record short of a batch: still lingering
        writer.submit({"request_id": "full"})
        assert writer._wakeup.is_set()  # the record that made the batch full
        written_by = asyncio.get_running_loop().time() + FLUSH_DEADLINE
        while writer.written < 1 + MANY_RECORDS and asyncio.get_running_loop().time() < written_by:
            await conn.fetchval("SELECT 1")  # not a flush: it would end the linger itself
        assert writer.written == 1 + MANY_RECORDS
        rows = await conn.fetch(
            "SELECT DISTINCT at FROM audit_log WHERE stream = $1 AND seq > 1", stream
        )
        assert len(rows) == 1
    finally:
        await conn.close()
        await writer.close()
        await store.close()
    assert await verified_ok(database_url)


def _unindexable() -> str:
    """An operation id PostgreSQL refuses to index (a btree row is at most ~2.7 kB): it
    passes every check in Python and fails only in the database."""
    alphabet = string.ascii_letters + string.digits
    return "op_" + "".join(secrets.choice(alphabet) for _ in range(20_000))


async def test_a_poisoned_record_becomes_a_placeholder_and_the_rest_is_stored(
    database_url: str,
) -> None:
    """A batch with one record the database refuses stores every other record, in order, and
    in the refused one's place a placeholder with its SHA-256 and the error class."""
    store = await Store.open(database_url, min_size=1, max_size=2)
    writer = RequestRecordWriter(store, "requests/poison-test")
    try:
        poisoned = {"request_id": "bad", "decision": "deny", "operation_id": _unindexable()}
        batch = [{"request_id": f"r{i}", "decision": "deny"} for i in range(9)]
        batch.insert(4, poisoned)
        for record in batch:
            writer.submit(record)
        writer.start()
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)
    finally:
        await writer.close()
        await store.close()
    stored = [r for r in await stored_requests(database_url) if r.get("record_type") != "started"]
    assert [r.get("request_id") for r in stored] == [
        "r0",
        "r1",
        "r2",
        "r3",
        "bad",
        "r4",
        "r5",
        "r6",
        "r7",
        "r8",
    ]
    placeholder = stored[4]
    assert placeholder["record_type"] == "unstorable"
    assert placeholder["error"] == "ProgramLimitExceededError"
    canonical = json.dumps(poisoned, sort_keys=True, separators=(",", ":"), default=str)
    assert placeholder["record_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert writer.unstorable == 1
    assert await verified_ok(database_url)


async def _metric(gate: Opgate, name: str) -> float:
    async with gate.http.get(f"{gate.ops_url}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not exported")


async def _ready(gate: Opgate) -> tuple[int, dict[str, Any]]:
    async with gate.http.get(f"{gate.ops_url}/readyz") as response:
        return response.status, await response.json()


async def test_a_writer_that_cannot_write_is_visible_and_recovers(
    fault_gate: Opgate, database_url: str
) -> None:
    """While every request record is refused (not one record's fault), the writer holds them,
    says so in a log line, in opgate_audit_writer_stalled and oldest pending age, and the
    ops listener is not ready; once the database takes them again, all are stored."""
    observability = fault_gate.running.gateway.observability
    assert observability is not None
    assert observability.writer is not None
    writer = observability.writer
    writer.stall_seconds = 0.2
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "ALTER TABLE audit_log ADD CONSTRAINT refuse_requests CHECK (kind <> 'request')"
            " NOT VALID"
        )
        with capture_logs() as logs:
            for _ in range(3):
                assert await get(fault_gate, "/fault/v1/charges/ch_1", AGENT_TOKEN) == 200
            deadline = asyncio.get_running_loop().time() + FLUSH_DEADLINE
            while not any(e["event"] == "audit_writer_stalled" for e in logs):
                assert asyncio.get_running_loop().time() < deadline, "the writer never stalled"
                await asyncio.sleep(0.05)  # polling a condition, with a deadline
            status, body = await _ready(fault_gate)
        assert status == 503, body
        assert "audit" in body["detail"]
        assert await _metric(fault_gate, "opgate_audit_writer_stalled") == 1
        assert await _metric(fault_gate, "opgate_audit_oldest_pending_seconds") >= 0.2
        assert await _metric(fault_gate, "opgate_audit_write_failures_total") >= 1
        await conn.execute("ALTER TABLE audit_log DROP CONSTRAINT refuse_requests")
        await flushed(fault_gate)
    finally:
        await conn.close()
    assert not writer.stalled
    assert (await _ready(fault_gate))[0] == 200
    assert await _metric(fault_gate, "opgate_audit_writer_stalled") == 0
    stored = await stored_requests(database_url)
    assert [r["path"] for r in stored if r.get("request_id")] == ["/fault/v1/charges/ch_1"] * 3
    assert not [r for r in stored if r.get("record_type") == "unstorable"]
    assert writer.unstorable == 0
