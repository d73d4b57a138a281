"""Witnesses (proxy/observe/auditlog/witnesses.py, ``opgate audit witness``): two real witness
processes on loopback cosign the checkpoints of a real log; a forked log shown to both is
refused by the second, and a history rewritten and re-signed with the log's own key is refused
by a witness that cosigned the earlier one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from proxy.observe.auditlog import integrator
from proxy.observe.auditlog.bundle import build, verify
from proxy.observe.auditlog.witnesses import Witnesses
from proxy.settings import WitnessConfig
from proxy.store import audit
from proxy.store.store import Store
from proxy.transparency import note
from tests.support.environment import inherited
from tests.support.paths import REPO
from tests.support.postgres import dsn_for_database

SIGNER = note.Signer.generate("opgate.test/audit")
OPERATION = "op_witnessed"


class WitnessProcess:
    """``opgate audit witness`` in its own process, on a port of its own choosing."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        key_file = tmp_path / f"{name}.key"
        made = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy",
                "audit",
                "new-key",
                name,
                "--cosigner",
                "-o",
                str(key_file),
            ],
            capture_output=True,
            text=True,
            env=_env(),
            check=True,
            timeout=60,
        )
        self.vkey = made.stdout.strip()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "proxy",
                "audit",
                "witness",
                "--key",
                str(key_file),
                "--log",
                SIGNER.verifier().vkey(),
                "--state",
                str(tmp_path / f"{name}.json"),
                "--listen",
                "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert "listening on http://" in line, line + self.process.stderr.read()  # type: ignore[union-attr]
        self.url = line.split()[-1]

    @property
    def config(self) -> WitnessConfig:
        return WitnessConfig(url=self.url, vkey=self.vkey)

    def stop(self) -> None:
        self.process.terminate()
        self.process.communicate(timeout=30)  # waits, and closes its pipes


def _env() -> dict[str, str]:
    env = inherited()
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.fixture
def two_witnesses(tmp_path: Path) -> Iterator[tuple[WitnessProcess, WitnessProcess]]:
    first = WitnessProcess(tmp_path, "w1.test")
    try:
        second = WitnessProcess(tmp_path, "w2.test")
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def fork_url(pg_server_dsn: str, pg_template: str) -> AsyncIterator[str]:
    """Another fresh database on the same server: the fork's."""
    name = "opgate_fork_" + os.urandom(6).hex()
    admin = await asyncpg.connect(pg_server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
        yield dsn_for_database(pg_server_dsn, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url)
    try:
        yield opened
    finally:
        await opened.close()


async def log_history(store: Store, events: list[str]) -> integrator.Integrated:
    texts = [json.dumps({"event": e, "operation_id": OPERATION}) for e in events]
    await store.run(lambda conn: audit.append_texts(conn, OPERATION, "transition", texts))
    done = await store.run(lambda conn: integrator.integrate(conn, SIGNER))
    assert done is not None
    return done


async def cosigners(store: Store) -> list[str]:
    async def read(conn: asyncpg.Connection) -> list[str]:
        rows = await conn.fetch("SELECT witness FROM transparency_cosignatures ORDER BY witness")
        return [r["witness"] for r in rows]

    return await store.run(read)


async def test_witnesses_cosign_and_a_bundle_counts_the_quorum(
    store: Store, two_witnesses: tuple[WitnessProcess, WitnessProcess]
) -> None:
    """Both witnesses cosign two checkpoints in turn (the second with a consistency proof);
    a bundle then verifies with a quorum of 2 and fails with a quorum of 3."""
    witnesses = Witnesses(store, [w.config for w in two_witnesses])
    try:
        await witnesses(await log_history(store, ["created", "claimed"]))
        await witnesses(await log_history(store, ["confirmed"]))
    finally:
        await witnesses.close()
    assert await cosigners(store) == ["w1.test", "w1.test", "w2.test", "w2.test"]
    keys = [w.vkey for w in two_witnesses]
    made = await store.run(lambda conn: build(conn, OPERATION, SIGNER.verifier(), keys, 2))
    report = verify(made, SIGNER.verifier().vkey(), keys, 2)
    assert report.breaks == []
    assert report.cosigners == ["w1.test", "w2.test"]
    assert verify(made, SIGNER.verifier().vkey(), keys, 3).breaks == [
        "checkpoint: cosigned by 2 of the 2 witnesses given, 3 needed"
    ]


async def test_a_forked_log_is_refused_by_the_second_witness(
    store: Store, fork_url: str, two_witnesses: tuple[WitnessProcess, WitnessProcess]
) -> None:
    """The log shows its history to the second witness, then a fork of it (another database,
    the same key, another record 2) to both: the first, which never saw the log, cosigns; the
    second refuses (422), and the fork keeps no cosignature of it."""
    first, second = two_witnesses
    await log_history(store, ["created", "claimed", "confirmed"])
    honest = Witnesses(store, [second.config])
    try:
        await honest(await log_history(store, ["settled"]))
    finally:
        await honest.close()
    fork = await Store.open(fork_url)
    shown = Witnesses(fork, [first.config, second.config])
    try:
        await log_history(fork, ["created", "revoked", "confirmed"])
        with capture_logs() as logs:
            await shown(await log_history(fork, ["settled", "escalated"]))
        assert await cosigners(fork) == ["w1.test"]
    finally:
        await shown.close()
        await fork.close()
    refused = [e for e in logs if e["event"] == "audit_witness_refused"]
    assert [(e["witness"], e["status"]) for e in refused] == [("w2.test", 422)]


async def test_a_resigned_rewrite_is_refused_by_a_witness(
    store: Store, two_witnesses: tuple[WitnessProcess, WitnessProcess]
) -> None:
    """The operator rewrites a record, rebuilds the tree from the rewritten rows and signs it
    with the log's key, dropping the old cosignatures: the witness, holding the earlier
    checkpoint, refuses the new one (422)."""
    witness = two_witnesses[0]
    witnesses = Witnesses(store, [witness.config])
    try:
        await witnesses(await log_history(store, ["created", "claimed", "confirmed"]))
        assert await cosigners(store) == ["w1.test"]

        async def rewrite(conn: asyncpg.Connection) -> None:
            await conn.execute(
                'UPDATE audit_log SET record = \'{"event": "declined"}\', hash = sha256(hash)'
                " WHERE stream = $1 AND seq = 2",
                OPERATION,
            )
            await conn.execute(
                "TRUNCATE transparency_cosignatures, transparency_checkpoints,"
                " transparency_leaves, transparency_nodes"
            )
            await conn.execute("UPDATE transparency_state SET tree_size = 0, floor_txid = 0")

        await store.run(rewrite)
        with capture_logs() as logs:
            await witnesses(await log_history(store, ["settled"]))
    finally:
        await witnesses.close()
    assert await cosigners(store) == []
    refused = [e for e in logs if e["event"] == "audit_witness_refused"]
    assert [(e["witness"], e["status"]) for e in refused] == [("w1.test", 422)]
