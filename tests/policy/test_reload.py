"""Policy hot reload (proxy/policy/reload.py): under load, on file change and on SIGHUP, a new
valid set replaces the old one whole; an invalid one never takes effect."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from structlog.testing import capture_logs

from proxy.gate.identity import token_digest
from proxy.policy.load import load_policy_dir, policy_version
from tests.support.cli import free_port, wait_ready
from tests.support.environment import inherited
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import ADMIN_TOKEN, StartOpgate, admin_headers, fault_policy, problem
from tests.support.paths import REPO
from tests.support.polling import until

POLICY_A = fault_policy(deduplicates=False)  # has the `read` rule
POLICY_B = POLICY_A.split("  - name: read")[0]  # the same without it: reads are refused
POLICY_C = POLICY_B + "    colour: red\n"  # an unknown key: invalid


def write_atomically(path: Path, text: str) -> None:
    """As a deployment tool writes a file: the new content appears whole (rename)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


async def test_reload_under_load_swaps_whole_sets_and_refuses_an_invalid_one(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """While refunds and reads flow, A -> B (valid) -> C (invalid): no refund fails, every
    request is decided by A or B and consistently with the set its audit record names, and C
    is refused with its errors and never decides anything."""
    policy_file = policy_dir / "fault.yaml"
    policy_file.write_text(POLICY_A)
    version_a = load_policy_dir(policy_dir).version
    stop = asyncio.Event()
    refunds: list[int] = []
    reads: list[tuple[int, str | None]] = []

    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, policy_reload_interval_seconds=0.02
    ) as gate:

        async def refund_worker() -> None:
            while not stop.is_set():
                op = await gate.approve()
                status, _, _ = await gate.send(
                    "/fault/v1/refunds",
                    data="amount=500&currency=usd&charge=ch_1",
                    headers={"X-Operation-Id": op["operation_id"]},
                )
                refunds.append(status)

        async def read_worker() -> None:
            while not stop.is_set():
                status, _, body = await gate.send("/fault/v1/refunds", method="GET")
                reads.append((status, None if status == 200 else problem(body)["code"]))

        async def traffic_after(step: Callable[[], Awaitable[None]]) -> None:
            before = len(refunds) + len(reads)
            await step()
            await until(
                lambda: len(refunds) + len(reads) >= before + 40, "40 more requests", seconds=10
            )

        reloader = gate.running.reloader
        assert reloader is not None
        with capture_logs() as logs:
            workers = [asyncio.create_task(refund_worker()) for _ in range(3)] + [
                asyncio.create_task(read_worker()) for _ in range(3)
            ]

            async def nothing() -> None:
                return None

            async def to_b() -> None:
                write_atomically(policy_file, POLICY_B)
                await until(
                    lambda: gate.running.gateway.policy.version != version_a,
                    "B is loaded",
                    seconds=10,
                )

            async def to_c() -> None:
                write_atomically(policy_file, POLICY_C)
                await until(lambda: len(reloader.refused) == 1, "C is refused", seconds=10)

            await traffic_after(nothing)
            await traffic_after(to_b)
            version_b = gate.running.gateway.policy.version
            await traffic_after(to_c)
            stop.set()
            await asyncio.gather(*workers)

    assert version_b == policy_version([(policy_file, POLICY_B)])
    version_c = policy_version([(policy_file, POLICY_C)])
    assert set(refunds) == {200}
    assert {code for _, code in reads} == {None, "no_matching_rule"}
    records = [e for e in logs if e["event"] == "request"]
    assert {r["policy_version"] for r in records} == {version_a, version_b}
    for record in records:
        if record["method"] == "GET":  # decided by the set the record names, and only by it
            under_a = record["policy_version"] == version_a
            expected = ("allow", None) if under_a else ("deny", "no_matching_rule")
            assert (record["decision"], record["reason"]) == expected
        else:
            assert record["decision"] == "allow"
    [refused] = reloader.refused
    assert refused.version == version_c
    assert any("rules.1.colour: Extra inputs are not permitted" in p for p in refused.problems)
    [reloaded] = [e for e in logs if e["event"] == "policy_reloaded"]
    assert (reloaded["old_policy_version"], reloaded["policy_version"]) == (version_a, version_b)
    [refusal] = [e for e in logs if e["event"] == "policy_reload_refused"]
    assert refusal["policy_version"] == version_b
    assert refusal["candidate_policy_version"] == version_c


async def test_a_set_with_lint_errors_is_refused_and_a_repeat_is_not_reloaded(
    start_opgate: StartOpgate, policy_dir: Path
) -> None:
    """A set that loads but has a shadowed rule is refused like a broken one; asking again
    for an unchanged set does nothing."""
    (policy_dir / "fault.yaml").write_text(POLICY_A)
    async with start_opgate(policy_reload_interval_seconds=0) as gate:
        reloader = gate.running.reloader
        assert reloader is not None
        same = await reloader.reload("test")
        assert (same.reloaded, same.problems) == (False, [])
        shadowing = POLICY_A.replace(
            "rules:\n",
            "rules:\n  - {name: all, method: GET, path: "
            "'/v1/{x...}', operation: none, body: none}\n",
        )
        (policy_dir / "fault.yaml").write_text(shadowing)
        outcome = await reloader.reload("test")
        assert outcome.reloaded is False
        assert any("rule 'read' can never match" in p for p in outcome.problems)
        assert gate.running.gateway.policy.version == load_policy_dir_version(POLICY_A, policy_dir)


