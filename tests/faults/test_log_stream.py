"""The log stream names each audit line unambiguously across restarts: opgate run twice with
the same instance id on one database (each run numbers its records from 1 again), every line
carries the run that numbered it, and (run, number) never repeats; a forwarded read's record
keeps the provider's status."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import AGENT_TOKEN, process_env
from tests.support.opgate_process import opgate_process

READS_PER_RUN = 3


async def _one_run(
    env: dict[str, str], http: aiohttp.ClientSession
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Start opgate, make READS_PER_RUN forwarded reads, stop it: its audit lines (the lines
    that carry a record number) and all of its lines."""
    async with opgate_process(env) as gate:
        for _ in range(READS_PER_RUN):
            async with http.get(
                f"{gate.agent_url}/fault/v1/refunds",
                headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
            ) as answer:
                assert answer.status == 200, await answer.text()
    numbered = [line for line in gate.lines if line.get("instance_seq") is not None]
    return numbered, gate.lines


async def test_restarted_runs_number_their_lines_apart_and_reads_keep_the_status(
    database_url: str, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """Two runs of one instance id: every line from the start names its run, no (run, number)
    pair repeats, and each read's record says the provider answered 200, in the log and in
    the database."""
    env = process_env(
        database_url, policies, {"fault": fault_provider.url}, OPGATE_INSTANCE_ID="gw-restart"
    )
    first, first_lines = await _one_run(env, http)
    second, second_lines = await _one_run(env, http)
    assert {line["instance_seq"] for line in first} & {line["instance_seq"] for line in second}
    for lines in (first_lines, second_lines):
        started = next(i for i, line in enumerate(lines) if line["event"] == "opgate_started")
        for line in lines[started:]:  # from the start of its audit writer on
            assert line.get("run_id"), line
    pairs = Counter((line["run_id"], line["instance_seq"]) for line in first + second)
    assert [pair for pair, seen in pairs.items() if seen > 1] == []
    assert len({line["run_id"] for line in first} | {line["run_id"] for line in second}) == 2
    reads = [line for line in first + second if line.get("path") == "/fault/v1/refunds"]
    assert len(reads) == 2 * READS_PER_RUN
    assert [line.get("provider_status") for line in reads] == [200] * len(reads)
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetch(
            "SELECT record->>'provider_status' AS status FROM audit_log"
            " WHERE record->>'path' = '/fault/v1/refunds'"
        )
    finally:
        await conn.close()
    assert [row["status"] for row in stored] == ["200"] * len(reads)
