"""The tlog-witness decision (proxy/transparency/witness.py): a witness cosigns only a checkpoint
consistent with the last one it cosigned, and refuses with the specification's statuses."""

from __future__ import annotations

import pytest

from proxy.transparency import merkle, note
from proxy.transparency.checkpoint import Checkpoint
from proxy.transparency.witness import (
    SIZE_CONTENT_TYPE,
    Cosigned,
    Refusal,
    add_checkpoint_body,
    decide,
    parse_add_checkpoint,
)

ORIGIN = "opgate.example/audit"


class Log:
    """A log in memory: its leaves, its nodes and its key."""

    def __init__(self, signer: note.Signer, leaves: list[bytes]) -> None:
        self.signer = signer
        self.leaves = [merkle.leaf_hash(x) for x in leaves]
        self.nodes: dict[tuple[int, int], bytes] = {}
        grown = merkle.append_leaves(0, [], self.leaves)
        for level, index, digest in grown.nodes:
            self.nodes[level, index] = digest

    def root(self, size: int) -> bytes:
        return merkle.tree_hash(self.leaves[:size])

    def signed(self, size: int) -> str:
        return note.sign_note(Checkpoint(ORIGIN, size, self.root(size)).text(), [self.signer])

    def request(self, old: int, size: int) -> bytes:
        proof = merkle.consistency_proof(old, size, lambda lv, i: self.nodes[lv, i])
        return add_checkpoint_body(old, proof, self.signed(size)).encode()


@pytest.fixture
def key() -> note.Signer:
    return note.Signer.generate(ORIGIN)


def witness_sees(log: Log, old: int, size: int, latest: Cosigned | None) -> Cosigned:
    checkpoint = decide(
        parse_add_checkpoint(log.request(old, size)), {ORIGIN: log.signer.verifier()}, latest
    )
    return Cosigned(checkpoint.size, checkpoint.root)


def test_a_growing_log_is_cosigned_step_by_step(key: note.Signer) -> None:
    """From nothing to 3, then to 10: each step's proof verifies against the last cosigned."""
    log = Log(key, [bytes([i]) for i in range(10)])
    first = witness_sees(log, 0, 3, None)
    assert first == Cosigned(3, log.root(3))
    assert witness_sees(log, 3, 10, first) == Cosigned(10, log.root(10))


def test_a_forked_log_is_refused_by_the_second_witness(key: note.Signer) -> None:
    """The log shows one history to a witness and a fork (another record 2) to the other: the
    second witness, which cosigned the true prefix, refuses the fork (422)."""
    honest = Log(key, [b"a", b"b", b"c", b"d"])
    fork = Log(key, [b"a", b"b", b"X", b"d", b"e"])
    seen_by_second = witness_sees(honest, 0, 3, None)
    witness_sees(fork, 0, 5, None)  # the first witness never saw the honest log: it cosigns
    with pytest.raises(Refusal) as refused:
        witness_sees(fork, 3, 5, seen_by_second)
    assert refused.value.status == 422


def test_a_resigned_rewrite_is_refused(key: note.Signer) -> None:
    """The operator rewrites record 1 and re-signs checkpoints with the log's key: a witness
    holding the earlier checkpoint refuses them."""
    log = Log(key, [b"a", b"b", b"c"])
    rewritten = Log(key, [b"a", b"B", b"c", b"d"])
    seen = witness_sees(log, 0, 3, None)
    for size, status in ((3, 409), (4, 422)):  # the same size, another root; or grown from it
        with pytest.raises(Refusal) as refused:
            witness_sees(rewritten, 3, size, seen)
        assert refused.value.status == status


@pytest.mark.parametrize(
    ("scenario", "status"),
    [("unknown log", 404), ("bad signature", 403), ("stale old size", 409), ("old above", 400)],
)
def test_the_specifications_refusals(key: note.Signer, scenario: str, status: int) -> None:
    """Each refusal of add-checkpoint has the specification's status (409 names the size)."""
    log = Log(key, [b"a", b"b", b"c"])
    logs = {ORIGIN: key.verifier()}
    latest = Cosigned(2, log.root(2))
    body = log.request(2, 3)
    if scenario == "unknown log":
        logs = {"other.example": key.verifier()}
    elif scenario == "bad signature":
        logs = {ORIGIN: note.Signer.generate(ORIGIN).verifier()}
    elif scenario == "stale old size":
        body = log.request(1, 3)
    else:
        body = body.replace(b"old 2", b"old 4")
    with pytest.raises(Refusal) as refused:
        decide(parse_add_checkpoint(body), logs, latest)
    assert refused.value.status == status
    if status == 409:
        assert refused.value.reason == "2\n"


@pytest.mark.parametrize(
    "body", [b"old 01\n\n", b"new 1\n\n", b"old 1\nAAAA\n\n", b"old 1\n", b"\xff"]
)
def test_malformed_requests_are_400(body: bytes) -> None:
    """A request that is not 'old N', base64 hashes, a blank line and a note is a 400."""
    with pytest.raises(Refusal) as refused:
        parse_add_checkpoint(body)
    assert refused.value.status == 400


def test_the_same_size_with_another_root_is_a_conflict(key: note.Signer) -> None:
    """c2sp.org/tlog-witness: when the old size is the checkpoint's size, the roots must be
    identical, else 409 (not a consistency failure's 422), and not as a size answer."""
    log = Log(key, [b"a", b"b", b"c"])
    rewritten = Log(key, [b"a", b"B", b"c"])
    seen = witness_sees(log, 0, 3, None)
    assert witness_sees(log, 3, 3, seen) == seen  # the same checkpoint again: cosigned
    with pytest.raises(Refusal) as refused:
        witness_sees(rewritten, 3, 3, seen)
    assert refused.value.status == 409
    assert refused.value.content_type != SIZE_CONTENT_TYPE
