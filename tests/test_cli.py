"""The ``opgate`` command line, run as a user runs it: in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.cli import free_port, run_cli, wait_ready
from tests.support.opgate import SHIPPED_POLICIES
from tests.support.paths import REPO


def test_policy_check_accepts_the_shipped_policies() -> None:
    """The shipped policy directory passes the offline check."""
    result = run_cli("policy", "check", str(SHIPPED_POLICIES))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: 4 providers")


def test_policy_check_reports_every_problem_with_its_location(tmp_path: Path) -> None:
    """A broken policy exits non-zero and names file:line:col for each problem."""
    (tmp_path / "bad.yaml").write_text(
        "version: 1\nprovider: x\nroute_prefix: /x\nupstream: http://127.0.0.1:1\n"
        "rules:\n  - name: a\n    method: POST\n    path: /v1/a\n    operation: none\n"
        "  - name: b\n    method: FETCH\n    path: /v1/b\n    colour: red\n"
    )
    result = run_cli("policy", "check", str(tmp_path))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{tmp_path / 'bad.yaml'}:6:5: rules.0:")
    assert "must require an operation" in lines[0]
    assert any(":11:13: rules.1.method" in line for line in lines)
    assert any(":13:5: rules.1.colour: Extra inputs are not permitted" in line for line in lines)


def test_token_prints_a_token_and_its_digest() -> None:
    """`opgate token` gives a token to hand out and the digest to configure."""
    import hashlib

    result = run_cli("token")
    token = result.stdout.split("token:")[1].split()[0]
    digest = result.stdout.split("token_sha256:")[1].split()[0]
    assert token.startswith("opg_")
    assert hashlib.sha256(token.encode()).hexdigest() == digest


@pytest.fixture
def open_data_dir() -> Iterator[Path]:
    """A data directory whose parents the embedded server's user may traverse (pytest's own
    tmp_path is 0700, which would make opgate relocate the cluster outside the test's reach)."""
    parent = Path(tempfile.mkdtemp(prefix="opgate-cli-"))
    parent.chmod(0o755)
    try:
        yield parent / "data"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


async def test_serve_dev_starts_on_the_embedded_database_and_stops_cleanly(
    open_data_dir: Path,
) -> None:
    """The quick start: `opgate serve --dev` with no database URL runs an embedded PostgreSQL,
    accepts an approval with its generated admin token, and exits 0 on SIGTERM."""
    data_dir = open_data_dir
    agent_port, ops_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPGATE_")}
    env["OPGATE_FORWARD_LISTEN"] = f"127.0.0.1:{free_port()}"  # never the default 3128
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--dev",
        "--data-dir",
        str(data_dir),
        "--agent-listen",
        f"127.0.0.1:{agent_port}",
        "--ops-listen",
        f"127.0.0.1:{ops_port}",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        banner = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
        assert "opgate dev mode" in banner
        creds = json.loads((data_dir / "dev-credentials.json").read_text())
        assert (data_dir / "dev-credentials.json").stat().st_mode & 0o077 == 0
        async with aiohttp.ClientSession(trust_env=False) as http:
            ready = await wait_ready(http, f"http://127.0.0.1:{ops_port}/readyz")
            assert ready["status"] == "ready"
            async with http.post(
                f"http://127.0.0.1:{ops_port}/v1/operations",
                headers={"Authorization": f"Bearer {creds['admin_token']}"},
                json={
                    "tenant": "demo",
                    "provider": "stripe",
                    "action": "refund.create",
                    "amount": 100,
                    "params": {"charge": "ch_1"},
                    "approval_ref": "t",
                    "approved_by": "me",
                    "ttl_seconds": 60,
                },
            ) as response:
                assert response.status == 201, await response.text()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
    assert code == 0


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_one_line_naming_the_address_and_the_setting(
    database_url: str, workers: str
) -> None:
    """`opgate serve` on a port another process holds ends with exit 2 and one line naming
    the address and the setting, not a traceback (in-process and with workers)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        env = {
            **os.environ,
            "OPGATE_DATABASE_URL": database_url,
            "OPGATE_POLICY_DIR": str(SHIPPED_POLICIES),
            "OPGATE_AGENT_LISTEN": f"127.0.0.1:{port}",
            "OPGATE_OPS_LISTEN": "127.0.0.1:0",
            "OPGATE_FORWARD_LISTEN": "",
            "OPGATE_WORKERS": workers,
        }
        result = run_cli("serve", env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"opgate: cannot listen on 127.0.0.1:{port} (agent_listen): address already in use"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "command", [[], ["serve"], ["ops"], ["audit"], ["policy"], ["token"], ["migrate"]]
)
def test_help_is_plain_text(command: list[str]) -> None:
    """`--help` reads as plain text in a terminal: no reStructuredText markup."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", *command, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "``" not in done.stdout
    assert ":class:" not in done.stdout


@pytest.mark.parametrize("command", [["serve"], ["migrate"]])
def test_a_setting_that_is_not_json_is_one_line_naming_its_variable(command: list[str]) -> None:
    """A malformed JSON setting in the environment ends with exit 2 and one line naming the
    variable, not a pydantic-settings traceback."""
    result = run_cli(*command, env={"OPGATE_UPSTREAM_OVERRIDES": "{bad"})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "opgate: setting upstream_overrides (OPGATE_UPSTREAM_OVERRIDES): not valid JSON"
    ]


def test_version_prints_the_installed_version() -> None:
    """`opgate --version` prints the distribution's version and exits 0."""
    from importlib.metadata import version

    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"opgate {version('opgate')}"
