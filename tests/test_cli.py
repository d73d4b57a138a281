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

from proxy.transparency import note
from tests.support.cli import free_port, run_cli, wait_ready
from tests.support.environment import inherited
from tests.support.opgate import SHIPPED_POLICIES
from tests.support.opgate_process import opgate_process
from tests.support.paths import REPO


def test_policy_check_accepts_the_shipped_policies() -> None:
    """The shipped policy directory passes the offline check."""
    result = run_cli("policy", "check", str(SHIPPED_POLICIES))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("ok: 6 providers")


def test_policy_check_reports_every_problem_with_its_location(tmp_path: Path) -> None:
    """A broken policy exits non-zero and names file:line:col for each problem."""
    (tmp_path / "bad.yaml").write_text(
        "version: 1\nprovider: x\nroute_prefix: /x\nupstream: http://127.0.0.1:1\n"
        "rules:\n  - name: a\n    method: POST\n    path: /v1/a\n    operation: none\n"
        "  - name: b\n    method: FETCH\n    path: /v1/b\n    colour: red\n"
    )
    result = run_cli("policy", "check", str(tmp_path))
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()[:-1]  # the summary last
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
    env = inherited()
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


UNREACHABLE_DATABASE = "postgresql://opgate@127.0.0.1:1/opgate"  # valid settings stop here


