"""opgate as a real process (``python -m proxy serve``) on loopback port 0, for tests that need
several processes against one database. Its stdout (JSON log lines) is drained continuously
into ``lines`` (a full pipe would stall the server) and searched for the bound addresses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

_START_TIMEOUT_SECONDS = 30.0
_STOP_TIMEOUT_SECONDS = 30.0


@dataclass
class OpgateProcess:
    process: asyncio.subprocess.Process
    lines: list[dict[str, Any]] = field(default_factory=list)
    agent_url: str = ""
    ops_url: str = ""


async def _drain(gate: OpgateProcess, started: asyncio.Event) -> None:
    assert gate.process.stdout is not None
    async for raw in gate.process.stdout:
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        gate.lines.append(line)
        if line.get("event") == "opgate_started":
            gate.agent_url, gate.ops_url = line["agent_url"], line["ops_url"]
            started.set()


@contextlib.asynccontextmanager
async def opgate_process(
    environment: dict[str, str], flags: Sequence[str] = ()
) -> AsyncIterator[OpgateProcess]:
    """``opgate serve`` with ``environment`` (OPGATE_* settings) on top of this one's, and
    ``flags`` after ``serve``; stopped with SIGTERM (a clean shutdown: audit records flushed, a
    last checkpoint) at the end."""
    env = {
        **os.environ,
        "OPGATE_AGENT_LISTEN": "127.0.0.1:0",
        "OPGATE_OPS_LISTEN": "127.0.0.1:0",
        "OPGATE_FORWARD_LISTEN": "",
        "OPGATE_WORKERS": "1",
        **environment,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", *flags, env=env, stdout=asyncio.subprocess.PIPE
    )
    gate = OpgateProcess(process)
    started = asyncio.Event()
    drain = asyncio.create_task(_drain(gate, started))
    try:
        waiter = asyncio.create_task(started.wait())
        done, _ = await asyncio.wait(
            {waiter, asyncio.create_task(process.wait())},
            timeout=_START_TIMEOUT_SECONDS,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if waiter not in done:
            raise RuntimeError(f"opgate did not start (exit {process.returncode}): {gate.lines}")
        yield gate
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), _STOP_TIMEOUT_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()
        await drain
