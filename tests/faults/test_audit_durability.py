"""Nothing unaudited when opgate's log sink or its process fails (issue 27, section 3).

Real opgate processes (``python -m proxy serve``) on loopback, a real PostgreSQL, a real
provider; each test counts what reached the provider and what reached the audit log:

- stdout a pipe whose reader is gone (EPIPE), and stdout on ``/dev/full`` (ENOSPC): every
  forwarded request still has its stored record, readiness fails naming the sink, a metric
  counts the failures, and ``opgate audit verify`` is ok;
- an agent that never reads a 12 MB answer: the request's record is stored while the answer is
  still being written, so a SIGKILL then loses nothing; a write that takes too long is cut off,
  and that is on record too;
- a SIGKILL with records still queued: ``opgate audit verify`` names the instance that ended
  without a clean stop and how many records it cannot account for; a SIGTERM leaves nothing to
  report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import struct
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import aiohttp
import asyncpg
import pytest
import pytest_asyncio
from aiohttp import web

from tests.support.environment import inherited
from tests.support.fault_provider import FaultProvider
from tests.support.killable_opgate import KillableOpgate, free_port, spawn_opgate
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    REFUND_APPROVAL,
    fault_policy,
    process_env,
)
from tests.support.paths import REPO

REFUND = "/fault/v1/refunds"
BIG_ANSWER_BYTES = 12 * 1024 * 1024
# The request records stored in the audit log (not a stream's started/dropped/... records):
# in an instance's stream, or (a claimed operation's, migration 0022) in the operation's.
STORED_REQUESTS = (
    "SELECT record::text AS record FROM audit_log"
    " WHERE kind = 'request' AND NOT record ? 'record_type'"
)
STORED_OF_TYPE = (
    "SELECT record::text AS record FROM audit_log"
    " WHERE kind = 'request' AND stream LIKE 'requests/%' AND record ->> 'record_type' = $1"
)


# --- support ---------------------------------------------------------------------------------


async def _spawn(env: dict[str, str], stdout: int | IO[bytes], log_path: Path) -> KillableOpgate:
    """opgate with its stdout on ``stdout`` (stderr to ``log_path``), once it answers
    ``/healthz``: readiness may rightly fail here, with a broken log sink."""
    agent_port, ops_port = free_port(), free_port()
    full_env = inherited()
    full_env.update(env)
    full_env["OPGATE_AGENT_LISTEN"] = f"127.0.0.1:{agent_port}"
    full_env["OPGATE_OPS_LISTEN"] = f"127.0.0.1:{ops_port}"
    full_env.setdefault("OPGATE_FORWARD_LISTEN", "")
    full_env.setdefault("OPGATE_WORKERS", "1")
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", cwd=REPO, env=full_env, stdout=stdout,
            stderr=log,
        )  # fmt: skip
    gate = KillableOpgate(process, f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{ops_port}")
    healthy = False

    async def answers() -> None:
        nonlocal healthy
        async with aiohttp.ClientSession(trust_env=False) as http:
            while not healthy and process.returncode is None:
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with http.get(f"{gate.ops_url}/healthz") as response:
                        healthy = response.status == 200
                if not healthy:
                    await asyncio.sleep(0.05)  # polling a probe, bounded below

    try:
        await asyncio.wait_for(answers(), 30)
    except TimeoutError:
        healthy = False
    if not healthy:
        await gate.kill()
        log_text = await asyncio.to_thread(log_path.read_text)
        raise AssertionError(f"opgate exited or never answered: {log_text[-3000:]}")
    return gate


@contextlib.asynccontextmanager
async def _running(
    env: dict[str, str], stdout: int | IO[bytes], log_path: Path
) -> AsyncIterator[KillableOpgate]:
    gate = await _spawn(env, stdout, log_path)
    try:
        yield gate
    finally:
        await gate.kill()


async def _approve(http: aiohttp.ClientSession, ops_url: str, charge: str) -> dict[str, Any]:
    async with http.post(
        f"{ops_url}/v1/operations",
        json={**REFUND_APPROVAL, "params": {"charge": charge}, "approval_ref": charge},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        payload: dict[str, Any] = await response.json(content_type=None)
        assert response.status == 201, payload
        return payload


async def _send_refund(
    http: aiohttp.ClientSession, agent_url: str, op: dict[str, Any], charge: str
) -> int:
    async with http.post(
        agent_url + REFUND,
        data=f"amount=500&currency=usd&charge={charge}",
        headers={
            "Authorization": f"Bearer {AGENT_TOKEN}",
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Operation-Id": op["operation_id"],
        },
    ) as response:
        await response.read()
        return response.status


async def _send_read(http: aiohttp.ClientSession, agent_url: str) -> int:
    async with http.get(
        agent_url + REFUND + "?charge=ch_1", headers={"Authorization": f"Bearer {AGENT_TOKEN}"}
    ) as response:
        await response.read()
        return response.status


async def _fetch(database_url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(database_url)
    try:
        return [json.loads(row["record"]) for row in await conn.fetch(query, *args)]
    finally:
        await conn.close()


async def _verify(env: dict[str, str]) -> tuple[int, str]:
    """``opgate audit verify`` on the test's database: exit code and output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "audit", "verify", cwd=REPO,
        env={**inherited(), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def _metric(http: aiohttp.ClientSession, ops_url: str, series: str) -> float:
    async with http.get(f"{ops_url}/metrics") as response:
        text = await response.text()
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def _readiness(http: aiohttp.ClientSession, ops_url: str) -> tuple[int, str]:
    async with http.get(f"{ops_url}/readyz") as response:
        return response.status, await response.text()


@pytest.fixture
def fault_env(database_url: str, tmp_path: Path, fault_provider: FaultProvider) -> dict[str, str]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "fault.yaml").write_text(fault_policy(deduplicates=False))
    return process_env(database_url, policies, {"fault": fault_provider.url})


