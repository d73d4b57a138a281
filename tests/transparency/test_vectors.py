"""Known answers for the transparency log's signed tree head (tests/vectors/): the root, the
stream heads' ``opgate-heads/1`` line, the checkpoint text and its Ed25519 signatures."""

from __future__ import annotations

import base64

from proxy.observe.auditlog.integrator import record_leaf
from proxy.transparency import heads, merkle, note
from proxy.transparency.checkpoint import Checkpoint, open_checkpoint
from tests.support.vectors import REGENERATE, load

VECTOR = load("transparency_checkpoint")


def test_the_committed_records_give_the_committed_checkpoint_text() -> None:
    """The tree of the committed records' hashes has the committed root, their streams' last
    records the committed heads line, and the checkpoint the committed text."""
    records = VECTOR["records"]
    digests = [bytes.fromhex(r["hash"]) for r in records]
    root = merkle.tree_hash([record_leaf(d) for d in digests])
    assert base64.b64encode(root).decode() == VECTOR["root"], REGENERATE
    last = {
        r["stream"]: heads.Head(r["stream"], r["seq"], bytes.fromhex(r["hash"])) for r in records
    }
    buckets: dict[int, list[heads.Head]] = {}
    for head in last.values():
        buckets.setdefault(heads.bucket_of(head.stream), []).append(head)
    line = heads.extension_line(heads.root({b: heads.bucket_hash(h) for b, h in buckets.items()}))
    assert line == VECTOR["heads_line"], REGENERATE
    origin = note.Signer.from_skey(VECTOR["log_skey"]).name
    assert Checkpoint(origin, len(records), root, (line,)).text() == VECTOR["text"], REGENERATE


def test_the_fixed_keys_sign_the_committed_notes() -> None:
    """Ed25519 is deterministic: the fixed log key signs the committed text into the committed
    note, the fixed witness key cosigns it at the committed time into the committed line, and
    both keys are the committed verifier keys."""
    log = note.Signer.from_skey(VECTOR["log_skey"])
    witness = note.Signer.from_skey(VECTOR["witness_skey"])
    assert (log.verifier().vkey(), witness.verifier().vkey()) == (
        VECTOR["log_vkey"],
        VECTOR["witness_vkey"],
    )
    assert note.sign_note(VECTOR["text"], [log]) == VECTOR["signed"], REGENERATE
    cosigned = witness.sign(VECTOR["text"], timestamp=VECTOR["cosigned_at"]).line()
    assert cosigned == VECTOR["cosignature"], REGENERATE


def test_the_committed_checkpoint_opens_with_the_committed_keys() -> None:
    """A verifier given the committed vkeys opens the committed note and its cosignature."""
    log = note.Verifier.from_vkey(VECTOR["log_vkey"])
    witness = note.Verifier.from_vkey(VECTOR["witness_vkey"])
    opened = open_checkpoint(VECTOR["signed"] + VECTOR["cosignature"], log, [witness])
    assert opened.witnessed(1)
    assert opened.checkpoint.text() == VECTOR["text"]
    assert heads.signed_root(opened.checkpoint.extensions) is not None