def settings_env(**variables: str) -> dict[str, str]:
    """This environment without any OPGATE_* setting, plus ``variables``: a database nothing
    listens on, so a command whose settings are valid ends at once with its own line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPGATE_")}
    # forward mode off: it would make its CA in the repository's .opgate
    defaults = {"OPGATE_DATABASE_URL": UNREACHABLE_DATABASE, "OPGATE_FORWARD_LISTEN": "null"}
    return {**defaults, **env, **variables}


def run_clean(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
        check=False,
    )


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "opgate.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("scenario", "variables", "flags", "expected"),
    [
        (
            "an override that is not a URL",
            {"OPGATE_UPSTREAM_OVERRIDES": '{"stripe": "not a url"}'},
            [],
            "opgate: setting upstream_overrides.stripe (OPGATE_UPSTREAM_OVERRIDES): "
            "'not a url' is not an http(s) base URL (http://HOST[:PORT][/PATH])",
        ),
        (
            "overrides that are not an object",
            {"OPGATE_UPSTREAM_OVERRIDES": '["http://127.0.0.1:8420"]'},
            [],
            "opgate: setting upstream_overrides (OPGATE_UPSTREAM_OVERRIDES): should be an object",
        ),
        (
            "an override that is not a string",
            {"OPGATE_UPSTREAM_OVERRIDES": '{"stripe": 8420}'},
            [],
            "opgate: setting upstream_overrides.stripe (OPGATE_UPSTREAM_OVERRIDES): "
            "should be a string",
        ),
        (
            "a listener flag that is not HOST:PORT",
            {},
            ["--agent-listen", "8080"],
            "opgate: setting agent_listen (--agent-listen): '8080' is not HOST:PORT",
        ),
        (
            "a log level that is none",
            {"OPGATE_LOG_LEVEL": "loud"},
            [],
            "opgate: setting log_level (OPGATE_LOG_LEVEL): 'loud' is not a level "
            "(debug, info, warning, error, critical)",
        ),
        (
            "a webhook that is not a URL",
            {"OPGATE_ESCALATION_WEBHOOK_URL": "hooks.example/opgate"},
            [],
            "opgate: setting escalation_webhook_url (OPGATE_ESCALATION_WEBHOOK_URL): "
            "'hooks.example/opgate' is not an http(s) URL",
        ),
        (
            "an upstream CA file that is not there",
            {"OPGATE_UPSTREAM_CA_FILE": "/nonexistent/ca.pem"},
            [],
            "opgate: setting upstream_ca_file (OPGATE_UPSTREAM_CA_FILE): "
            "/nonexistent/ca.pem: no such file",
        ),
        (
            "a CA directory that cannot be made",
            {"OPGATE_CA_DIR": "/proc/opgate-ca", "OPGATE_FORWARD_LISTEN": "127.0.0.1:0"},
            [],
            "opgate: setting ca_dir (OPGATE_CA_DIR): cannot make the forward proxy's CA in "
            "/proc/opgate-ca: No such file or directory",
        ),
        (
            "a number that is not one",
            {"OPGATE_POOL_MAX_SIZE": "ten"},
            [],
            "opgate: setting pool_max_size (OPGATE_POOL_MAX_SIZE): should be a valid integer, "
            "unable to parse string as an integer",
        ),
    ],
)
def test_an_invalid_setting_is_one_line_naming_it_and_where_it_was_given(
    scenario: str, variables: dict[str, str], flags: list[str], expected: str
) -> None:
    """A setting that does not fit its type or shape ends `opgate serve` with exit 2 and one
    line naming the setting, where it was given (variable or flag) and what is wrong."""
    result = run_clean("serve", *flags, env=settings_env(**variables))
    assert result.returncode == 2, scenario
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [expected], scenario


@pytest.mark.parametrize(
    ("scenario", "text", "expected"),
    [
        (
            "YAML that does not parse",
            "agent_listen: [127.0.0.1:8080\n",
            "opgate: config file {path}: not valid YAML (line 2, column 1: expected ',' or ']', "
            "but got '<stream end>')",
        ),
        (
            "a list, not a mapping",
            "- agent_listen\n",
            "opgate: config file {path}: should be a mapping of settings (name: value)",
        ),
        (
            "a name that is no setting",
            "agent_lisen: 127.0.0.1:8080\n",
            "opgate: setting agent_lisen (in {path}): not a setting "
            "(docs/reference/settings.md has all)",
        ),
        (
            "a value that does not fit",
            "ops_listen: localhost\n",
            "opgate: setting ops_listen (in {path}): 'localhost' is not HOST:PORT",
        ),
    ],
)
def test_an_invalid_config_file_is_one_line_naming_the_file(
    tmp_path: Path, scenario: str, text: str, expected: str
) -> None:
    """A config file that does not parse, is not a mapping or holds a wrong setting ends
    `opgate serve` with exit 2 and one line naming the file, not a traceback."""
    path = config_file(tmp_path, text)
    result = run_clean("serve", env=settings_env(OPGATE_CONFIG=path))
    assert result.returncode == 2, scenario
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [expected.format(path=path)], scenario


def test_a_missing_config_file_is_one_line_not_silently_ignored(tmp_path: Path) -> None:
    """`OPGATE_CONFIG` naming no file is refused (exit 2, one line), not started without it."""
    path = str(tmp_path / "absent.yaml")
    result = run_clean("serve", env=settings_env(OPGATE_CONFIG=path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"opgate: config file {path} (OPGATE_CONFIG): no such file"
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["ca", "init"],
        ["audit", "verify"],
        ["audit", "show", "op_1"],
        ["migrate"],
    ],
)
def test_every_command_that_reads_settings_refuses_them_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """Not only `serve`: each command that reads the settings ends an invalid one with exit 2
    and one line, not a traceback."""
    env = settings_env(OPGATE_OPS_LISTEN="nowhere", OPGATE_DATA_DIR=str(tmp_path))
    result = run_clean(*command, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "opgate: setting ops_listen (OPGATE_OPS_LISTEN): 'nowhere' is not HOST:PORT"
    ]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["serve", "--workers", "many"],
            "opgate serve: argument --workers: invalid int value: 'many' "
            "(opgate serve --help lists the flags)",
        ),
        (
            ["serve", "--agent-port", "8080"],
            "opgate serve: unrecognized arguments: --agent-port 8080 "
            "(opgate serve --help lists the flags)",
        ),
        (
            ["serve", "--agent-listen"],
            "opgate serve: argument --agent-listen: expected one argument "
            "(opgate serve --help lists the flags)",
        ),
    ],
)
def test_a_wrong_flag_is_one_line_pointing_at_help(args: list[str], expected: str) -> None:
    """A flag opgate does not know, or a value of the wrong type, is one line (not the whole
    usage) that says what is wrong and where the flags are listed; exit 2."""
    result = run_clean(*args, env=settings_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [expected]


def test_serve_has_a_flag_for_every_listener() -> None:
    """`serve --help` lists a flag for each listener opgate opens: agent, operations, forward."""
    result = run_clean("serve", "--help", env=settings_env())
    assert result.returncode == 0
    for flag in ("--agent-listen", "--ops-listen", "--forward-listen"):
        assert flag in result.stdout, flag


def test_the_forward_listener_flag_names_its_setting_when_its_port_is_taken(
    database_url: str, tmp_path: Path
) -> None:
    """`--forward-listen HOST:PORT` is the forward listener's address: a held port is refused
    in one line naming forward_listen (so a second instance can pick another)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        env = settings_env(
            OPGATE_DATABASE_URL=database_url,
            OPGATE_POLICY_DIR=str(SHIPPED_POLICIES),
            OPGATE_WORKERS="1",
            OPGATE_DATA_DIR=str(tmp_path),  # the forward proxy's CA, made before it listens
        )
        result = run_clean(
            "serve",
            "--agent-listen",
            "127.0.0.1:0",
            "--ops-listen",
            "127.0.0.1:0",
            "--forward-listen",
            f"127.0.0.1:{port}",
            env=env,
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"opgate: cannot listen on 127.0.0.1:{port} (forward_listen): address already in use"
    )


