"""``opgate audit`` as real processes, for the transparency log's tests: a command run against
the test database, and ``verify-bundle`` run as a reviewer would, with no database and no
OPGATE_* setting in its environment."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

from proxy.cli import main
from tests.support.paths import REPO


def audit_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m proxy audit ARGS`` with this environment (plus ``env``)."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "audit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=120,
        check=False,
    )


def offline_env() -> dict[str, str]:
    """The environment of a reviewer's machine: no OPGATE_* setting, no PostgreSQL variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPGATE_", "PG"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def verify_offline(path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``opgate audit verify-bundle PATH ARGS`` in ``cwd``, offline."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "audit", "verify-bundle", str(path), *args],
        capture_output=True,
        text=True,
        env=offline_env(),
        cwd=cwd,
        timeout=120,
        check=False,
    )


async def audit_in_process(*args: str) -> tuple[int, str, str]:
    """``opgate audit ARGS`` in this process (its own thread and event loop), as the CLI parses
    and runs it: exit code, stdout, stderr. A second faster than a process, where the test is
    about what the command finds rather than how it starts."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(["audit", *args])

    code = await asyncio.to_thread(run)
    return code, out.getvalue(), err.getvalue()
