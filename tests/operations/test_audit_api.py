"""The transparency log on the operations listener (proxy/operations/audit_api.py): a real
opgate with a transparency key integrates a real operation's records; the checkpoint, a
record's inclusion proof, a consistency proof and the bundle served over HTTP verify with the
log's public key alone."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.observe.auditlog import bundle, integrator
from proxy.observe.auditlog.witness_server import WitnessState, witness_app
from proxy.transparency import merkle, note
from proxy.transparency.checkpoint import open_checkpoint
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import StartOpgate, admin_headers, fault_policy

SIGNER = note.Signer.generate("opgate.test/audit")
WITNESS = note.Signer.generate("w.test", note.COSIGNATURE_V1)


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with http.get(url, headers=admin_headers()) as response:
        return response.status, await response.read()


async def test_reviewers_get_proofs_over_http(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """One confirmed refund, integrated and cosigned by the configured witness: its first
    transition is proven in the signed checkpoint, the checkpoint before the refund is
    consistent with it, the bundle verifies with a quorum of 1; an unknown record is a 404
    ``audit_not_provable``, and nothing is served without the admin token."""
    monkeypatch.setenv("OPGATE_SECRET_TRANSPARENCY_KEY", SIGNER.skey())
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    witness = TestServer(witness_app(WITNESS, [SIGNER.verifier()], WitnessState(tmp_path / "w")))
    await witness.start_server()
    try:
        configured = {
            "url": str(witness.make_url("")).rstrip("/"),
            "vkey": WITNESS.verifier().vkey(),
        }
        async with (
            start_opgate(
                upstream_overrides={"fault": fault_provider.url},
                audit_witnesses=[configured],
                audit_witness_quorum=1,
            ) as gate,
        ):
            observability = gate.running.gateway.observability
            assert observability is not None
            assert observability.integrator is not None
            before = await observability.integrator.integrate()
            assert before is not None
            op = await gate.approve()
            status, _, _ = await gate.send(
                "/fault/v1/refunds",
                data="amount=500&currency=usd&charge=ch_1",
                headers={"X-Operation-Id": op["operation_id"]},
            )
            assert status == 200
            assert observability.writer is not None
            await observability.writer.flush()
            after = await observability.integrator.integrate()
            assert after is not None
            assert after.size > before.size

            status, body = await get(http, f"{gate.ops_url}/v1/audit/checkpoint")
            assert status == 200
            opened = open_checkpoint(body.decode(), SIGNER.verifier(), [WITNESS.verifier()])
            assert opened.checkpoint.size == after.size
            assert opened.witnessed(1)

            status, body = await get(
                http, f"{gate.ops_url}/v1/audit/proof?record={op['operation_id']}:1"
            )
            assert status == 200
            proof = json.loads(body)
            root = open_checkpoint(proof["checkpoint"], SIGNER.verifier()).checkpoint.root
            leaf = integrator.record_leaf(bytes.fromhex(proof["record_hash"]))
            path = [base64.b64decode(p) for p in proof["inclusion"]]
            assert merkle.verify_inclusion(leaf, proof["leaf_index"], after.size, path, root)

            status, body = await get(
                http, f"{gate.ops_url}/v1/audit/consistency?old={before.size}&new={after.size}"
            )
            assert status == 200
            document = json.loads(body)
            consistency = [base64.b64decode(p) for p in document["consistency"]]
            assert merkle.verify_consistency(
                before.size, after.size, before.root, after.root, consistency
            )

            status, body = await get(
                http, f"{gate.ops_url}/v1/audit/bundle?operation={op['operation_id']}"
            )
            assert status == 200
            report = bundle.verify(
                json.loads(body), SIGNER.verifier().vkey(), [WITNESS.verifier().vkey()], 1
            )
            assert report.breaks == []
            assert report.cosigners == ["w.test"]
            assert report.proven >= 3  # created, claimed, confirmed, and the request

            status, body = await get(http, f"{gate.ops_url}/v1/audit/proof?record=op_none:1")
            assert status == 404
            assert b"audit_not_provable" in body
            async with http.get(f"{gate.ops_url}/v1/audit/checkpoint") as response:
                assert response.status == 401
    finally:
        await witness.close()