async def test_a_start_without_tokens_or_secrets_warns_once_for_each(database_url: str) -> None:
    """`opgate serve` with no admin token, no agents and no provider secrets starts (with the
    forward listener off by `--forward-listen null`), and says so: one warning line each."""
    env = {
        **settings_env(OPGATE_DATABASE_URL=database_url, OPGATE_POLICY_DIR=str(SHIPPED_POLICIES)),
        "OPGATE_SECRET_STRIPE_API_KEY": "sk_test_given",  # stripe has its secret
    }
    async with opgate_process(env, ["--forward-listen", "null"]) as gate:
        warnings = [line for line in gate.lines if line.get("level") == "warning"]
        assert gate.ops_url
    # the database's own warnings (one host, no synchronous standby) are not this test's
    mine = {"no_admin_token", "no_agents", "provider_secret_missing"}
    events = sorted((w["event"], w.get("provider", "")) for w in warnings if w["event"] in mine)
    assert events == [
        ("no_admin_token", ""),
        ("no_agents", ""),
        ("provider_secret_missing", "adyen"),
        ("provider_secret_missing", "github"),
        ("provider_secret_missing", "paypal"),
        ("provider_secret_missing", "square"),
        ("provider_secret_missing", "twilio"),
    ]
    paypal = next(w for w in warnings if w.get("provider") == "paypal")
    assert paypal["secrets"] == ["paypal_client_id", "paypal_client_secret"]
    started = next(line for line in gate.lines if line.get("event") == "opgate_started")
    assert started["forward_url"] is None


async def test_ops_under_dev_reads_the_dev_credentials(
    database_url: str, open_data_dir: Path
) -> None:
    """`opgate ops --dev` talks to an `opgate serve --dev` with the admin token that serve
    generated, read from <data_dir>/dev-credentials.json: no token to copy by hand."""
    env = settings_env(OPGATE_DATABASE_URL=database_url, OPGATE_POLICY_DIR=str(SHIPPED_POLICIES))
    flags = ["--dev", "--data-dir", str(open_data_dir), "--forward-listen", "null"]
    async with opgate_process(env, flags) as gate:
        result = await asyncio.to_thread(
            run_clean,
            "ops",
            "--dev",
            "--data-dir",
            str(open_data_dir),
            "--url",
            gate.ops_url,
            "list",
            "--json",
            env=settings_env(),
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"operations": []}


def test_ops_under_dev_without_dev_credentials_says_how_to_get_them(tmp_path: Path) -> None:
    """`opgate ops --dev` where no `serve --dev` ever ran is one line naming the file, exit 2."""
    result = run_clean("ops", "--dev", "--data-dir", str(tmp_path), "list", env=settings_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"opgate ops: no dev credentials in {tmp_path / 'dev-credentials.json'}: "
        "start `opgate serve --dev` first (or give --token)"
    ]


def test_ca_init_on_half_a_ca_is_one_line(tmp_path: Path) -> None:
    """`opgate ca init` where a certificate lies without its key says so in one line, exit 2."""
    (tmp_path / "ca").mkdir()
    (tmp_path / "ca" / "opgate-ca.pem").write_text("")
    result = run_clean("ca", "init", "--data-dir", str(tmp_path), env=settings_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"opgate: {tmp_path / 'ca'} holds half a CA (certificate or key missing)"
    ]


def test_policy_check_prints_its_summary_after_its_findings(tmp_path: Path) -> None:
    """Findings and the summary are one report on one stream, the summary last: shown in
    whatever order a terminal or a tool shows stdout and stderr, it still ends the report."""
    (tmp_path / "bad.yaml").write_text(
        "version: 1\nprovider: x\nroute_prefix: /x\nupstream: http://127.0.0.1:1\n"
        "budgets: [{scope: provider, currency: usd, limit: 1, window: 1h}]\n"
        'rules:\n  - {name: a, method: POST, path: "/v1/{rest...}"}\n'
        "  - {name: b, method: POST, path: /v1/b}\n"
    )
    result = run_cli("policy", "check", str(tmp_path))
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3, result
    assert "rule 'b'" in lines[0] or "rule 'b'" in lines[1], lines
    assert any("warning: provider 'x' has budgets" in line for line in lines[:2]), lines
    assert lines[-1] == "1 errors, 1 warnings"