# --- 1. a failing log sink -------------------------------------------------------------------


async def _every_forwarded_request_is_stored(
    gate: KillableOpgate, database_url: str, fault_provider: FaultProvider
) -> None:
    """Two refunds and a read through a process whose log sink fails: each answered 200,
    each stored, one effect per refund, readiness and the metric naming the sink."""
    async with aiohttp.ClientSession(trust_env=False) as http:
        ops = [await _approve(http, gate.ops_url, f"ch_{i}") for i in (1, 2)]
        statuses = [await _send_refund(http, gate.agent_url, op, f"ch_{i}") for i, op in
                    zip((1, 2), ops, strict=True)]  # fmt: skip
        statuses.append(await _send_read(http, gate.agent_url))
        assert statuses == [200, 200, 200]
        assert gate.process.returncode is None, "opgate died of its log sink"
        sent = len(fault_provider.requests)
        assert sent == 3

        async def forwarded() -> list[dict[str, Any]]:
            stored = await _fetch(database_url, STORED_REQUESTS)
            return [r for r in stored if r.get("decision") == "allow"]

        records: list[dict[str, Any]] = []

        async def all_stored() -> bool:
            records[:] = await forwarded()
            return len(records) >= sent

        await _until_async(all_stored, "every forwarded request's record stored", 10)
        assert len(records) == sent
        effects = sorted(e.operation_id or "" for e in fault_provider.effects)
        assert effects == sorted(op["operation_id"] for op in ops)
        assert sorted(r["operation_id"] for r in records if r.get("operation_id")) == effects
        status, body = await _readiness(http, gate.ops_url)
        assert status == 503, body
        assert 'audit sink "log" (stdout' in json.loads(body)["detail"], body
        failures = await _metric(http, gate.ops_url, 'opgate_audit_sink_failures_total{sink="log"}')
        assert failures >= 3


async def _until_async(condition: Any, what: str, seconds: float = 5.0) -> None:
    """``tests.support.polling.until`` for a condition that must await (a database read)."""
    try:
        async with asyncio.timeout(seconds):
            while not await condition():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {seconds} s: {what}") from None


