"""Dev mode's credentials (proxy/devmode.py): generated once, kept private, and with the audit
log's signing key, so that dev has signed checkpoints too."""

from __future__ import annotations

import json
from pathlib import Path

from proxy.devmode import dev_credentials
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
