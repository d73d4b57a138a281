"""deploy/patroni/ kept honest without running Patroni in CI: the cluster files parse, listen on
127.0.0.1 only and turn synchronous_mode on; Patroni's own validator (when installed) finds
nothing but the loopback it warns about; the script is valid bash and says what is missing.
With ``OPGATE_PATRONI=1`` (root, Debian's patroni and etcd-server installed), one failover
run under a real opgate, and its summary checked: at most one refund per operation, no 500.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO

PATRONI = REPO / "deploy" / "patroni"
NODES = [PATRONI / "node1.yml", PATRONI / "node2.yml"]
ETCD = PATRONI / "etcd.yml"
SCRIPT = PATRONI / "failover-run.sh"
DOC = REPO / "docs" / "patroni.md"
ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\blocalhost\b|\[?::\]?(?=:\d)")
# What `patroni --validate-config` says of any cluster on one host: addresses others would
# use may not be loopback; etcd is not running, or the demo cluster is (its ports are taken).
LOOPBACK_COMPLAINT = re.compile(
    r"^(?:restapi|postgresql)\.connect_address 127\.0\.0\.1:\d+ didn't pass validation: "
    r"'must not contain .*'$"
    r"|^(?:restapi|postgresql)\.listen 127\.0\.0\.1:\d+ didn't pass validation: "
    r"'Port \d+ is already in use\.'$"
    r"|^etcd\.hosts\.0 127\.0\.0\.1:\d+ didn't pass validation: "
    r"'127\.0\.0\.1:\d+ is not reachable'$"
)


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text("utf-8"))
    assert isinstance(document, dict), path
    return document


def strings(value: Any) -> list[str]:
    """Every string (keys included) anywhere in a parsed document."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*strings(k), *strings(v)]]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return [value] if isinstance(value, str) else []


def ports(node: dict[str, Any]) -> list[int]:
    return [
        int(node["restapi"]["listen"].rpartition(":")[2]),
        int(node["postgresql"]["listen"].rpartition(":")[2]),
    ]


@pytest.mark.parametrize("path", [*NODES, ETCD], ids=lambda p: p.name)
def test_every_address_in_the_cluster_files_is_loopback(path: Path) -> None:
    """Each address named in a node's or etcd's file (listen, connect, hosts, URLs, pg_hba)
    is 127.0.0.1, and there is at least one."""
    found = [match for text in strings(load(path)) for match in ADDRESS.findall(text)]
    assert found
    assert {ipaddress.ip_address(a) if a[0].isdigit() else a for a in found} == {
        ipaddress.ip_address("127.0.0.1")
    }


def test_synchronous_mode_is_on_in_both_nodes() -> None:
    """Both nodes bootstrap the cluster with synchronous_mode true (a boolean, not the
    string), one synchronous standby and synchronous_commit on: the claim is on the standby
    before a request leaves."""
    for path in NODES:
        dcs = load(path)["bootstrap"]["dcs"]
        assert dcs["synchronous_mode"] is True, path
        assert dcs["synchronous_mode_strict"] is False, path  # docs/patroni.md: when true
        assert dcs["synchronous_node_count"] == 1, path
        assert dcs["postgresql"]["parameters"]["synchronous_commit"] == "on", path


def test_the_nodes_agree_on_the_cluster_and_differ_in_name_and_ports() -> None:
    """Same scope, namespace, etcd and bootstrap; distinct names, REST and PostgreSQL ports,
    none of them etcd's; Patroni's timing rule loop_wait + 2 * retry_timeout <= ttl holds."""
    first, second = (load(path) for path in NODES)
    for key in ("scope", "namespace", "etcd", "bootstrap"):
        assert first[key] == second[key], key
    assert first["name"] != second["name"]
    etcd_ports = {
        int(url.rpartition(":")[2])
        for key in ("listen-client-urls", "listen-peer-urls")
        for url in load(ETCD)[key].split(",")
    }
    all_ports = [*ports(first), *ports(second), *etcd_ports]
    assert len(set(all_ports)) == len(all_ports)
    assert first["etcd"]["hosts"] == [load(ETCD)["listen-client-urls"].removeprefix("http://")]
    dcs = first["bootstrap"]["dcs"]
    assert dcs["loop_wait"] + 2 * dcs["retry_timeout"] <= dcs["ttl"]
    # Patroni 3.0.2 talks to etcd's v2 API: Debian's etcd-server serves no v3 JSON gateway.
    assert load(ETCD)["enable-v2"] is True


