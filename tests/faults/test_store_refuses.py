"""A store that refuses: a real opgate process against its own database on the real PostgreSQL,
which then stops accepting connections, revokes opgate's login, turns read-only (the SQLSTATE a
standby gives) or becomes unreachable. Every listener answers 503 problem+json
``store_unavailable`` (the MCP endpoint: a tool error with that code) with an audit record
giving that reason, never a 500; nothing reaches the provider; and once the fault is lifted the
same requests succeed without a restart."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest
import pytest_asyncio

from tests.support.environment import inherited
from tests.support.fault_provider import FaultProvider
from tests.support.mcp_client import http_client, refused_code
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    REFUND_APPROVAL,
    admin_headers,
    fault_policy,
    process_env,
)
from tests.support.opgate_process import OpgateProcess, opgate_process
from tests.support.paths import REPO
from tests.support.pg_relay import TcpRelay, dsn_through_relay, relay_target
from tests.support.raw_http import exchange

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
# Long enough for a loaded CI machine, short so that the test does not wait it out often.
_RECOVERY_SECONDS = 20.0


@dataclass
class Bed:
    """The database opgate uses, as the role it logs in as, and the server's admin DSN."""

    admin_dsn: str
    database: str
    role: str
    dsn: str  # what opgate is given
    relay: TcpRelay


async def _admin(bed: Bed, *statements: str) -> None:
    conn = await asyncpg.connect(bed.admin_dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _terminate_opgate(bed: Bed) -> None:
    """Every backend of opgate's role: the pool must connect again, and meets the fault."""
    await _admin(
        bed,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        f" WHERE usename = '{bed.role}' AND pid <> pg_backend_pid()",
    )


@dataclass(frozen=True)
class Fault:
    name: str
    apply: Callable[[Bed], Awaitable[None]]
    lift: Callable[[Bed], Awaitable[None]]
    # A read-only database still answers reads: a console page (reads only) is served.
    reads_answer: bool = False


async def _refuse_connections(bed: Bed) -> None:
    await _admin(bed, f'ALTER DATABASE "{bed.database}" ALLOW_CONNECTIONS false')
    await _terminate_opgate(bed)


async def _allow_connections(bed: Bed) -> None:
    await _admin(bed, f'ALTER DATABASE "{bed.database}" ALLOW_CONNECTIONS true')


async def _revoke_login(bed: Bed) -> None:
    await _admin(bed, f'ALTER ROLE "{bed.role}" NOLOGIN')
    await _terminate_opgate(bed)


async def _grant_login(bed: Bed) -> None:
    await _admin(bed, f'ALTER ROLE "{bed.role}" LOGIN')


async def _turn_read_only(bed: Bed) -> None:
    await _admin(bed, f'ALTER DATABASE "{bed.database}" SET default_transaction_read_only = on')
    await _terminate_opgate(bed)


async def _turn_writable(bed: Bed) -> None:
    # Like a failover back to a primary: the standby's sessions end, new ones are writable.
    await _admin(bed, f'ALTER DATABASE "{bed.database}" RESET default_transaction_read_only')
    await _terminate_opgate(bed)


async def _cut(bed: Bed) -> None:
    await bed.relay.cut()


async def _restore(bed: Bed) -> None:
    await bed.relay.restore()


FAULTS = [
    Fault("database_refuses_connections", _refuse_connections, _allow_connections),
    Fault("login_revoked", _revoke_login, _grant_login),
    Fault("database_read_only", _turn_read_only, _turn_writable, reads_answer=True),
    Fault("server_unreachable", _cut, _restore),
]


@pytest_asyncio.fixture(loop_scope="session")
async def bed(pg_server_dsn: str, database_url: str) -> AsyncIterator[Bed]:
    """A role of opgate's own (superuser, so it owns nothing less than the suite's), reached
    through a cuttable relay; the role is dropped afterwards."""
    role = f"opgate_fault_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(database_url)
    database = parts.path.lstrip("/")
    relay = TcpRelay()
    host, port = await relay.start(*relay_target(database_url))
    through = dsn_through_relay(database_url, host, port)
    relayed = urlsplit(through)
    dsn = urlunsplit(relayed._replace(netloc=f"{role}@{relayed.hostname}:{relayed.port}"))
    made = Bed(pg_server_dsn, database, role, dsn, relay)
    await _admin(made, f'CREATE ROLE "{role}" LOGIN SUPERUSER')
    try:
        yield made
    finally:
        await relay.stop()
        await _admin(
            made,
            f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true',
            f'ALTER DATABASE "{database}" RESET default_transaction_read_only',
        )
        await _terminate_opgate(made)
        await _admin(made, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await _admin(made, f'DROP ROLE IF EXISTS "{role}"')


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    bed: Bed, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> AsyncIterator[OpgateProcess]:
    # reachable in forward mode too, at the fault provider's own (loopback) origin
    forward = "forward_proxy:\n  allow_destinations: [loopback]\n"
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False) + forward)
    env = process_env(
        bed.dsn,
        policy_dir,
        {"fault": fault_provider.url},
        OPGATE_FORWARD_LISTEN="127.0.0.1:0",
        OPGATE_CA_DIR=str(tmp_path / "ca"),
        OPGATE_BACKGROUND_INTERVAL_SECONDS="3600",
        OPGATE_POLICY_RELOAD_INTERVAL_SECONDS="0",
        OPGATE_POOL_ACQUIRE_TIMEOUT_SECONDS="2",
        OPGATE_STATEMENT_TIMEOUT_MS="2000",
        OPGATE_AUDIT_CHECKPOINT_SECONDS="3600",
    )
    async with opgate_process(env) as process:
        yield process