async def test_reloads_and_refusals_are_audit_records_and_name_the_deciding_set(
    start_opgate: StartOpgate, policy_dir: Path, database_url: str
) -> None:
    """A reload and a refused reload each leave a record in the PostgreSQL audit log, and the
    instance's current policy version (what transition records name) follows the reload."""
    import asyncpg

    (policy_dir / "fault.yaml").write_text(POLICY_A)
    async with start_opgate(policy_reload_interval_seconds=0) as gate:
        reloader = gate.running.reloader
        assert reloader is not None
        (policy_dir / "fault.yaml").write_text(POLICY_B)
        assert (await reloader.reload("test")).reloaded
        (policy_dir / "fault.yaml").write_text(POLICY_C)
        assert not (await reloader.reload("test")).reloaded
        instance = gate.running.gateway.settings.instance_id
        async with gate.http.get(f"{gate.ops_url}/metrics") as response:
            metrics = await response.text()
    # the metrics say which set decides, and that a reload was refused
    assert "opgate_policy_reload_failures_total 1" in metrics.splitlines()
    version_now = load_policy_dir_version(POLICY_B, policy_dir)
    assert f'opgate_policy_info{{policy_version="{version_now}"}} 1' in metrics.splitlines()
    conn = await asyncpg.connect(database_url)
    try:
        events = [
            json.loads(r["record"])
            for r in await conn.fetch(
                "SELECT record FROM audit_log WHERE stream = 'policy' ORDER BY seq"
            )
        ]
        deciding = await conn.fetchval(
            "SELECT policy_version FROM audit_instances WHERE instance_id = $1", instance
        )
    finally:
        await conn.close()
    version_b = load_policy_dir_version(POLICY_B, policy_dir)
    assert [e["event"] for e in events] == [
        "policy_loaded",
        "policy_reloaded",
        "policy_reload_refused",
    ]
    assert events[1]["policy_version"] == version_b
    assert events[2]["errors"]
    assert deciding == version_b


def load_policy_dir_version(text: str, policy_dir: Path) -> str:
    return policy_version([(policy_dir / "fault.yaml", text)])


async def test_sighup_reloads_a_running_opgate_serve(database_url: str, tmp_path: Path) -> None:
    """`opgate serve` reloads on SIGHUP (file polling off): a valid change is served, an invalid
    one is refused and logged with its errors while the valid set keeps serving."""
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    (policy_dir / "fault.yaml").write_text(POLICY_A)
    ops_port = free_port()
    env = inherited()
    env |= {
        "OPGATE_DATABASE_URL": database_url,
        "OPGATE_POLICY_DIR": str(policy_dir),
        "OPGATE_AGENT_LISTEN": f"127.0.0.1:{free_port()}",
        "OPGATE_OPS_LISTEN": f"127.0.0.1:{ops_port}",
        "OPGATE_FORWARD_LISTEN": "",  # never the default 3128: a `./dev serve` may hold it
        "OPGATE_ADMIN_TOKEN_SHA256": token_digest(ADMIN_TOKEN),
        "OPGATE_POLICY_RELOAD_INTERVAL_SECONDS": "0",
        "OPGATE_WORKERS": "1",
    }
    stderr = tmp_path / "opgate.stderr"
    with stderr.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", cwd=REPO, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=errors,
        )  # fmt: skip
    ready = f"http://127.0.0.1:{ops_port}/readyz"
    try:
        async with aiohttp.ClientSession(trust_env=False) as http:
            first = (await wait_ready(http, ready))["policy_version"]
            (policy_dir / "fault.yaml").write_text(POLICY_B)
            process.send_signal(signal.SIGHUP)
            reloaded = await next_log(process, "policy_reloaded")
            assert reloaded["old_policy_version"] == first
            assert (await wait_ready(http, ready))["policy_version"] == reloaded["policy_version"]
            (policy_dir / "fault.yaml").write_text(POLICY_C)
            process.send_signal(signal.SIGHUP)
            refused = await next_log(process, "policy_reload_refused")
            assert any("colour" in error for error in refused["errors"])
            served = (await wait_ready(http, ready))["policy_version"]
            assert served == reloaded["policy_version"]
            async with http.get(
                f"http://127.0.0.1:{ops_port}/v1/operations/op_none", headers=admin_headers()
            ) as response:
                assert response.status == 404  # still serving
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
        assert code == 0, stderr.read_text(errors="replace")[-4000:]


async def next_log(process: asyncio.subprocess.Process, event: str) -> dict[str, Any]:
    """The next JSON log line with this event (bounded: the process answers within seconds)."""
    assert process.stdout is not None

    async def read() -> dict[str, Any]:
        assert process.stdout is not None
        while line := await process.stdout.readline():
            try:
                entry: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == event:
                return entry
        raise AssertionError(f"opgate exited before logging {event}")

    return await asyncio.wait_for(read(), 30)