def test_the_postgresql_binaries_and_data_are_where_the_script_puts_them() -> None:
    """bin_dir is Debian's PostgreSQL 15; data_dir and pgpass sit under one folder (the
    script rewrites that folder to its temporary one)."""
    for path in NODES:
        postgresql = load(path)["postgresql"]
        assert postgresql["bin_dir"] == "/usr/lib/postgresql/15/bin"
        folder = Path(postgresql["data_dir"]).parent
        assert Path(postgresql["pgpass"]).parent == folder
        assert Path(postgresql["parameters"]["unix_socket_directories"]) == folder


@pytest.mark.skipif(shutil.which("patroni") is None, reason="Patroni is not installed")
@pytest.mark.parametrize("path", NODES, ids=lambda p: p.name)
def test_patroni_finds_nothing_but_loopback_to_complain_of(path: Path) -> None:
    """``patroni --validate-config`` reports only what running on one host makes it say
    (loopback addresses, etcd down or ports taken): no value of the wrong type or form (it
    does not see unknown keys)."""
    result = subprocess.run(
        ["patroni", "--validate-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if line]
    assert [line for line in complaints if not LOOPBACK_COMPLAINT.match(line)] == []


def test_the_script_is_valid_bash() -> None:
    """``bash -n`` parses failover-run.sh, and it is executable."""
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    assert os.access(SCRIPT, os.X_OK)


def test_the_script_says_what_to_install_and_installs_nothing(tmp_path: Path) -> None:
    """With neither Patroni nor etcd on PATH the script exits 3 naming both Debian packages,
    before starting anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "id", "sort", "tr"):  # what the script runs besides builtins
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    bash = shutil.which("bash")
    assert bash is not None
    result = subprocess.run(
        [bash, str(SCRIPT)],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir)},
        timeout=30,
        check=False,
    )
    assert result.returncode == 3, result.stderr
    assert "apt-get install" in result.stderr
    assert {"patroni", "etcd-server"} <= set(result.stderr.split("install:")[1].split())


def test_the_doc_names_the_files_and_the_settings() -> None:
    """docs/patroni.md names the script and each setting the cluster files set for opgate."""
    text = DOC.read_text("utf-8")
    assert "deploy/patroni/failover-run.sh" in text
    for setting in (
        "synchronous_mode",
        "synchronous_mode_strict",
        "maximum_lag_on_failover",
        "loop_wait",
        "ttl",
        "target_session_attrs=read-write",
    ):
        assert setting in text, setting


@pytest.mark.skipif(
    os.environ.get("OPGATE_PATRONI") != "1",
    reason="a Patroni failover run (about a minute, root, Debian's patroni and etcd-server): "
    "set OPGATE_PATRONI=1",
)
def test_one_patroni_failover_sends_nothing_twice() -> None:
    """One run of failover-run.sh: the leader killed mid-stream, the synchronous standby
    promoted; at most one refund per operation at localstripe, every approval answered 201
    still there, no 500, and a confirmed send again after the promotion."""
    result = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert lines, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(lines[-1].removeprefix("SUMMARY "))
    assert summary["max_refunds_per_operation"] <= 1
    assert summary["operations_refunded_twice"] == []
    assert summary["approvals_missing"] == []
    assert summary["answers_500"] == 0
    assert summary["operations_approved"] > 0
    assert summary["kill_to_first_confirmed_seconds"] > 0
    assert result.returncode == 0
