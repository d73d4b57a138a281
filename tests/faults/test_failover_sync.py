"""A database failover under synchronous replication: real opgate processes on a real primary
with a real streaming standby (tests/support/cluster.py), a provider that does not deduplicate.

Readiness and start-up follow the replication (no sync standby: /readyz 503; asynchronous
standbys: no start unless accepted), and a primary killed mid-stream then a standby promoted
makes no second effect and loses no approval. One failover round in CI;
``OPGATE_FAILOVER_ROUNDS=N`` runs N.

The soak (docs/running-ha.md, not in CI): ``OPGATE_STANDBY_OUTAGES=M`` adds M rounds in which
the synchronous standby is stopped for a while instead (claims hang, are cut off, and must
not be burned), and ``OPGATE_FAILOVER_GRACES=1,5,60`` runs every round once per rule grace
(default 0.5 s). The figures (``-s``) count doubles, lost and burned approvals, 500s, and the
sends answered 409 reconcile_required per failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import pytest_asyncio

from tests.support.cluster import Cluster, missing_reason, running_cluster
from tests.support.environment import inherited
from tests.support.failover import approve, recovery_view, send_approved
from tests.support.fault_provider import FaultProvider
from tests.support.killable_opgate import REPO, KillableOpgate, spawn_opgate
from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, fault_policy, process_env
from tests.support.opgate_process import opgate_process
from tests.support.polling import until
from tests.support.recovery_agent import EXIT_DONE, follow

ROUNDS = int(os.environ.get("OPGATE_FAILOVER_ROUNDS", "1"))
OUTAGES = int(os.environ.get("OPGATE_STANDBY_OUTAGES", "0"))
GRACES = [float(g) for g in os.environ.get("OPGATE_FAILOVER_GRACES", "0.5").split(",")]
STANDBY_OUTAGE_SECONDS = 6.0  # longer than the 5 s statement timeout: claims are cut off
AGENTS = 12
EFFECTS_BEFORE_KILL = 15  # the primary dies mid-stream: after this many refunds of the round
EFFECTS_AFTER_PROMOTION = 15  # and opgate must go on serving on the promoted standby
OUTAGE_SECONDS = 0.5  # how long no primary exists: a failover's gap, not a synchronisation


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    return _policies(tmp_path / "policies", grace_seconds=0.5)


def _policies(directory: Path, grace_seconds: float) -> Path:
    directory.mkdir()
    (directory / "fault.yaml").write_text(
        fault_policy(
            deduplicates=False, total_timeout=2, grace_seconds=grace_seconds, max_attempts=4
        )
    )
    return directory


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session


async def readyz(http: aiohttp.ClientSession, ops_url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(f"{ops_url}/readyz", timeout=aiohttp.ClientTimeout(total=10)) as answer:
        body: dict[str, Any] = await answer.json()
        return answer.status, body


async def test_readyz_is_503_while_no_sync_standby_acknowledges_commits(
    cluster: Cluster, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """With synchronous_standby_names set and the standby stopped, /readyz says 503 within its
    commit timeout (claims would hang); with the standby back, 200 and 'synchronous'."""
    dsn = await cluster.create_database(f"ready_{uuid.uuid4().hex[:8]}")
    env = process_env(
        dsn,
        policies,
        {"fault": fault_provider.url},
        OPGATE_READINESS_COMMIT_TIMEOUT_SECONDS="0.5",
    )
    async with opgate_process(env) as gate:
        status, body = await readyz(http, gate.ops_url)
        assert status == 200, body
        cluster.stop_standby()
        try:
            status, body = await readyz(http, gate.ops_url)
            assert status == 503, body
            assert "not acknowledged" in body["detail"], body
        finally:
            cluster.start_standby()
        status, body = await readyz(http, gate.ops_url)
        assert (status, body["replication"]) == (200, "synchronous"), body


async def test_single_node_is_said_at_start_and_in_readyz(
    database_url: str, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """A single PostgreSQL (no standby, no synchronous names): a warning at start, a note in
    /readyz's body, and opgate serves."""
    env = process_env(database_url, policies, {"fault": fault_provider.url})
    async with opgate_process(env) as gate:
        status, body = await readyz(http, gate.ops_url)
        said = [line for line in gate.lines if line.get("event") == "opgate_replication"]
    assert status == 200, body
    assert body["replication"] == "single_node"
    assert "single PostgreSQL node" in body["replication_note"]
    assert [(line["level"], line["durability"]) for line in said] == [("warning", "single_node")]