def _audit_lines(gate: OpgateProcess) -> list[dict[str, Any]]:
    """The request records among the process's JSON lines (the opgate.audit lines)."""
    return [line for line in gate.lines if line.get("event") == "request" and "request_id" in line]


@dataclass
class Client:
    gate: OpgateProcess
    http: aiohttp.ClientSession
    console: aiohttp.ClientSession

    async def approve(self) -> tuple[int, dict[str, Any]]:
        async with self.http.post(
            f"{self.gate.ops_url}/v1/operations", json=REFUND_APPROVAL, headers=admin_headers()
        ) as r:
            return r.status, await _body(r)

    async def send(self, operation_id: str) -> tuple[int, dict[str, Any]]:
        async with self.http.post(
            f"{self.gate.agent_url}/fault/v1/refunds",
            data="amount=500&currency=usd&charge=ch_1",
            headers={
                "Authorization": f"Bearer {AGENT_TOKEN}",
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Operation-Id": operation_id,
            },
        ) as r:
            return r.status, await _body(r)

    async def send_forward(
        self, operation_id: str, provider_url: str
    ) -> tuple[int, dict[str, Any]]:
        """The same refund as an absolute-form request to the forward-proxy listener."""
        [started] = [line for line in self.gate.lines if line.get("event") == "opgate_started"]
        forward = urlsplit(started["forward_url"])
        target = f"{provider_url}/v1/refunds".encode()
        body = b"amount=500&currency=usd&charge=ch_1"
        request = (
            b"POST " + target + b" HTTP/1.1\r\nHost: " + target.split(b"/")[2] + b"\r\n"
            b"Proxy-Authorization: Bearer " + AGENT_TOKEN.encode() + b"\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"X-Operation-Id: " + operation_id.encode() + b"\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        ) + body
        response = await exchange(f"http://{forward.netloc}", request)
        try:
            payload = response.problem()
        except ValueError:
            payload = {"_text": response.body[:300].decode("latin-1")}
        return response.status, {
            "_content_type": response.headers.get("Content-Type"),
            **payload,
        }

    async def propose(self) -> tuple[int, dict[str, Any]]:
        proposal = {k: REFUND_APPROVAL[k] for k in ("provider", "action", "amount", "currency")}
        async with self.http.post(
            f"{self.gate.agent_url}/_opgate/v1/proposals",
            json={**proposal, "params": {"charge": "ch_1"}, "reason": "a customer asked"},
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        ) as r:
            return r.status, await _body(r)

    async def console_page(self) -> tuple[int, dict[str, Any]]:
        async with self.console.get(
            f"{self.gate.ops_url}/console/operations", allow_redirects=False
        ) as r:
            # a console answer, refusal or page, is never kept by a cache
            assert r.headers.get("Cache-Control") == "no-store", r.headers
            return r.status, await _body(r)

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        async with self.http.get(f"{self.gate.ops_url}/readyz") as r:
            return r.status, await _body(r)

    async def mcp_get(self, operation_id: str) -> str | None:
        """The code of a refused get_operation, None when it was answered."""
        async with http_client(self.gate.agent_url, AGENT_TOKEN) as client:
            result = await client.call_tool("get_operation", {"operation_id": operation_id})
        return refused_code(result) if result.is_error else None

    async def sweep(self, operation_id: str, proposal_id: str) -> list[str]:
        """Every other route that reads or writes the store, on each listener: what each
        answered that is neither served nor refused as store_unavailable (none may be 500)."""
        ops, agent = self.gate.ops_url, self.gate.agent_url
        admin = admin_headers()
        as_agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        resolve = {"verdict": "failed", "note": "n", "decided_by": "alice"}
        calls: list[tuple[aiohttp.ClientSession, str, str, dict[str, str], Any]] = [
            (self.http, "GET", f"{ops}/v1/operations", admin, None),
            (self.http, "GET", f"{ops}/v1/operations/{operation_id}", admin, None),
            (self.http, "GET", f"{ops}/v1/escalations", admin, None),
            (self.http, "GET", f"{ops}/v1/budgets", admin, None),
            (
                self.http,
                "POST",
                f"{ops}/v1/operations/{operation_id}/revoke",
                admin,
                {"reason": "r"},
            ),
            (self.http, "POST", f"{ops}/v1/operations/{operation_id}/reconcile", admin, None),
            (self.http, "POST", f"{ops}/v1/operations/{operation_id}/resolve", admin, resolve),
            (self.http, "GET", f"{ops}/v1/proposals", admin, None),
            (self.http, "GET", f"{ops}/v1/proposals/{proposal_id}", admin, None),
            (self.http, "POST", f"{ops}/v1/proposals/{proposal_id}/approve", admin, {}),
            (
                self.http,
                "POST",
                f"{ops}/v1/proposals/{proposal_id}/decline",
                admin,
                {"reason": "r"},
            ),
            (self.http, "GET", f"{agent}/_opgate/v1/operations", as_agent, None),
            (self.http, "GET", f"{agent}/_opgate/v1/operations/{operation_id}", as_agent, None),
            (self.http, "GET", f"{agent}/_opgate/v1/proposals/{proposal_id}", as_agent, None),
            (self.console, "GET", f"{ops}/console/", {}, None),
            (self.console, "GET", f"{ops}/console/operations/{operation_id}", {}, None),
            (self.console, "GET", f"{ops}/console/escalations", {}, None),
            (self.console, "GET", f"{ops}/console/budgets", {}, None),
            (self.console, "GET", f"{ops}/console/proposals", {}, None),
            (self.console, "GET", f"{ops}/console/audit", {}, None),
        ]
        wrong = []
        for session, method, url, headers, body in calls:
            async with session.request(
                method, url, headers=headers, json=body, allow_redirects=False
            ) as r:
                answer = (r.status, await _body(r))
            status, payload = answer
            refused = (status, payload.get("_content_type"), payload.get("code")) == (
                503,
                "application/problem+json",
                "store_unavailable",
            )
            if status >= 500 and not refused:
                wrong.append(f"{method} {url}: {status} {payload}")
        # signing in writes a session: a browser of its own, the sign-in form first
        async with aiohttp.ClientSession(
            trust_env=False, cookie_jar=aiohttp.CookieJar(unsafe=True)
        ) as browser:
            async with browser.get(f"{ops}/console/login") as form:
                match = _CSRF.search(await form.text())
                assert match is not None
            sign_in = {"csrf_token": match.group(1), "identity": "bob", "token": ADMIN_TOKEN}
            async with browser.post(
                f"{ops}/console/login", data=sign_in, allow_redirects=False
            ) as r:
                if r.status >= 500 and r.content_type != "application/problem+json":
                    wrong.append(f"POST /console/login: {r.status} {(await r.read())[:200]!r}")
        async with self.http.get(f"{ops}/metrics") as r:
            if r.status != 200:
                wrong.append(f"GET /metrics: {r.status}")
        return wrong

    async def sign_in(self) -> None:
        async with self.console.get(f"{self.gate.ops_url}/console/login") as form:
            match = _CSRF.search(await form.text())
            assert match is not None
        async with self.console.post(
            f"{self.gate.ops_url}/console/login",
            data={"csrf_token": match.group(1), "identity": "alice", "token": ADMIN_TOKEN},
            allow_redirects=False,
        ) as r:
            assert r.status == 303, await r.text()


