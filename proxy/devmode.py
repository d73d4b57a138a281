"""``opgate serve --dev``: a local trial with nothing configured by hand.

Generates an admin token, one demo agent token (tenant ``demo``) and the audit log's Ed25519
signing key (so that dev has signed checkpoints too: docs/audit.md) once, keeps them in
``<data_dir>/dev-credentials.json`` (mode 0600), and reuses them on the next start. Never for
production: real deployments configure token digests (``opgate token new``) and their own key
(``opgate audit new-key``).

Each start also records where it runs (its listeners and database) in
``<data_dir>/dev-instance.json`` (0600), so that the operator commands given ``--dev``
(``opgate ops``, ``opgate proposals``, ``opgate audit``) find it from another shell.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from proxy.gate.identity import new_token, token_digest
from proxy.transparency.note import Signer

DEV_AGENT_ID = "demo-agent"
DEV_TENANT = "demo"


def dev_credentials_file(data_dir: Path) -> Path:
    return data_dir / "dev-credentials.json"


def dev_instance_file(data_dir: Path) -> Path:
    return data_dir / "dev-instance.json"


def stored_dev_credentials(data_dir: Path) -> dict[str, str] | None:
    """The credentials a ``serve --dev`` on ``data_dir`` generated, or None (it never ran)."""
    path = dev_credentials_file(data_dir)
    if not path.is_file():
        return None
    stored: dict[str, str] = json.loads(path.read_text("utf-8"))
    return stored


def dev_credentials(data_dir: Path) -> dict[str, str]:
    path = dev_credentials_file(data_dir)
    creds: dict[str, str] = stored_dev_credentials(data_dir) or {}
    if "transparency_key" in creds:
        return creds
    if creds:
        path.unlink()  # made before dev mode had a key: the same tokens, and a key
    data_dir.mkdir(parents=True, exist_ok=True)
    creds.setdefault("admin_token", new_token())
    creds.setdefault("agent_token", new_token())
    creds["transparency_key"] = Signer.generate(f"opgate.dev/{new_token()[:12]}").skey()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(creds, handle)
    return creds


def dev_overrides(creds: dict[str, str], current: dict[str, Any]) -> dict[str, Any]:
    """Settings that wire the dev tokens in, where the operator configured none."""
    out = dict(current)
    out.setdefault("admin_token_sha256", token_digest(creds["admin_token"]))
    out.setdefault(
        "agents",
        [
            {
                "id": DEV_AGENT_ID,
                "tenant": DEV_TENANT,
                "token_sha256": token_digest(creds["agent_token"]),
            }
        ],
    )
    return out


def record_dev_instance(data_dir: Path, instance: dict[str, str | None]) -> None:
    """Where this ``serve --dev`` runs (``agent_listen``, ``ops_listen``, ``database_url``:
    None for the embedded one in ``data_dir``), rewritten at each start, private (0600): the
    database URL may hold a password."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = dev_instance_file(data_dir)
    staged = path.with_suffix(".tmp")
    staged.unlink(missing_ok=True)
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(instance, handle)
    staged.replace(path)


def dev_instance(data_dir: Path) -> dict[str, str | None]:
    """What the last ``serve --dev`` on ``data_dir`` recorded; empty if none ever ran."""
    path = dev_instance_file(data_dir)
    if not path.is_file():
        return {}
    recorded: dict[str, str | None] = json.loads(path.read_text("utf-8"))
    return recorded


class NoDevInstance(Exception):
    """No ``serve --dev`` ever ran on this data directory (its credentials file is absent)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"no dev credentials in {path}: start `opgate serve --dev` first")
        self.path = path


def use_dev_log_key(
    creds: dict[str, str], secrets_dir: Path | None, environ: MutableMapping[str, str]
) -> None:
    """The dev log's signing key, put where secrets are read (``OPGATE_SECRET_
    TRANSPARENCY_KEY``) unless one is configured (the variable, or the secrets directory)."""
    if secrets_dir is not None and (secrets_dir / "transparency_key").is_file():
        return
    if "transparency_key" in creds:
        environ.setdefault("OPGATE_SECRET_TRANSPARENCY_KEY", creds["transparency_key"])


def operator_view(data_dir: Path) -> tuple[dict[str, str], dict[str, str | None]]:
    """For an operator command given ``--dev``: the dev credentials and where the instance
    runs (what its last start recorded). NoDevInstance if none ever ran on ``data_dir``."""
    creds = stored_dev_credentials(data_dir)
    if creds is None:
        raise NoDevInstance(dev_credentials_file(data_dir))
    return creds, dev_instance(data_dir)