@pytest.mark.parametrize("command", [["ops", "list"], ["proposals", "list"]])
@pytest.mark.parametrize("where", ["variable", "config file"])
def test_client_commands_call_the_ops_listen_the_server_reads(
    command: list[str], where: str, tmp_path: Path
) -> None:
    """`opgate ops` and `opgate proposals` call the operations API where the settings put it
    (OPGATE_OPS_LISTEN, or the config file), not always at 8081."""
    port = free_port()  # nothing listens there: the line says where the command called
    if where == "variable":
        env = settings_env(OPGATE_OPS_LISTEN=f"127.0.0.1:{port}")
    else:
        env = settings_env(OPGATE_CONFIG=config_file(tmp_path, f"ops_listen: 127.0.0.1:{port}\n"))
    result = run_clean(*command[:1], "--token", "opg_x", *command[1:], env=env)
    assert result.returncode == 1
    assert f"cannot reach http://127.0.0.1:{port}" in result.stderr, result.stderr


def test_a_wildcard_ops_listen_is_called_on_loopback() -> None:
    """A server listening on every address (0.0.0.0, [::]) is called on loopback."""
    port = free_port()
    for listen, url in ((f"0.0.0.0:{port}", "127.0.0.1"), (f"[::]:{port}", "[::1]")):
        env = settings_env(OPGATE_OPS_LISTEN=listen)
        result = run_clean("ops", "--token", "opg_x", "list", env=env)
        assert f"cannot reach http://{url}:{port}" in result.stderr, result.stderr


async def test_dev_evidence_is_one_command_away(database_url: str, open_data_dir: Path) -> None:
    """`opgate serve --dev` on ports of its own prints the audit log's verifier key; then
    `ops --dev`, `proposals --dev` and `audit verify --dev` find its ports, its database and its
    keys under the data directory, with nothing else given."""
    ops_port = free_port()
    env = settings_env(OPGATE_DATABASE_URL=database_url, OPGATE_POLICY_DIR=str(SHIPPED_POLICIES))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--dev",
        "--data-dir",
        str(open_data_dir),
        "--agent-listen",
        f"127.0.0.1:{free_port()}",
        "--ops-listen",
        f"127.0.0.1:{ops_port}",
        "--workers",
        "1",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        banner = [(await asyncio.wait_for(process.stderr.readline(), 60)).decode()]
        banner.append((await asyncio.wait_for(process.stderr.readline(), 60)).decode())
        creds = json.loads((open_data_dir / "dev-credentials.json").read_text())
        vkey = note.Signer.from_skey(creds["transparency_key"]).verifier().vkey()
        assert any(vkey in line for line in banner), banner
        async with aiohttp.ClientSession(trust_env=False) as http:
            await wait_ready(http, f"http://127.0.0.1:{ops_port}/readyz")
        dev = ["--dev", "--data-dir", str(open_data_dir)]
        elsewhere = settings_env()  # another shell: an unreachable database, default ports
        for command in (["ops", *dev, "list", "--json"], ["proposals", *dev, "list", "--json"]):
            result = await asyncio.to_thread(run_clean, *command, env=elsewhere)
            assert result.returncode == 0, (command, result.stderr)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
    assert code == 0
    verified = await asyncio.to_thread(run_clean, "audit", "verify", *dev, env=elsewhere)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "tree: ok" in verified.stdout, verified.stdout
    proved = await asyncio.to_thread(run_clean, "audit", "checkpoint", *dev, env=elsewhere)
    assert proved.returncode == 0, proved.stderr
    assert vkey.split("+")[0] in proved.stdout


@pytest.mark.parametrize(
    ("command", "instead"),
    [
        (["audit", "verify", "--dev", "--data-dir", "{dir}"], "--database-url and --log-key"),
        (["proposals", "--dev", "--data-dir", "{dir}", "list"], "--token"),
    ],
)
def test_dev_commands_without_a_dev_instance_say_how_to_get_one(
    command: list[str], instead: str, tmp_path: Path
) -> None:
    """`--dev` where no `serve --dev` ever ran is one line naming the file, exit 2."""
    given = [word.format(dir=tmp_path) for word in command]
    result = run_clean(*given, env=settings_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"opgate {command[0]}: no dev credentials in {tmp_path / 'dev-credentials.json'}: "
        f"start `opgate serve --dev` first (or give {instead})"
    ]