async def test_asynchronous_standby_refuses_start_unless_accepted(
    policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """Asynchronous standbys only: `opgate serve` exits 2 with one line; with
    OPGATE_ACCEPT_ASYNC_REPLICATION=true it serves and says 'asynchronous'."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_cluster(sync=False) as fresh:
        dsn = await fresh.create_database("opgate")
        env = process_env(dsn, policies, {"fault": fault_provider.url})
        for workers in ("1", "2"):  # one process, and the supervisor before it forks
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "proxy",
                "serve",
                cwd=REPO,
                env={
                    **inherited(),
                    **env,
                    "OPGATE_AGENT_LISTEN": "127.0.0.1:0",
                    "OPGATE_OPS_LISTEN": "127.0.0.1:0",
                    "OPGATE_FORWARD_LISTEN": "",
                    "OPGATE_WORKERS": workers,
                },
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await asyncio.wait_for(process.communicate(), 60)
            lines = err.decode().strip().splitlines()
            assert process.returncode == 2, (workers, lines)
            assert len(lines) == 1, (workers, lines)
            assert "asynchronous standby" in lines[0]
            assert "accept_async_replication" in lines[0]

        accepted = {**env, "OPGATE_ACCEPT_ASYNC_REPLICATION": "true"}
        async with opgate_process(accepted) as gate:
            status, body = await readyz(http, gate.ops_url)
        assert (status, body["replication"]) == (200, "asynchronous"), body


async def follow_recovery(agent_url: str, operation_id: str) -> tuple[int, dict[str, Any]]:
    """A replacement agent process (tests/support/recovery_agent.py): its exit code and view."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.recovery_agent",
        agent_url,
        AGENT_TOKEN,
        operation_id,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    lines = out.decode().strip().splitlines()
    view: dict[str, Any] = json.loads(lines[-1]) if lines else {"stderr": err.decode()[-2000:]}
    return process.returncode, view


async def test_claim_cut_off_at_its_commit_is_sent_once_after_recovery(
    cluster: Cluster, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """A claim whose commit no standby acknowledged (the statement timed out: 503 "nothing was
    sent", the row committed locally) is released as not_sent once the store answers: the
    recovery protocol sends it exactly once and it ends confirmed, not failed."""
    dsn = await cluster.create_database(f"cut_{uuid.uuid4().hex[:8]}")
    env = process_env(
        dsn,
        policies,
        {"fault": fault_provider.url},
        OPGATE_STATEMENT_TIMEOUT_MS="1000",
        OPGATE_LEASE_MARGIN_SECONDS="0.3",  # the lease (2.3 s) expires within the test
        OPGATE_BACKGROUND_INTERVAL_SECONDS="0.2",
    )
    async with opgate_process(env) as gate:
        operation_id = await approve(http, gate.ops_url, 1)
        _, view = await recovery_view(http, gate.agent_url, operation_id)
        cluster.stop_standby()
        try:
            status, problem = await send_approved(http, gate.agent_url, view["request"])
        finally:
            cluster.start_standby()
        assert (status, problem.get("code")) == (503, "store_unavailable"), problem
        assert fault_provider.requests == []  # nothing was sent
        code, final = await follow_recovery(gate.agent_url, operation_id)
    effects = [e for e in fault_provider.effects if e.operation_id == operation_id]
    assert (code, final["operation"]["status"]) == (0, "confirmed"), final
    assert len(effects) == 1


@dataclass
class Round:
    """What one failover round saw, at the provider, in the database and in every answer."""

    kind: str = "failover"  # or "standby_outage"
    grace_seconds: float = 0.5
    approved: list[str] = field(default_factory=list)  # answered 201
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)  # (kind, status)
    lost_approvals: list[str] = field(default_factory=list)
    double_effects: dict[str, int] = field(default_factory=dict)
    endings: Counter[str] = field(default_factory=Counter)
    audit_verify: int | None = None
    seconds: float = 0.0
    claims_cut_off: int = 0  # claims whose statement failed with the connection (503)
    cut_off_released: int = 0  # of them, committed after all: released as not_sent
    answered_reconcile_required: int = 0  # sends answered 409 reconcile_required
    marked: int = 0  # operations the switch put in doubt (timeline_switched)
    recovery_seconds: float = 0.0  # the replacement agents, until every approval ended
    burned: list[str] = field(default_factory=list)  # ended needing a new approval, unsent

    @property
    def status_500(self) -> int:
        return sum(n for (_, status), n in self.answers.items() if status == 500)

    @property
    def status_503(self) -> int:
        return sum(n for (_, status), n in self.answers.items() if status == 503)


async def load_agent(gate: KillableOpgate, index: int, stop: asyncio.Event, seen: Round) -> None:
    """An agent of the round: approvals (by its human) and their first sends, one after the
    other, until told to stop; a refusal or an outage only moves it on to the next."""
    connector = aiohttp.TCPConnector(force_close=True)  # no stale keep-alive across the kill
    async with aiohttp.ClientSession(trust_env=False, connector=connector) as http:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                async with http.post(
                    f"{gate.ops_url}/v1/operations",
                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                    json={
                        "tenant": "t1",
                        "provider": "fault",
                        "action": "refund.create",
                        "amount": 100 + n,
                        "currency": "usd",
                        "params": {"charge": f"ch_{index}_{n}_{uuid.uuid4().hex[:6]}"},
                        "approval_ref": f"F-{index}-{n}",
                        "approved_by": "failover",
                        "ttl_seconds": 600,
                    },
                    timeout=aiohttp.ClientTimeout(total=15),
                ) as answer:
                    seen.answers["approve", answer.status] += 1
                    payload = await answer.json(content_type=None)
                if answer.status != 201:
                    await asyncio.sleep(0.05)  # pacing through the outage, not a sync
                    continue
                operation_id = str(payload["operation_id"])
                seen.approved.append(operation_id)
                status, view = await recovery_view(http, gate.agent_url, operation_id)
                seen.answers["read", status] += 1
                if status == 200 and view["next_action"] == "send":
                    status, _ = await send_approved(http, gate.agent_url, view["request"])
                    seen.answers["send", status] += 1
            except (aiohttp.ClientError, TimeoutError, ValueError):
                seen.answers["no_answer", 0] += 1


async def failover_round(
    policies: Path,
    fault_provider: FaultProvider,
    logs: Path,
    number: int,
    kind: str = "failover",
    grace_seconds: float = 0.5,
) -> Round:
    """Agents at work on a synchronous primary + standby; the primary killed mid-stream, the
    standby promoted (or, ``standby_outage``, the standby stopped for a while and started
    again); the agents go on; then replacement agents recover every approval."""
    seen, began = Round(kind, grace_seconds), time.monotonic()
    with running_cluster(sync=True) as fresh:
        dsn = await fresh.create_database("opgate")
        env = process_env(
            dsn,
            policies,
            {"fault": fault_provider.url},
            OPGATE_LEASE_MARGIN_SECONDS="0.3",
            OPGATE_BACKGROUND_INTERVAL_SECONDS="0.2",
            OPGATE_POOL_ACQUIRE_TIMEOUT_SECONDS="2",
            OPGATE_DRAIN_SECONDS="1",
            OPGATE_SECRET_AUDIT_KEY="failover-audit-key-not-a-real-secret",
            OPGATE_AUDIT_CHECKPOINT_SECONDS="0.5",
        )
        gate = await spawn_opgate(env, logs / f"opgate-round-{number}.log")
        try:
            effects_at_start = len(fault_provider.effects)
            stop = asyncio.Event()
            agents = [asyncio.create_task(load_agent(gate, i, stop, seen)) for i in range(AGENTS)]
            try:
                await until(
                    lambda: len(fault_provider.effects) >= effects_at_start + EFFECTS_BEFORE_KILL,
                    "refunds flow before the kill",
                    30,
                )
                if kind == "failover":
                    fresh.kill_primary()
                    await asyncio.sleep(OUTAGE_SECONDS)  # the failover's gap (OUTAGE_SECONDS)
                    fresh.promote()
                else:
                    await asyncio.to_thread(fresh.stop_standby)
                    await asyncio.sleep(STANDBY_OUTAGE_SECONDS)  # the outage, not a sync
                    await asyncio.to_thread(fresh.start_standby)
                promoted_at = len(fault_provider.effects)
                await until(
                    lambda: len(fault_provider.effects) >= promoted_at + EFFECTS_AFTER_PROMOTION,
                    "refunds flow again on the promoted standby",
                    30,
                )
            finally:
                stop.set()
                await asyncio.gather(*agents)
            present = await _present(fresh.dsn("opgate"), seen.approved)
            seen.lost_approvals = [op for op in seen.approved if op not in present]
            recovery_began = time.monotonic()
            endings = await asyncio.gather(
                *(
                    asyncio.to_thread(follow, gate.agent_url, AGENT_TOKEN, op)
                    for op in seen.approved
                    if op in present
                )
            )
            seen.recovery_seconds = time.monotonic() - recovery_began
            seen.endings = Counter(
                "confirmed" if code == EXIT_DONE and view["operation"]["status"] == "confirmed"
                else str(view["next_action"])
                for code, view in endings
            )  # fmt: skip
            sent = {e.operation_id for e in fault_provider.effects}
            unsent = {op for op in seen.approved if op not in sent}
            seen.burned = [
                str(view["operation"]["operation_id"])
                for _, view in endings
                if view["next_action"] == "new_approval_required"
                and view["operation"]["operation_id"] in unsent
            ]
        finally:
            await gate.stop()
        log = await asyncio.to_thread((logs / f"opgate-round-{number}.log").read_text)
        seen.claims_cut_off = log.count('"event": "claim_cut_off"')
        seen.cut_off_released = log.count('"event": "claim_cut_off_released"')
        seen.answered_reconcile_required = _answered(log, 409, "reconcile_required")
        seen.marked = sum(
            json.loads(line).get("operations_in_doubt", 0)
            for line in log.splitlines()
            if '"timeline_switched"' in line
        )
        seen.audit_verify = await _verify_audit(env)
    ours = set(seen.approved)
    effects = Counter(e.operation_id for e in fault_provider.effects if e.operation_id in ours)
    seen.double_effects = {op: n for op, n in effects.items() if n > 1}
    seen.seconds = time.monotonic() - began
    return seen


def _answered(log: str, status: int, reason: str) -> int:
    """Requests the log's canonical records say were answered ``status`` for ``reason``."""
    count = 0
    for line in log.splitlines():
        if reason not in line:
            continue
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            count += record.get("response_status") == status and record.get("reason") == reason
    return count


async def _present(dsn: str, operation_ids: list[str]) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT operation_id FROM operations WHERE operation_id = ANY($1::text[])",
            operation_ids,
        )
    finally:
        await conn.close()
    return {row["operation_id"] for row in rows}