async def _body(response: aiohttp.ClientResponse) -> dict[str, Any]:
    raw = await response.read()
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"_content_type": response.content_type, "_text": raw[:300].decode("latin-1")}
    if not isinstance(parsed, dict):
        return {"_json": parsed}
    return {"_content_type": response.content_type, **parsed}


def _refused(answer: tuple[int, dict[str, Any]], what: str) -> None:
    status, body = answer
    assert (status, body.get("_content_type"), body.get("code")) == (
        503,
        "application/problem+json",
        "store_unavailable",
    ), f"{what}: {status} {body}"


@pytest_asyncio.fixture(loop_scope="session")
async def client(gate: OpgateProcess) -> AsyncIterator[Client]:
    async with (
        aiohttp.ClientSession(trust_env=False) as http,
        aiohttp.ClientSession(
            trust_env=False, cookie_jar=aiohttp.CookieJar(unsafe=True)
        ) as console,
    ):
        made = Client(gate, http, console)
        await made.sign_in()
        yield made


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
async def test_a_store_fault_is_503_store_unavailable_everywhere_and_passes(
    fault: Fault, bed: Bed, client: Client, fault_provider: FaultProvider
) -> None:
    """Each store fault answers every listener 503 store_unavailable with an audit record
    giving that reason and sends nothing; lifted, the same requests succeed."""
    warned = [line for line in client.gate.lines if line.get("event") == "database_single_host"]
    assert len(warned) == 1, "one host: a promotion is never followed, said once at start"
    status, approved = await client.approve()
    assert status == 201, approved
    waiting, later = approved["operation_id"], (await client.approve())[1]["operation_id"]
    status, proposed = await client.propose()
    assert status == 201, proposed

    await fault.apply(bed)
    try:
        records_before = len(_audit_lines(client.gate))
        _refused(await client.send(waiting), "agent send")
        _refused(await client.send_forward(waiting, fault_provider.url), "forward-proxy send")
        _refused(await client.approve(), "approval")
        _refused(await client.propose(), "agent proposal")
        if fault.reads_answer:
            assert (await client.console_page())[0] == 200
        else:
            _refused(await client.console_page(), "console page")
        refused_reads = 0 if fault.reads_answer else 1
        if fault.reads_answer:
            assert await client.mcp_get(waiting) is None
        else:
            assert await client.mcp_get(waiting) == "store_unavailable"
        status, ready = await client.readyz()
        assert status == 503, ready
        assert ready["status"] == "unavailable", ready
        assert not fault_provider.requests, "a request left while the store was down"
        records = _audit_lines(client.gate)[records_before:]
        assert await client.sweep(later, proposed["proposal"]["proposal_id"]) == []
        reasons = [(r.get("decision"), r.get("reason")) for r in records]
        # the sends (agent and forward listeners), the proposal (and the MCP read): one record
        # each, store_unavailable; the MCP client's opening exchange (no store in it) is allowed
        refused = [reason for decision, reason in reasons if decision != "allow"]
        assert refused == ["store_unavailable"] * (3 + refused_reads), reasons
    finally:
        await fault.lift(bed)

    async def ready() -> bool:
        return (await client.readyz())[0] == 200

    await _until_async(ready, "readyz is 200 again")
    status, sent = await client.send_forward(waiting, fault_provider.url)
    assert status == 200, sent
    assert len(fault_provider.effects) == 1
    status, fresh = await client.approve()
    assert status == 201, fresh
    status, sent = await client.send(fresh["operation_id"])
    assert status == 200, sent
    assert len(fault_provider.effects) == 2
    assert (await client.propose())[0] == 201
    assert (await client.console_page())[0] == 200
    assert await client.mcp_get(later) is None


