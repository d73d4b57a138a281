"""``opgate audit checkpoint|prove|consistency|verify-tree|new-key`` (proxy/observe/auditlog/
cli.py) as real processes on a real database: what they print verifies with the log's public
key alone."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog import integrator
from proxy.store import audit
from proxy.transparency import merkle, note
from proxy.transparency.checkpoint import open_checkpoint
from tests.support.paths import REPO

SIGNER = note.Signer.generate("opgate.test/audit")
VKEY = SIGNER.verifier().vkey()


def opgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "audit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
        check=False,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def sizes(database_url: str) -> AsyncIterator[tuple[integrator.Integrated, ...]]:
    """Two rounds: 3 records, then 7."""
    conn = await asyncpg.connect(database_url)
    try:
        rounds = []
        for count in (3, 4):
            texts = [json.dumps({"n": n}) for n in range(count)]
            await audit.append_texts(conn, "requests/cli", "request", texts)
            done = await integrator.integrate(conn, SIGNER)
            assert done is not None
            rounds.append(done)
        yield tuple(rounds)
    finally:
        await conn.close()


async def test_prove_checkpoint_and_consistency_verify(
    sizes: tuple[integrator.Integrated, ...], database_url: str
) -> None:
    """The latest checkpoint opens with the vkey; record 5's proof and the consistency proof
    3 -> 7 verify against it; a record not in the log is exit 1."""
    first, second = sizes
    shown = opgate("checkpoint", "--database-url", database_url)
    assert shown.returncode == 0, shown.stderr
    assert open_checkpoint(shown.stdout, SIGNER.verifier()).checkpoint.size == 7
    proved = opgate("prove", "requests/cli:5", "--database-url", database_url)
    assert proved.returncode == 0, proved.stderr
    proof = json.loads(proved.stdout)
    path = [base64.b64decode(p) for p in proof["inclusion"]]
    leaf = base64.b64decode(proof["leaf_hash"])
    assert merkle.verify_inclusion(leaf, proof["leaf_index"], 7, path, second.root)
    linked = opgate("consistency", "3", "7", "--database-url", database_url)
    assert linked.returncode == 0, linked.stderr
    consistency = [base64.b64decode(p) for p in json.loads(linked.stdout)["consistency"]]
    assert merkle.verify_consistency(3, 7, first.root, second.root, consistency)
    assert opgate("prove", "requests/cli:99", "--database-url", database_url).returncode == 1


async def test_verify_tree_reports_ok_with_the_key(
    sizes: tuple[integrator.Integrated, ...], database_url: str
) -> None:
    """verify-tree with the log's vkey: ok, 7 leaves; with another key: BROKEN, exit 1."""
    checked = opgate("verify-tree", "--log-key", VKEY, "--database-url", database_url)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("ok: 7 leaves")
    other = note.Signer.generate("opgate.test/audit").verifier().vkey()
    refused = opgate("verify-tree", "--log-key", other, "--database-url", database_url)
    assert refused.returncode == 1
    assert "no signature by a known key" in refused.stdout


def test_new_key_writes_a_private_key_once(tmp_path: Path) -> None:
    """new-key prints the vkey, writes the signer key 0600, and never overwrites it."""
    path = tmp_path / "w.key"
    made = opgate("new-key", "w.example/1", "--cosigner", "-o", str(path))
    assert made.returncode == 0, made.stderr
    signer = note.Signer.from_skey(path.read_text().strip())
    assert signer.verifier().vkey() == made.stdout.strip()
    assert signer.sig_type == note.COSIGNATURE_V1
    assert path.stat().st_mode & 0o077 == 0
    assert opgate("new-key", "w.example/1", "-o", str(path)).returncode == 2
