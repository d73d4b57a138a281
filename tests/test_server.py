"""``opgate serve`` as a process (proxy/server.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import fault_policy, process_env
from tests.support.opgate_process import opgate_process


async def test_what_started_is_kept_out_of_later_collections(
    database_url: str, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """Once serving, the objects made to start are frozen: later garbage collections do not
    walk them (a full collection walked ~130,000 of them, ~80 ms on this kind of machine)."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    environment = process_env(database_url, policy_dir, {"fault": fault_provider.url})
    async with opgate_process(environment) as gate:
        pass
    frozen = [line for line in gate.lines if line.get("event") == "opgate_startup_frozen"]
    assert len(frozen) == 1
    assert frozen[0]["objects"] > 10_000
    started = next(i for i, line in enumerate(gate.lines) if line.get("event") == "opgate_started")
    assert gate.lines.index(frozen[0]) > started  # after everything it starts with was made
