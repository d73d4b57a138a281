"""C2SP tlog-checkpoints (proxy/transparency/checkpoint.py): the note text, strictly parsed, and
signed checkpoints opened with the log's key and the witnesses' cosignatures."""

from __future__ import annotations

import base64

import pytest

from proxy.transparency import merkle, note
from proxy.transparency.checkpoint import Checkpoint, open_checkpoint, parse_checkpoint

SPEC_TEXT = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"


def test_the_specifications_example_body_parses_and_renders_alike() -> None:
    """c2sp.org/tlog-checkpoint's example: origin, size, root; rendered back byte for byte."""
    checkpoint = parse_checkpoint(SPEC_TEXT)
    assert checkpoint.origin == "example.com/behind-the-sofa"
    assert checkpoint.size == 20852163
    assert checkpoint.root == base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
    assert checkpoint.text() == SPEC_TEXT


@pytest.mark.parametrize(
    ("scenario", "text"),
    [
        ("two lines", "example.com/log\n3\n"),
        ("a leading zero", SPEC_TEXT.replace("20852163", "020852163")),
        ("a signed size", SPEC_TEXT.replace("20852163", "+20852163")),
        ("a short root", "o\n1\nAAAA\n"),
        ("an empty extension line", SPEC_TEXT + "\n"),
        ("no final newline", SPEC_TEXT[:-1]),
    ],
)
def test_malformed_checkpoints_are_refused(scenario: str, text: str) -> None:
    """Each deviation from the three-line format is a NoteError."""
    with pytest.raises(note.NoteError):
        parse_checkpoint(text)


def test_a_signed_checkpoint_opens_with_the_log_key_and_counts_its_witnesses() -> None:
    """The log signs, two witnesses cosign: opened with the log's vkey and the witnesses', the
    checkpoint is witnessed by a quorum of 2; an unknown witness is not counted."""
    log = note.Signer.generate("opgate.example/audit")
    witnesses = [note.Signer.generate(f"w{i}.example", note.COSIGNATURE_V1) for i in range(3)]
    body = Checkpoint("opgate.example/audit", 1, merkle.leaf_hash(b"x")).text()
    signed = note.Note(
        body, (log.sign(body), *(w.sign(body, timestamp=1_700_000_000) for w in witnesses))
    ).render()
    opened = open_checkpoint(signed, log.verifier(), [w.verifier() for w in witnesses[:2]])
    assert opened.checkpoint.size == 1
    assert [s.name for s in opened.cosignatures] == ["w0.example", "w1.example"]
    assert opened.witnessed(2)
    assert not opened.witnessed(3)


def test_a_checkpoint_without_the_logs_signature_or_origin_is_refused() -> None:
    """Witness cosignatures alone do not make a checkpoint; nor does the log's key signing
    another origin."""
    log = note.Signer.generate("opgate.example/audit")
    witness = note.Signer.generate("w.example", note.COSIGNATURE_V1)
    body = Checkpoint("opgate.example/audit", 0, merkle.EMPTY_ROOT).text()
    only_witness = note.Note(body, (witness.sign(body, timestamp=1),)).render()
    with pytest.raises(note.NoteError, match="not signed by the log"):
        open_checkpoint(only_witness, log.verifier(), [witness.verifier()])
    other = Checkpoint("other.example/log", 0, merkle.EMPTY_ROOT).text()
    with pytest.raises(note.NoteError, match="origin"):
        open_checkpoint(note.sign_note(other, [log]), log.verifier())


def test_a_rotated_log_verifies_with_each_of_its_keys_and_no_other() -> None:
    """Given the log's earlier and current keys (one origin), a checkpoint signed by either
    opens and says which; one signed by a third key of the same name is refused."""
    earlier = note.Signer.generate("opgate.example/audit")
    current = note.Signer.generate("opgate.example/audit")
    unknown = note.Signer.generate("opgate.example/audit")
    keys = [current.verifier(), earlier.verifier()]
    body = Checkpoint("opgate.example/audit", 0, merkle.EMPTY_ROOT).text()
    for signer in (earlier, current):
        assert open_checkpoint(note.sign_note(body, [signer]), keys).signed_by == signer.key_id
    with pytest.raises(note.NoteError, match="no signature by a known key"):
        open_checkpoint(note.sign_note(body, [unknown]), keys)
