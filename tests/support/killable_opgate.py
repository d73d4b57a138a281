"""opgate as a real process (``python -m proxy serve``) that a test can SIGKILL and restart,
like a crashed host. Output goes to a log file the test names (shown when start-up fails)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.support.environment import inherited
from tests.support.paths import REPO


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class KillableOpgate:
    process: asyncio.subprocess.Process
    agent_url: str
    ops_url: str

    async def kill(self) -> None:
        """SIGKILL: no cleanup, no outcome recording, exactly like a crashed host."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> int:
        """SIGTERM and wait; a process that does not stop in time is killed (and reported)."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            await self.kill()
            raise AssertionError("opgate did not stop within 30 s of SIGTERM") from None


async def spawn_opgate(
    env: dict[str, str], log_path: Path, module: str = "proxy"
) -> KillableOpgate:
    """Start opgate with ``env`` (OPGATE_* settings) and wait until it is ready. ``module``:
    what ``python -m`` runs (a test-support entry point that adds a fault point, e.g.
    tests/support/opgate_killed_before_paid_send.py)."""
    agent_port, ops_port = free_port(), free_port()
    full_env = inherited()
    full_env.update(env)
    full_env["OPGATE_AGENT_LISTEN"] = f"127.0.0.1:{agent_port}"
    full_env["OPGATE_OPS_LISTEN"] = f"127.0.0.1:{ops_port}"
    full_env.setdefault("OPGATE_FORWARD_LISTEN", "")
    full_env.setdefault("OPGATE_WORKERS", "1")
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            "serve",
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=log,
        )
    running = KillableOpgate(
        process, f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{ops_port}"
    )
    try:
        await _wait_ready(running, log_path)
    except BaseException:
        await running.kill()
        raise
    return running


async def _wait_ready(running: KillableOpgate, log_path: Path) -> None:
    async with aiohttp.ClientSession(trust_env=False) as http:
        for _ in range(300):
            if running.process.returncode is not None:
                log = await asyncio.to_thread(log_path.read_text)
                raise AssertionError(f"opgate exited: {log[-2000:]}")
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(f"{running.ops_url}/readyz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.05)  # polling a readiness probe, bounded
    raise AssertionError("opgate did not become ready in 15 s")
