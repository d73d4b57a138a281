"""C2SP signed notes (proxy/transparency/note.py): key IDs, verifier keys and Ed25519 note
signatures, against the specification's own example (c2sp.org/signed-note) and the reference
implementation's (golang.org/x/mod/sumdb/note's documented PeterNeumann key and note)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.transparency import note

SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n"
    "\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3m"
    "FXmRKuwHjG1Yu72IneyaQM=\n"
)
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZ"
    "SNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def test_the_specifications_example_note_verifies_with_its_vkey() -> None:
    """c2sp.org/signed-note's example: the vkey parses, its key ID is recomputed from name and
    key, and it opens the example note."""
    verifier = note.Verifier.from_vkey(SPEC_VKEY)
    assert verifier.name == "example.com/foo"
    assert verifier.key_id == 0x530D903A
    assert note.key_id(verifier.name, note.ED25519, verifier.public_bytes) == 0x530D903A
    assert verifier.vkey() == SPEC_VKEY
    opened = note.open_note(SPEC_NOTE, [verifier])
    assert opened.text == "This is an example message.\n"
    assert [s.name for s in opened.verified] == ["example.com/foo"]


def test_the_reference_implementations_key_signs_byte_for_byte() -> None:
    """The Go reference's PeterNeumann signer key gives its vkey and signs its text into exactly
    its note (Ed25519 is deterministic)."""
    signer = note.Signer.from_skey(GO_SKEY)
    assert signer.skey() == GO_SKEY
    assert signer.verifier().vkey() == GO_VKEY
    assert note.sign_note(GO_TEXT, [signer]) == GO_NOTE
    assert note.open_note(GO_NOTE, [note.Verifier.from_vkey(GO_VKEY)]).text == GO_TEXT


def test_a_changed_text_or_signature_is_refused() -> None:
    """A known key whose signature does not verify rejects the whole note."""
    verifier = note.Verifier.from_vkey(GO_VKEY)
    with pytest.raises(note.NoteError, match="does not verify"):
        note.open_note(GO_NOTE.replace("cryptography", "cryptographie"), [verifier])
    sig = base64.b64decode(GO_NOTE.split()[-1])
    forged = sig[:-1] + bytes([sig[-1] ^ 1])
    with pytest.raises(note.NoteError, match="does not verify"):
        note.open_note(
            GO_NOTE.replace(GO_NOTE.split()[-1], base64.b64encode(forged).decode()), [verifier]
        )


def test_unknown_keys_are_ignored_but_one_known_key_is_required() -> None:
    """Signatures by unknown keys (another name, or the same name with another ID) are skipped;
    without a verified known signature the note is refused."""
    other = note.Signer.generate("PeterNeumann")
    with_other = note.sign_note(GO_TEXT, [note.Signer.from_skey(GO_SKEY), other])
    opened = note.open_note(with_other, [note.Verifier.from_vkey(GO_VKEY)])
    assert len(opened.signatures) == 2
    assert len(opened.verified) == 1
    with pytest.raises(note.NoteError, match="no signature by a known key"):
        note.open_note(GO_NOTE, [other.verifier()])


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        ("no blank line", GO_TEXT + GO_NOTE.splitlines(keepends=True)[-1]),
        ("no final newline", GO_NOTE[:-1]),
        ("no signature", GO_TEXT + "\n"),
        ("a control character", GO_NOTE.replace("answer", "ans\x07wer")),
        ("a carriage return", GO_NOTE.replace("\n\u2014", "\r\n\u2014")),
        ("not the em dash", GO_NOTE.replace("\u2014", "-")),
        ("a short signature", GO_TEXT + "\n\u2014 PeterNeumann AAAA\n"),
        ("a name with a plus", GO_NOTE.replace("\u2014 PeterNeumann", "\u2014 Peter+Neumann")),
        ("not base64", GO_NOTE.replace("x08go", "x08g!")),
    ],
)
def test_malformed_notes_are_refused(scenario: str, message: str) -> None:
    """Each malformation of c2sp.org/signed-note is a NoteError, never a verified text."""
    with pytest.raises(note.NoteError):
        note.open_note(message, [note.Verifier.from_vkey(GO_VKEY)])


@pytest.mark.parametrize(
    "vkey",
    [
        "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong key ID
        "PeterNeumann+c74f20a3+AhpcAcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # unknown type
        "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10",  # short key
        "PeterNeumann+C74F20A3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # not lowercase
        "+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # no name
    ],
)
def test_malformed_vkeys_are_refused(vkey: str) -> None:
    """A vkey whose ID does not match its name and key, or that is not well formed, is refused."""
    with pytest.raises(note.NoteError):
        note.Verifier.from_vkey(vkey)


@given(st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",)), max_size=60))
def test_any_text_signs_and_opens(line: str) -> None:
    """Any well-formed text round-trips through sign_note and open_note, with several signers."""
    text = f"{line}\n\nsecond\n"
    signers = [note.Signer.generate("a.example/log"), note.Signer.generate("b.example/w")]
    message = note.sign_note(text, signers)
    opened = note.open_note(message, [s.verifier() for s in signers])
    assert opened.text == text
    assert len(opened.verified) == 2


def test_cosignature_keys_have_their_own_type_and_id() -> None:
    """tlog-cosignature: an Ed25519 cosigner's key ID uses type 0x04, its signature is the
    timestamp (8 bytes, big-endian) then Ed25519 over 'cosignature/v1', 'time T' and the text;
    a plain 0x01 verifier of the same key does not accept it."""
    cosigner = note.Signer.generate("witness.example/w1", note.COSIGNATURE_V1)
    public = cosigner.verifier().public_bytes
    assert cosigner.key_id == note.key_id("witness.example/w1", 0x04, public)
    text = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    signature = cosigner.sign(text, timestamp=1679315147)
    assert signature.timestamp == 1679315147
    assert signature.data[:8] == (1679315147).to_bytes(8, "big")
    signed = (
        "cosignature/v1\ntime 1679315147\n"
        "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    )
    cosigner.verifier().public_key.verify(signature.data[8:], signed.encode())
    message = text + "\n" + signature.line()
    assert note.open_note(message, [cosigner.verifier()]).verified == (signature,)
    as_plain = note.Verifier(cosigner.name, note.ED25519, public)
    with pytest.raises(note.NoteError):
        note.open_note(message, [as_plain])


def test_a_cosignatures_timestamp_is_read_as_the_reference_reads_it() -> None:
    """transparency-dev/formats' CoSigV1Timestamp vector: this signature carries time 1727964367."""
    blob = base64.b64decode(
        "ZGhGuQAAAABm/qTPeyKXD+R2rzyQsxPiP8mXum7qq/iF0u4vanlqJyocWODBt97w9uL+8qT7S5gxEHWWOworDcFi"
        "EBYJXORmnFBOBA=="
    )
    signature = note.Signature("w", int.from_bytes(blob[:4], "big"), blob[4:])
    assert signature.timestamp == 1727964367


def test_a_cosignature_time_above_the_specifications_limit_is_refused() -> None:
    """c2sp.org/tlog-cosignature: the timestamp MUST NOT exceed 2^63 - 1; a cosignature
    validly signed over a larger one is not accepted (the note is refused, as for any known
    key's signature that fails)."""
    witness = note.Signer.generate("w.example", note.COSIGNATURE_V1)
    text = "log.example\n1\n" + base64.b64encode(bytes(32)).decode() + "\n"
    stamp = 2**63
    data = stamp.to_bytes(8, "big") + witness.private_key.sign(note.cosigned_message(text, stamp))
    line = note.Signature(witness.name, witness.key_id, data).line()
    with pytest.raises(note.NoteError):
        note.open_note(text + "\n" + line, [witness.verifier()])
