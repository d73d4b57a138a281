"""What a bundle's records refer to (proxy/observe/auditlog/evidence.py): a real opgate, a
person's signed mandate, the fault provider. The bundle of the operation carries the mandate's
presentation and the issuer's keys, and what opgate stored of the provider's answer;
``verify-bundle``, offline, checks them against the digests the signed records hold, refuses
a bundle whose mandate or answer was swapped, and says who approved the operation and how
many times it was sent."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from proxy.observe.auditlog import bundle
from tests.support.auditlog import flushed
from tests.support.bundles import verify_offline
from tests.support.fault_provider import FaultProvider
from tests.support.mandate_gate import (
    PERSON,
    mandate_policy,
    mandate_settings,
    present,
    send_exactly,
)
from tests.support.mandates import closed_mandate
from tests.support.opgate import StartOpgate
from tests.support.transparency import LOG_SIGNER

LOG_KEY = LOG_SIGNER.verifier().vkey()


@pytest_asyncio.fixture(loop_scope="session")
async def made(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Path, str]]:
    """A mandate presented, its refund sent once and replayed once, integrated; the bundle of
    its operation (the file, and the operation id)."""
    monkeypatch.setenv("OPGATE_SECRET_TRANSPARENCY_KEY", LOG_SIGNER.skey())
    # a mandate approves the payment rule that names what carries its payee
    (policy_dir / "fault.yaml").write_text(mandate_policy())
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, **mandate_settings(tmp_path)
    ) as gate:
        status, answer = await present(gate, gate.http, closed_mandate(PERSON, amount=2500))
        assert status == 201, answer
        operation_id = answer["operation"]["operation"]["operation_id"]
        request = answer["operation"]["request"]
        assert await send_exactly(gate, gate.http, request) == 200
        assert await send_exactly(gate, gate.http, request) == 200  # replayed
        await flushed(gate)
        observability = gate.running.gateway.observability
        assert observability is not None
        assert observability.integrator is not None
        assert await observability.integrator.integrate() is not None
    conn = await asyncpg.connect(database_url)
    try:
        document = await bundle.build(conn, operation_id, LOG_SIGNER.verifier(), [], 0)
    finally:
        await conn.close()
    path = tmp_path / "op.bundle.json"
    path.write_text(bundle.dumps(document))
    yield path, operation_id


async def test_the_bundle_says_who_approved_and_that_it_was_sent_once(
    made: tuple[Path, str], fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """Offline, the bundle verifies and answers the reviewer's question: the person's mandate
    (its signature verified with the issuer's keys kept in the record), one send, one effect
    at the provider (its object), the stored answer matching the signed record, one replay."""
    path, operation_id = made
    checked = verify_offline(path, tmp_path, "--log-key", LOG_KEY)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    out = checked.stdout
    assert f"operation {operation_id}:" in out
    assert "approved by surface:alice" in out
    assert "mandate signed by issuer surface (key surface-2026, RFC 7638 thumbprint" in out
    assert "sent once (1 attempt)" in out
    effect = fault_provider.effects[0].id
    assert f"answered confirmed: provider status 200, object {effect}" in out
    assert "the stored answer matches the signed record" in out
    assert "replayed at least 1 time (the stored answer, nothing sent)" in out


async def test_a_swapped_answer_or_mandate_is_refused(made: tuple[Path, str]) -> None:
    """The provider's answer in the bundle replaced by another: its digest is not the one the
    signed request records hold. The presentation replaced by another mandate of the same
    person (validly signed): its record is no longer the one the log holds, and an unproven
    record says nothing of who approved the operation."""
    path, operation_id = made
    swapped = json.loads(path.read_text())
    answer = swapped["answers"][operation_id]
    forged = json.loads(base64.b64decode(answer["body"]))
    forged["amount"] = 1
    answer["body"] = base64.b64encode(json.dumps(forged).encode()).decode()
    [refused] = bundle.verify(swapped, LOG_KEY).breaks
    assert refused.startswith(  # the record that claimed it: in its stream (migration 0022)
        f"operation {operation_id}: the stored answer in the bundle is not the one the signed"
        f" request record stream {operation_id} seq 4"
    )

    swapped = json.loads(path.read_text())
    held = swapped["records"] + swapped["referenced"]
    [entry] = [e for e in held if json.loads(e["record"]).get("mandate")]
    record = json.loads(entry["record"])
    digest = record["mandate"]["digest"]
    record["mandate"]["presentation"] = closed_mandate(PERSON, amount=99999)
    entry["record"] = json.dumps(record)
    where = f"stream {entry['stream']} seq {entry['seq']}"
    assert bundle.verify(swapped, LOG_KEY).breaks == [
        f"{where}: content does not match its hash (rewritten)",
        f"{where}: is not the record the signed log holds at leaf {entry['leaf_index']}"
        " (rewritten, replaced or inserted)",
    ]  # and, not proven, the swapped record says nothing of who approved the operation
    report = bundle.verify(swapped, LOG_KEY)
    assert not any(line.startswith("mandate signed by") for line in report.operations[0].lines)
    assert f"approved by mandate {digest}, whose presentation is in no record" in " ".join(
        report.unproven
    )
