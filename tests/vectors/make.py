"""Write the known-answer vectors (``tests/vectors/*.json``) from fixed keys and inputs.

Run once, and again only when an encoding changes on purpose; the diff of the vectors is then
the change, for review. The tests never run this: they recompute one side from the committed
inputs (tests/support/vectors.py says why)::

    .venv/bin/python -m tests.vectors.make --server-url postgresql://postgres@127.0.0.1:5432/postgres

The receipt's ES256 signature is randomized (ECDSA): a run signs anew, the signing input stays.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from joserfc.jwk import ECKey

from proxy.mandates.receipts import key_id, public_jwks, receipt_claims, sign_receipt
from proxy.observe.auditlog.chain import GENESIS, Head, checkpoint_mac, heads_json, record_hash
from proxy.observe.auditlog.integrator import record_leaf
from proxy.store.schema import migrated_scratch_database
from proxy.transparency import heads, merkle, note
from proxy.transparency.checkpoint import Checkpoint
from tests.support.vectors import VECTORS, build_bundle

ORIGIN = "opgate.vectors/audit"
WITNESS = "witness.vectors"
T0 = datetime(2026, 12, 6, 9, 30, 0, 123456, tzinfo=UTC)


def _seed(purpose: str) -> bytes:
    return hashlib.sha256(f"opgate known-answer vectors: {purpose}".encode()).digest()


def _signer(name: str, sig_type: int, purpose: str) -> note.Signer:
    return note.Signer(name, sig_type, Ed25519PrivateKey.from_private_bytes(_seed(purpose)))


LOG = _signer(ORIGIN, note.ED25519, "log")
WITNESS_SIGNER = _signer(WITNESS, note.COSIGNATURE_V1, "witness")


def _write(name: str, vector: dict[str, Any]) -> None:
    path = VECTORS / f"{name}.json"
    path.write_text(json.dumps(vector, indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"wrote {path}")


def audit_record() -> dict[str, Any]:
    """The record hash (docs/audit.md, *Tamper evidence*) of records that exercise each field's
    encoding: a genesis and a chained record, a NULL and an empty field, multi-byte UTF-8."""
    cases = [
        ("first record of an operation's stream", GENESIS, "op_v1", 1, "transition", "op_v1",
         '{"event": "created", "operation_id": "op_v1"}'),
        ("chained onto the one before", bytes(range(32)), "op_v1", 2, "transition", "op_v1",
         '{"event": "claimed", "operation_id": "op_v1"}'),
        ("no operation (NULL field)", GENESIS, "requests/gw-1", 7, "request", None,
         '{"reason": "no_route", "decision": "deny"}'),
        ("empty operation id", GENESIS, "requests/gw-1", 8, "request", "", "{}"),
        ("multi-byte UTF-8", GENESIS, "op-\u00e9\u20ac", 3, "transition", "op-\u00e9\u20ac",
         '{"note": "caf\u00e9 \u20ac \U0001f600"}'),
    ]  # fmt: skip
    out = []
    for n, (name, prev, stream, seq, kind, operation_id, record) in enumerate(cases):
        at = T0 + timedelta(seconds=n, microseconds=n)
        digest = record_hash(prev, stream, seq, at, kind, operation_id, record)
        out.append(
            {
                "name": name,
                "prev_hash": prev.hex(),
                "stream": stream,
                "seq": seq,
                "at": at.isoformat(),
                "kind": kind,
                "operation_id": operation_id,
                "record": record,
                "hash": digest.hex(),
            }
        )
    return {"format": "opgate-audit-v1 record hash", "cases": out}


def audit_checkpoint() -> dict[str, Any]:
    """Two HMAC checkpoints (``opgate audit checkpoint``): heads as signed JSON, and each MAC
    chained onto the one before."""
    key = _seed("hmac")
    out = []
    prev = GENESIS
    for n, listed in enumerate(
        [
            [Head("op_v1", 2, bytes(range(32))), Head("policy", 1, bytes(32))],
            [Head("requests/gw-1", 8, bytes(range(1, 33)))],
        ]
    ):
        at = T0 + timedelta(minutes=n)
        text = heads_json(listed)
        mac = checkpoint_mac(key, prev, at, "gw-1", text)
        out.append(
            {"at": at.isoformat(), "writer": "gw-1", "prev_mac": prev.hex(), "heads": text,
             "mac": mac.hex()}
        )  # fmt: skip
        prev = mac
    return {"format": "opgate-audit-checkpoint-v1", "key": key.hex(), "checkpoints": out}


def _skey(signer: note.Signer) -> str:
    return signer.skey()


def transparency_checkpoint() -> dict[str, Any]:
    """A signed tree head (c2sp tlog-checkpoint) over 5 records, with the stream heads' root as
    its ``opgate-heads/1`` line, signed by the log and cosigned by a witness (Ed25519:
    deterministic, so the whole note is a known answer)."""
    records = [("op_v1", 1), ("op_v1", 2), ("policy", 1), ("requests/gw-1", 1), ("op_v1", 3)]
    hashes = [hashlib.sha256(f"{s}/{q}".encode()).digest() for s, q in records]
    root = merkle.tree_hash([record_leaf(h) for h in hashes])
    last = {s: heads.Head(s, q, h) for (s, q), h in zip(records, hashes, strict=True)}
    buckets: dict[int, list[heads.Head]] = {}
    for head in last.values():
        buckets.setdefault(heads.bucket_of(head.stream), []).append(head)
    heads_root = heads.root({b: heads.bucket_hash(h) for b, h in buckets.items()})
    line = heads.extension_line(heads_root)
    text = Checkpoint(ORIGIN, len(records), root, (line,)).text()
    signed = note.sign_note(text, [LOG])
    cosigned_at = 1_796_000_000
    cosignature = WITNESS_SIGNER.sign(text, timestamp=cosigned_at).line()
    return {
        "format": "c2sp tlog-checkpoint with opgate-heads/1",
        "log_skey": _skey(LOG),
        "log_vkey": LOG.verifier().vkey(),
        "witness_skey": _skey(WITNESS_SIGNER),
        "witness_vkey": WITNESS_SIGNER.verifier().vkey(),
        "records": [
            {"stream": s, "seq": q, "hash": h.hex()}
            for (s, q), h in zip(records, hashes, strict=True)
        ],
        "root": base64.b64encode(root).decode(),
        "heads_line": line,
        "text": text,
        "signed": signed,
        "cosigned_at": cosigned_at,
        "cosignature": cosignature,
    }


def bundle_inputs() -> dict[str, Any]:
    """An operation created, claimed and confirmed, its request record, a replay naming it in
    an instance's stream, and a policy load: the records a bundle of it holds and refers to."""

    body = b'{"id": "pi_v1", "status": "succeeded"}'
    answer_sha256 = hashlib.sha256(body).hexdigest()
    approval = {
        "approval_ref": "ticket-42", "supersedes": None, "approved_by": "alice", "tenant": "t1",
        "agent_id": "a1", "provider": "stripe", "action": "create_payment_intent",
        "target": {"method": "POST", "path": "/v1/payment_intents"}, "path_params": {},
        "amount": 1250, "currency": "eur", "params": {}, "expires_at": "2026-12-07T09:30:00+00:00",
        "idempotency_key_sha256": hashlib.sha256(b"key-v1").hexdigest(),
    }  # fmt: skip
    details = {"created": approval, "claimed": {"attempt": 1},
               "confirmed": {"provider_status": 200, "object_id": "pi_v1"}}  # fmt: skip

    def transition(n: int, event: str, before: str | None, after: str) -> dict[str, Any]:
        at = T0 + timedelta(seconds=n)
        fields = {
            "schema_version": 1, "time": at.isoformat(), "event": event, "event_id": n,
            "operation_id": "op_v1", "status_before": before, "status_after": after,
            "actor": "agent:a1", "detail": details[event], "instance_id": "gw-1",
            "policy_version": "v1",
        }  # fmt: skip
        return {"stream": "op_v1", "kind": "transition", "operation_id": "op_v1",
                "at": at.isoformat(), "record": json.dumps(fields)}  # fmt: skip

    def request(n: int, stream: str, decision: str) -> dict[str, Any]:
        at = T0 + timedelta(seconds=n)
        fields = {"schema_version": 1, "time": at.isoformat(), "decision": decision,
                  "operation_id": "op_v1", "status_after": "confirmed",
                  "provider_answer_sha256": answer_sha256}  # fmt: skip
        return {"stream": stream, "kind": "request", "operation_id": "op_v1",
                "at": at.isoformat(), "record": json.dumps(fields)}  # fmt: skip

    policy = {"stream": "policy", "kind": "policy_load", "operation_id": None,
              "at": T0.isoformat(), "record": '{"event": "policy_loaded"}'}  # fmt: skip
    return {
        "log_skey": _skey(LOG),
        "log_vkey": LOG.verifier().vkey(),
        "witness_skey": _skey(WITNESS_SIGNER),
        "witness_vkey": WITNESS_SIGNER.verifier().vkey(),
        "cosigned_at": 1_796_000_060,
        "operation_id": "op_v1",
        # the operation's row as it stands once confirmed: what the bundle keeps of the answer
        "operation": {
            "operation_id": "op_v1",
            "tenant": "t1",
            "agent_id": "a1",
            "provider": "stripe",
            "action": "create_payment_intent",
            "method": "POST",
            "path": "/v1/payment_intents",
            "idempotency_key": "key-v1",
            "approval_ref": "ticket-42",
            "approved_by": "alice",
            "amount": 1250,
            "currency": "eur",
            "expires_at": "2026-12-07T09:30:00+00:00",
            "status": "confirmed",
            "attempts": 1,
            "provider_status": 200,
            "provider_object_id": "pi_v1",
            "settled_reason": "provider_answer",
            "settled_at": (T0 + timedelta(seconds=3)).isoformat(),
            "response_content_type": "application/json",
            "response_body": base64.b64encode(body).decode(),
        },
        "records": [
            policy,
            transition(1, "created", None, "created"),
            transition(2, "claimed", "created", "dispatched"),
            transition(3, "confirmed", "dispatched", "confirmed"),
            request(4, "op_v1", "allow"),
            request(5, "requests/gw-1", "replay"),
        ],
    }