async def test_a_closed_log_pipe_loses_no_audit_record(
    fault_env: dict[str, str], database_url: str, fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """With stdout a pipe whose reader has gone (EPIPE), every forwarded request is still stored
    and verifies, and the process says its log sink fails."""
    read_end, write_end = os.pipe()
    try:
        async with _running(fault_env, write_end, tmp_path / "opgate.log") as gate:
            os.close(write_end)
            write_end = -1
            os.close(read_end)  # the log shipper dies: the next line written is EPIPE
            read_end = -1
            await _every_forwarded_request_is_stored(gate, database_url, fault_provider)
            assert await gate.stop() in (0, 120)  # 120: Python could not flush stdout at exit
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    code, out = await _verify(fault_env)
    assert code == 0, out
    assert "without a clean stop" not in out, out


async def test_a_full_log_disk_loses_no_audit_record(
    fault_env: dict[str, str], database_url: str, fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """With stdout on /dev/full (ENOSPC on every write), opgate starts, serves, and stores every
    forwarded request's record."""
    with open("/dev/full", "wb") as full:  # noqa: ASYNC230 (opening a device does not block)
        async with _running(fault_env, full, tmp_path / "opgate.log") as gate:
            await _every_forwarded_request_is_stored(gate, database_url, fault_provider)
    code, out = await _verify(fault_env)
    assert code == 0, out


# --- 2. an agent that does not read its answer -----------------------------------------------


class BigAnswerProvider:
    """A provider whose refunds are answered with a 12 MB JSON object; counts its effects."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.url = ""

    async def refund(self, request: web.Request) -> web.Response:
        await request.read()
        refund_id = f"re_big_{len(self.effects) + 1}"
        self.effects.append(refund_id)
        padding = "x" * BIG_ANSWER_BYTES
        return web.json_response({"id": refund_id, "object": "refund", "padding": padding})


@pytest_asyncio.fixture(loop_scope="session")
async def big_provider() -> AsyncIterator[BigAnswerProvider]:
    provider = BigAnswerProvider()
    app = web.Application()
    app.router.add_post("/v1/refunds", provider.refund)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        await web.SockSite(runner, sock).start()
        provider.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield provider
    finally:
        await runner.cleanup()
        sock.close()


def _big_env(
    database_url: str, tmp_path: Path, provider: BigAnswerProvider, **extra: str
) -> dict[str, str]:
    policies = tmp_path / "policies"
    policies.mkdir()
    policy = fault_policy(deduplicates=False, total_timeout=20).replace(
        "classify:", "limits: {max_response_body_bytes: 16777216}\nclassify:", 1
    )
    (policies / "fault.yaml").write_text(policy)
    return process_env(database_url, policies, {"fault": provider.url}, **extra)


@contextlib.contextmanager
def _agent_that_never_reads(agent_url: str, op: dict[str, Any]) -> Iterator[socket.socket]:
    """A raw connection with a 4 KB receive window (set before connect) that sends an approved
    refund and never reads."""
    body = b"amount=500&currency=usd&charge=ch_1"
    head = (
        f"POST {REFUND} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {AGENT_TOKEN}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"X-Operation-Id: {op['operation_id']}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        host, port = agent_url.removeprefix("http://").split(":")
        sock.connect((host, int(port)))
        sock.sendall(head + body)
        yield sock
    finally:
        sock.close()


async def _row_status(database_url: str, operation_id: str) -> str | None:
    conn = await asyncpg.connect(database_url)
    try:
        status: str | None = await conn.fetchval(
            "SELECT status FROM operations WHERE operation_id = $1", operation_id
        )
        return status
    finally:
        await conn.close()


async def test_a_record_is_stored_before_an_unread_answer_is_written(
    database_url: str, tmp_path: Path, big_provider: BigAnswerProvider
) -> None:
    """An agent that never reads a 12 MB answer does not hold back its request's record: it is
    stored while the answer waits, and survives a SIGKILL."""
    env = _big_env(database_url, tmp_path, big_provider)
    gate = await spawn_opgate(env, tmp_path / "opgate.log")
    try:
        async with aiohttp.ClientSession(trust_env=False) as http:
            op = await _approve(http, gate.ops_url, "ch_1")
        with _agent_that_never_reads(gate.agent_url, op):

            async def confirmed() -> bool:
                return await _row_status(database_url, op["operation_id"]) == "confirmed"

            await _until_async(confirmed, "the refund confirmed", 60)
            assert big_provider.effects == ["re_big_1"]

            async def stored() -> bool:
                records = await _fetch(database_url, STORED_REQUESTS)
                return any(r.get("operation_id") == op["operation_id"] for r in records)

            await _until_async(stored, "the request's record stored while its answer waits", 10)
            await gate.kill()
    finally:
        await gate.kill()
    [record] = [
        r
        for r in await _fetch(database_url, STORED_REQUESTS)
        if r.get("operation_id") == op["operation_id"]
    ]
    assert record["decision"] == "allow"
    assert record["status_after"] == "confirmed"
    assert record["response_status"] == 200
    code, out = await _verify(env)
    assert code == 0, out


async def test_an_answer_not_read_in_time_is_cut_off_and_on_record(
    database_url: str, tmp_path: Path, big_provider: BigAnswerProvider
) -> None:
    """An answer the agent does not take within ``answer_write_timeout_seconds`` is cut off:
    the connection is aborted and an ``answer_undelivered`` record says so."""
    env = _big_env(database_url, tmp_path, big_provider, OPGATE_ANSWER_WRITE_TIMEOUT_SECONDS="1")
    async with _running(env, asyncio.subprocess.DEVNULL, tmp_path / "opgate.log") as gate:
        async with aiohttp.ClientSession(trust_env=False) as http:
            op = await _approve(http, gate.ops_url, "ch_1")
        with _agent_that_never_reads(gate.agent_url, op) as sock:
            undelivered: list[dict[str, Any]] = []

            async def cut_off() -> bool:
                undelivered[:] = await _fetch(database_url, STORED_OF_TYPE, "answer_undelivered")
                return bool(undelivered)

            await _until_async(cut_off, "an answer_undelivered record", 60)
            [note] = undelivered
            assert note["operation_id"] == op["operation_id"]
            assert note["reason"] == "answer_write_timeout"
            [record] = [
                r
                for r in await _fetch(database_url, STORED_REQUESTS)
                if r.get("operation_id") == op["operation_id"]
            ]
            assert note["request_id"] == record["request_id"]
            # The connection was aborted: reading what was buffered ends, not in 12 MB.
            sock.settimeout(10)
            received = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := await asyncio.to_thread(sock.recv, 65536):
                    received += len(chunk)
            assert received < BIG_ANSWER_BYTES
        await gate.stop()
    code, out = await _verify(env)
    assert code == 0, out


async def test_an_agent_that_hangs_up_mid_answer_is_on_record(
    database_url: str, tmp_path: Path, big_provider: BigAnswerProvider
) -> None:
    """An agent that resets its connection while its answer is being written gets its request
    record and an ``answer_undelivered`` record saying it went (``agent_disconnected``)."""
    env = _big_env(database_url, tmp_path, big_provider)
    async with _running(env, asyncio.subprocess.DEVNULL, tmp_path / "opgate.log") as gate:
        async with aiohttp.ClientSession(trust_env=False) as http:
            op = await _approve(http, gate.ops_url, "ch_1")
        with _agent_that_never_reads(gate.agent_url, op) as sock:

            async def stored() -> bool:
                records = await _fetch(database_url, STORED_REQUESTS)
                return any(r.get("operation_id") == op["operation_id"] for r in records)

            await _until_async(stored, "the request's record stored while its answer waits", 60)
            # A reset, not a FIN: the answer's writer sees the connection gone at once.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        undelivered: list[dict[str, Any]] = []

        async def noted() -> bool:
            undelivered[:] = await _fetch(database_url, STORED_OF_TYPE, "answer_undelivered")
            return bool(undelivered)

        await _until_async(noted, "an answer_undelivered record", 60)
        [note] = undelivered
        assert note["reason"] == "agent_disconnected"
        assert note["operation_id"] == op["operation_id"]
        await gate.stop()
    code, out = await _verify(env)
    assert code == 0, out


# --- 3. a SIGKILL with records still queued --------------------------------------------------


def _queueing_env(fault_env: dict[str, str], instance: str) -> dict[str, str]:
    """Records wait for a batch (a long linger) while the instance leaves frequent traces."""
    return {
        **fault_env,
        "OPGATE_INSTANCE_ID": instance,
        "OPGATE_AUDIT_LINGER_SECONDS": "60",
        "OPGATE_AUDIT_HEARTBEAT_SECONDS": "0.2",
    }


async def _three_queued_reads(gate: KillableOpgate) -> None:
    async with aiohttp.ClientSession(trust_env=False) as http:
        for _ in range(3):
            assert await _send_read(http, gate.agent_url) == 200
        pending = "opgate_audit_records_pending"
        for _ in range(100):
            if await _metric(http, gate.ops_url, pending) == 3:
                break
            await asyncio.sleep(0.05)  # polling a gauge, bounded
        assert await _metric(http, gate.ops_url, pending) == 3, "3 records queued"


async def test_a_sigkill_with_queued_records_is_named_by_verify(
    fault_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """A process SIGKILLed with three records queued: verify names its unclean end and the three
    records after the last one stored."""
    env = _queueing_env(fault_env, "faults-killed")
    gate = await spawn_opgate(env, tmp_path / "opgate.log")
    try:
        await _three_queued_reads(gate)

        async def traced() -> bool:
            conn = await asyncpg.connect(database_url)
            try:
                numbered = await conn.fetchval(
                    "SELECT numbered_seq FROM audit_instance_runs WHERE instance_id = $1",
                    "faults-killed",
                )
            finally:
                await conn.close()
            return bool(numbered == 3)

        await _until_async(traced, "the instance's trace names 3 numbered records")
    finally:
        await gate.kill()
    assert await _fetch(database_url, STORED_REQUESTS) == []
    expected = (
        "instance faults-killed ended without a clean stop; at least 3 records after seq 0"
        " are unaccounted for: 3 numbered by its last trace"
    )
    out = ""
    for _ in range(20):  # until its last trace is old enough to be an end, not a running process
        code, out = await _verify(env)
        assert code == 0, out
        if expected in out:
            break
    assert expected in out, out


async def test_a_sigterm_leaves_nothing_unaccounted(
    fault_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """A process stopped with SIGTERM stores what it had queued: verify is ok and names no
    unclean end."""
    env = _queueing_env(fault_env, "faults-stopped")
    gate = await spawn_opgate(env, tmp_path / "opgate.log")
    try:
        await _three_queued_reads(gate)
        assert await gate.stop() == 0
    finally:
        await gate.kill()
    assert len(await _fetch(database_url, STORED_REQUESTS)) == 3
    code, out = await _verify(env)
    assert code == 0, out
    assert "without a clean stop" not in out, out
