"""Dev mode's credentials (proxy/devmode.py): generated once, kept private, and with the audit
log's signing key, so that dev has signed checkpoints too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.devmode import (
    NoDevInstance,
    dev_credentials,
    operator_view,
    record_dev_instance,
    use_dev_log_key,
)
from proxy.transparency import note


def test_dev_mode_makes_a_transparency_key_once(tmp_path: Path) -> None:
    """The key is an Ed25519 signer key, kept with the tokens (0600) and reused next time."""
    first = dev_credentials(tmp_path)
    signer = note.Signer.from_skey(first["transparency_key"])
    assert signer.sig_type == note.ED25519
    assert (tmp_path / "dev-credentials.json").stat().st_mode & 0o077 == 0
    assert dev_credentials(tmp_path) == first


def test_credentials_made_before_the_key_keep_their_tokens(tmp_path: Path) -> None:
    """A data_dir from before gets a key added; its tokens stay valid."""
    (tmp_path / "dev-credentials.json").write_text(
        json.dumps({"admin_token": "opg_old_admin", "agent_token": "opg_old_agent"})
    )
    creds = dev_credentials(tmp_path)
    assert (creds["admin_token"], creds["agent_token"]) == ("opg_old_admin", "opg_old_agent")
    note.Signer.from_skey(creds["transparency_key"])


def test_each_start_records_where_it_runs_privately(tmp_path: Path) -> None:
    """The instance record is private (it may hold a database password) and rewritten by
    each start, so that `--dev` commands call the ports of the latest one."""
    record_dev_instance(tmp_path, {"ops_listen": "127.0.0.1:9081", "database_url": None})
    record_dev_instance(tmp_path, {"ops_listen": "127.0.0.1:9082", "database_url": None})
    assert (tmp_path / "dev-instance.json").stat().st_mode & 0o077 == 0
    dev_credentials(tmp_path)
    creds, instance = operator_view(tmp_path)
    assert instance == {"ops_listen": "127.0.0.1:9082", "database_url": None}
    assert creds == dev_credentials(tmp_path)


def test_operator_commands_without_a_dev_instance_say_how_to_get_one(tmp_path: Path) -> None:
    """No `serve --dev` ever ran there: one sentence naming the file and the command."""
    with pytest.raises(NoDevInstance, match="start `opgate serve --dev` first"):
        operator_view(tmp_path)


def test_a_configured_log_key_wins_over_the_dev_one(tmp_path: Path) -> None:
    """The dev key is used only where no transparency_key is configured (variable or file)."""
    creds = dev_credentials(tmp_path / "data")
    environ: dict[str, str] = {}
    use_dev_log_key(creds, None, environ)
    assert environ == {"OPGATE_SECRET_TRANSPARENCY_KEY": creds["transparency_key"]}
    configured = {"OPGATE_SECRET_TRANSPARENCY_KEY": "mine"}
    use_dev_log_key(creds, None, configured)
    assert configured == {"OPGATE_SECRET_TRANSPARENCY_KEY": "mine"}
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "transparency_key").write_text("mine\n")
    in_file: dict[str, str] = {}
    use_dev_log_key(creds, tmp_path / "secrets", in_file)
    assert in_file == {}
