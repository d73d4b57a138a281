"""Running the ``opgate`` command as a user would, and waiting for the server it starts."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import aiohttp

from tests.support.paths import REPO


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_ready(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    """Poll readiness, bounded: start-up includes initdb of the embedded PostgreSQL."""
    for _ in range(600):
        try:
            async with http.get(url) as response:
                if response.status == 200:
                    body: dict[str, str] = await response.json()
                    return body
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)  # polling a readiness probe, not synchronising on a guess
    raise AssertionError("opgate did not become ready within 60 s")
