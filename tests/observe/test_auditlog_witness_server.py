"""The minimal witness (proxy/observe/auditlog/witness_server.py) on loopback: it cosigns, keeps
what it cosigned across a restart (its state file), serves it, and answers a stale old size with
409 and its size as text/x.tlog.size."""

from __future__ import annotations

import hashlib
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.observe.auditlog.witness_server import WitnessState, witness_app
from proxy.transparency import merkle, note
from proxy.transparency.checkpoint import Checkpoint, open_checkpoint
from proxy.transparency.witness import add_checkpoint_body

LOG = note.Signer.generate("opgate.test/audit")
WITNESS = note.Signer.generate("w.test", note.COSIGNATURE_V1)
LEAVES = [merkle.leaf_hash(bytes([i])) for i in range(6)]
NODES = {(lv, i): h for lv, i, h in merkle.append_leaves(0, [], LEAVES).nodes}


ROTATED = note.Signer.generate(LOG.name)  # the log's next key: the same origin


def signed(size: int, key: note.Signer = LOG) -> str:
    text = Checkpoint(LOG.name, size, merkle.tree_hash(LEAVES[:size])).text()
    return note.sign_note(text, [key])


def body(old: int, size: int, key: note.Signer = LOG) -> bytes:
    proof = merkle.consistency_proof(old, size, lambda lv, i: NODES[lv, i])
    return add_checkpoint_body(old, proof, signed(size, key)).encode()


async def test_the_witness_cosigns_keeps_and_serves(tmp_path: Path) -> None:
    """Size 2 then 5 are cosigned; after a restart from the state file a stale old size is 409
    with the kept size, and the kept checkpoint carries the log's signature and the witness's."""
    state = tmp_path / "state.json"
    async with aiohttp.ClientSession() as http:
        server = TestServer(witness_app(WITNESS, [LOG.verifier()], WitnessState(state)))
        await server.start_server()
        try:
            for old, size in ((0, 2), (2, 5)):
                async with http.post(server.make_url("/add-checkpoint"), data=body(old, size)) as r:
                    assert r.status == 200, await r.text()
                    line = await r.text()
            cosigned = open_checkpoint(signed(5) + line, LOG.verifier(), [WITNESS.verifier()])
            assert [s.name for s in cosigned.cosignatures] == ["w.test"]
        finally:
            await server.close()
        restarted = TestServer(witness_app(WITNESS, [LOG.verifier()], WitnessState(state)))
        await restarted.start_server()
        try:
            async with http.post(restarted.make_url("/add-checkpoint"), data=body(2, 6)) as r:
                assert r.status == 409
                assert r.content_type == "text/x.tlog.size"
                assert await r.text() == "5\n"
            origin_hash = hashlib.sha256(LOG.name.encode()).hexdigest()
            async with http.get(restarted.make_url(f"/{origin_hash}/checkpoint")) as r:
                kept = await r.text()
            opened = open_checkpoint(kept, LOG.verifier(), [WITNESS.verifier()])
            assert opened.checkpoint.size == 5
            assert len(opened.cosignatures) == 1
        finally:
            await restarted.close()


async def test_the_witness_follows_a_rotated_key_only_once_given_it(tmp_path: Path) -> None:
    """After the log rotates its key, a checkpoint signed by the new key is refused (403) by a
    witness given only the old one; restarted with both (``--log OLD --log NEW``), it cosigns
    it from the size it cosigned under the old key, still requiring consistency."""
    state = tmp_path / "state.json"
    async with aiohttp.ClientSession() as http:
        old_only = TestServer(witness_app(WITNESS, [LOG.verifier()], WitnessState(state)))
        await old_only.start_server()
        try:
            async with http.post(old_only.make_url("/add-checkpoint"), data=body(0, 3)) as r:
                assert r.status == 200, await r.text()
            new_body = body(3, 5, ROTATED)
            async with http.post(old_only.make_url("/add-checkpoint"), data=new_body) as r:
                assert r.status == 403
        finally:
            await old_only.close()
        keys = [LOG.verifier(), ROTATED.verifier()]
        both = TestServer(witness_app(WITNESS, keys, WitnessState(state)))
        await both.start_server()
        try:
            async with http.post(both.make_url("/add-checkpoint"), data=new_body) as r:
                assert r.status == 200, await r.text()
                line = await r.text()
            opened = open_checkpoint(signed(5, ROTATED) + line, keys, [WITNESS.verifier()])
            assert (opened.checkpoint.size, opened.signed_by) == (5, ROTATED.key_id)
            fork = Checkpoint(LOG.name, 6, merkle.tree_hash([*LEAVES[:5], LEAVES[0]])).text()
            forked = add_checkpoint_body(5, [], note.sign_note(fork, [ROTATED])).encode()
            async with http.post(both.make_url("/add-checkpoint"), data=forked) as r:
                assert r.status == 422
        finally:
            await both.close()