async def _until_async(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll a condition that takes a request to know, bounded (a readiness probe)."""
    try:
        async with asyncio.timeout(_RECOVERY_SECONDS):
            while not await check():  # noqa: ASYNC110 (a probe: nothing signals readiness)
                await asyncio.sleep(0.05)  # between probes, not a synchronization
    except TimeoutError:
        raise AssertionError(f"not within {_RECOVERY_SECONDS} s: {what}") from None


async def _opgate_command(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """``python -m proxy ARGS`` with ``env`` on top of a clean environment: exit status and
    stderr."""
    full = inherited()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        *args,
        cwd=REPO,
        env={
            **full,
            "OPGATE_AGENT_LISTEN": "127.0.0.1:0",
            "OPGATE_OPS_LISTEN": "127.0.0.1:0",
            **env,
        },
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


_PASSWORD = "s3cret-never-shown"


@pytest.mark.parametrize(
    "command", [("serve",), ("serve", "--workers", "2"), ("migrate",), ("audit", "verify")]
)
async def test_a_command_that_cannot_reach_the_store_says_so_in_one_line(
    command: tuple[str, ...], bed: Bed, policy_dir: Path
) -> None:
    """serve, migrate and audit against a database that is unreachable or refuses the login:
    one line on stderr naming the problem (no traceback, no password), exit 2."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    with_password = bed.dsn.replace(f"{bed.role}@", f"{bed.role}:{_PASSWORD}@")
    await bed.relay.cut()
    try:
        status, stderr = await _opgate_command(
            *command, env=process_env(with_password, policy_dir, {})
        )
    finally:
        await bed.relay.restore()
    assert (status, len(stderr.splitlines())) == (2, 1), stderr
    assert "database" in stderr
    assert "Traceback" not in stderr
    assert _PASSWORD not in stderr

    await _revoke_login(bed)
    try:
        status, stderr = await _opgate_command(
            *command, env=process_env(with_password, policy_dir, {})
        )
    finally:
        await _grant_login(bed)
    assert (status, len(stderr.splitlines())) == (2, 1), stderr
    assert "not permitted to log in" in stderr
    assert _PASSWORD not in stderr


async def test_serve_refuses_several_hosts_that_may_be_a_standby(
    bed: Bed, policy_dir: Path
) -> None:
    """Several hosts without target_session_attrs=read-write: one line, exit 2, nothing
    served; with it, opgate starts and follows whichever host is the primary."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    parts = urlsplit(bed.dsn)
    both = f"{parts.hostname}:{parts.port},{parts.hostname}:{parts.port}"
    several = urlunsplit(parts._replace(netloc=f"{bed.role}:{_PASSWORD}@{both}"))
    status, stderr = await _opgate_command("serve", env=process_env(several, policy_dir, {}))
    assert (status, len(stderr.splitlines())) == (2, 1), stderr
    assert "target_session_attrs=read-write" in stderr
    assert _PASSWORD not in stderr
    primary_only = f"{several}?target_session_attrs=read-write"
    async with opgate_process(process_env(primary_only, policy_dir, {})) as gate:
        assert not [line for line in gate.lines if line.get("event") == "database_single_host"]