async def _verify_audit(env: dict[str, str]) -> int:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "audit",
        "verify",
        cwd=REPO,
        env={**inherited(), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode


async def test_failover_with_synchronous_replication_sends_each_operation_at_most_once(
    fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """Primary killed mid-stream, standby promoted (or the standby stopped and started again):
    no second effect at a provider that does not deduplicate, no approval answered 201 lost or
    burned, no 500, every approval recovered to confirmed, and the audit chain verifies
    (OPGATE_FAILOVER_ROUNDS, OPGATE_STANDBY_OUTAGES, OPGATE_FAILOVER_GRACES: one failover in
    CI)."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    fault_provider.answer_delay_seconds = 0.05  # the kill lands between claims and answers
    rounds: list[Round] = []
    began = time.monotonic()
    for grace in GRACES:
        policy_dir = _policies(tmp_path / f"policies-{grace:g}", grace_seconds=grace)
        for kind, count in (("failover", ROUNDS), ("standby_outage", OUTAGES)):
            for _ in range(count):
                number = len(rounds)
                rounds.append(
                    await failover_round(policy_dir, fault_provider, tmp_path, number, kind, grace)
                )
    failovers = [r for r in rounds if r.kind == "failover"]
    figures = {
        "failovers": len(failovers),
        "standby_outages": len(rounds) - len(failovers),
        "graces": GRACES,
        "approvals": sum(len(r.approved) for r in rounds),
        "double_effects": sum(len(r.double_effects) for r in rounds),
        "lost_approvals": sum(len(r.lost_approvals) for r in rounds),
        "burned_approvals": sum(len(r.burned) for r in rounds),
        "answers_503": sum(r.status_503 for r in rounds),
        "answers_500": sum(r.status_500 for r in rounds),
        "endings": dict(sum((r.endings for r in rounds), Counter())),
        "audit_verify_failures": sum(1 for r in rounds if r.audit_verify != 0),
        "claims_cut_off": sum(r.claims_cut_off for r in rounds),
        "cut_off_released_not_sent": sum(r.cut_off_released for r in rounds),
        "reconcile_required_409_per_failover": {
            f"{grace:g}": [
                r.answered_reconcile_required for r in failovers if r.grace_seconds == grace
            ]
            for grace in GRACES
        },
        "marked_per_failover": [r.marked for r in failovers],
        "recovery_seconds_per_failover": {
            f"{grace:g}": [
                round(r.recovery_seconds, 1) for r in failovers if r.grace_seconds == grace
            ]
            for grace in GRACES
        },
        "reconcile_required_409_in_outages": sum(
            r.answered_reconcile_required for r in rounds if r.kind != "failover"
        ),
        "seconds": round(time.monotonic() - began, 1),
    }
    print(f"\nfailover figures: {json.dumps(figures)}")
    assert figures["double_effects"] == 0, [r.double_effects for r in rounds]
    assert figures["lost_approvals"] == 0, [r.lost_approvals for r in rounds]
    assert figures["burned_approvals"] == 0, [r.burned for r in rounds]
    assert figures["answers_500"] == 0, [dict(r.answers) for r in rounds]
    assert set(figures["endings"]) == {"confirmed"}, figures
    assert figures["audit_verify_failures"] == 0, figures