async def bundle_vector(server_dsn: str) -> str:
    async with migrated_scratch_database(server_dsn, "opgate_vectors") as conn:
        return await build_bundle(conn, bundle_inputs())


def receipt() -> dict[str, Any]:
    """A success receipt of a confirmed operation under a fixed P-256 key: its claims, the JWS
    signing input (header and payload: deterministic) and one signature of it."""
    d = int.from_bytes(_seed("receipt"), "big")
    private = ec.derive_private_key(d, ec.SECP256R1())
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    key = ECKey.import_key(pem)
    operation = {
        "operation_id": "op_v1",
        "status": "confirmed",
        "provider_response": {"object_id": "pi_v1"},
    }
    issuer, now, reference = "opgate.vectors", 1_796_000_000, "ref_v1"
    inputs = {"issuer": issuer, "now": now, "reference": reference}
    claims = receipt_claims(issuer=issuer, now=now, reference=reference, operation=operation)
    refused = ("mandate_expired", "the mandate expired")
    refusal = receipt_claims(issuer=issuer, now=now, reference=reference, refusal=refused)
    jws = sign_receipt(key, claims)
    return {
        "format": "ES256 JWS (AP2 Mandate and Payment Receipt)",
        "private_jwk": dict(key.as_dict(private=True)),
        "kid": key_id(key),
        "jwks": public_jwks(key),
        "inputs": {**inputs, "operation": operation},
        "claims": claims,
        "refusal": {"code": "mandate_expired", "sentence": "the mandate expired"},
        "refusal_claims": refusal,
        "signing_input": jws.rsplit(".", 1)[0],
        "jws": jws,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.vectors.make")
    parser.add_argument("--server-url", required=True, help="a server to build a bundle on")
    args = parser.parse_args()
    VECTORS.mkdir(exist_ok=True)
    _write("audit_record", audit_record())
    _write("audit_checkpoint", audit_checkpoint())
    _write("transparency_checkpoint", transparency_checkpoint())
    _write("bundle_inputs", bundle_inputs())
    made = asyncio.run(bundle_vector(args.server_url))
    (VECTORS / "bundle.json").write_text(made, "utf-8")  # byte for byte as opgate writes it
    print(f"wrote {VECTORS / 'bundle.json'}")
    _write("receipt", receipt())


if __name__ == "__main__":
    main()
