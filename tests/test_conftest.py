"""The suite's own harness (tests/conftest.py): a run stopped by SIGTERM still stops what it
started."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

REPO = Path(__file__).resolve().parents[1]

WAITING_TEST = """
import asyncio
from pathlib import Path


async def test_waits(database_url: str) -> None:
    Path({marker!r}).write_text(database_url)
    await asyncio.sleep(3600)
"""


async def test_a_run_stopped_by_sigterm_stops_its_embedded_postgresql(tmp_path: Path) -> None:
    """A pytest run on the embedded PostgreSQL, sent SIGTERM while a test waits, unwinds as on
    Ctrl-C: the server it started is stopped and its directory removed (the signal's default
    action left the server running, with nobody to stop it)."""
    marker = tmp_path / "dsn"
    waiting = tmp_path / "test_waits.py"
    waiting.write_text(WAITING_TEST.format(marker=str(marker)))
    env = {k: v for k, v in os.environ.items() if k != "OPGATE_TEST_DATABASE_URL"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), str(waiting),
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    workdir: Path | None = None
    try:
        for _ in range(1200):  # initdb included; a file the child writes, polled with a bound
            if marker.exists() and marker.read_text():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the waiting test never started")
        socket_dir = parse_qs(urlsplit(marker.read_text()).query)["host"][0]
        workdir = Path(socket_dir).parent
        assert (workdir / "pg" / "postmaster.pid").exists()  # the server is running

        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
        assert b"KeyboardInterrupt" in output
        assert not workdir.exists()  # stopped, then its directory removed
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if workdir is not None and (workdir / "pg" / "postmaster.pid").exists():
            pid = int((workdir / "pg" / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGTERM)  # left running: stop it, then fail as above
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
