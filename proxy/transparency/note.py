"""C2SP signed notes (c2sp.org/signed-note) with Ed25519, and Ed25519 cosignatures
(c2sp.org/tlog-cosignature, signature type 0x04).

A note is its text (ending in a newline), a blank line, and one line per signature:
``— <key name> base64(key ID (4 bytes, big-endian) || signature)``. The key ID is
``SHA-256(name || "\\n" || type || public key)[:4]``. A verifier knows a key by its *vkey*,
``<name>+<hex key ID>+base64(type || public key)``; a signer's secret is written as the
reference implementation (golang.org/x/mod/sumdb/note) writes it:
``PRIVATE+KEY+<name>+<hex key ID>+base64(type || 32-byte seed)``.

Opening a note (``open_note``) follows the specification: signatures by unknown keys (name and
ID not both known) are ignored, a known key's signature that fails rejects the note, and a note
with no verified signature is rejected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

ED25519 = 0x01
COSIGNATURE_V1 = 0x04  # timestamped Ed25519 checkpoint cosignatures (tlog-cosignature)
EM_DASH = "\u2014"
MAX_TIMESTAMP = 2**63 - 1  # a cosignature's time, at most (tlog-cosignature)
MAX_SIGNATURES = 100  # the specification requires at least 16; the reference stops at 100
_HEX_ID = re.compile(r"[0-9a-f]{8}")
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f]")  # below U+0020, but newline


class NoteError(ValueError):
    """A note, key or signature that is malformed, or does not verify."""


def _b64decode(text: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise NoteError(f"not base64: {text[:20]!r}") from exc
    if base64.b64encode(data).decode("ascii") != text:  # one encoding per value
        raise NoteError(f"not canonical base64: {text[:20]!r}")
    return data


def check_name(name: str) -> None:
    """Key names are non-empty, without spaces (any Unicode space) or ``+``."""
    if not name or "+" in name or any(c.isspace() for c in name) or _CONTROL.search(name):
        raise NoteError(f"not a key name: {name!r}")


def key_id(name: str, sig_type: int, public_key: bytes) -> int:
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([sig_type]) + public_key)
    return int.from_bytes(digest.digest()[:4], "big")


def cosigned_message(text: str, timestamp: int) -> bytes:
    """What an Ed25519 cosignature signs: a header line, the time line, the checkpoint text."""
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode("utf-8")


@dataclass(frozen=True)
class Signature:
    """One signature line: who (name, key ID) and the signature bytes after the key ID."""

    name: str
    key_id: int
    data: bytes

    def line(self) -> str:
        blob = self.key_id.to_bytes(4, "big") + self.data
        return f"{EM_DASH} {self.name} {base64.b64encode(blob).decode('ascii')}\n"

    @property
    def timestamp(self) -> int:
        """A cosignature's time (POSIX seconds): its first 8 bytes."""
        if len(self.data) != 72:
            raise NoteError(f"the signature by {self.name} is not an Ed25519 cosignature")
        return int.from_bytes(self.data[:8], "big")


@dataclass(frozen=True)
class Verifier:
    """A public key, as a verifier knows it: name, signature type and the key's 32 bytes."""

    name: str
    sig_type: int
    public_bytes: bytes

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.sig_type not in (ED25519, COSIGNATURE_V1):
            raise NoteError(f"signature type {self.sig_type:#04x} is not supported")
        if len(self.public_bytes) != 32:
            raise NoteError("an Ed25519 public key is 32 bytes")

    @property
    def key_id(self) -> int:
        return key_id(self.name, self.sig_type, self.public_bytes)

    @property
    def public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.public_bytes)

    def vkey(self) -> str:
        material = base64.b64encode(bytes([self.sig_type]) + self.public_bytes).decode("ascii")
        return f"{self.name}+{self.key_id:08x}+{material}"

    @classmethod
    def from_vkey(cls, vkey: str) -> Verifier:
        parts = vkey.split("+", 2)
        if len(parts) != 3 or not _HEX_ID.fullmatch(parts[1]):
            raise NoteError(f"not a verifier key: {vkey[:40]!r}")
        name, hex_id, material = parts
        raw = _b64decode(material)
        if not raw:
            raise NoteError("a verifier key without key material")
        verifier = cls(name, raw[0], raw[1:])
        if verifier.key_id != int(hex_id, 16):
            raise NoteError(f"the key ID of {name}'s verifier key does not match its key")
        return verifier

    def verifies(self, text: str, signature: Signature) -> bool:
        message = text.encode("utf-8")
        data = signature.data
        if self.sig_type == COSIGNATURE_V1:
            # c2sp.org/tlog-cosignature: the timestamp MUST NOT exceed 2^63 - 1
            if len(data) != 72 or signature.timestamp > MAX_TIMESTAMP:
                return False
            message, data = cosigned_message(text, signature.timestamp), data[8:]
        if len(data) != 64:
            return False
        try:
            self.public_key.verify(data, message)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class Signer:
    """A private key that signs notes (``ED25519``) or cosigns checkpoints (``COSIGNATURE_V1``)."""

    name: str
    sig_type: int
    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls, name: str, sig_type: int = ED25519) -> Signer:
        check_name(name)
        return cls(name, sig_type, Ed25519PrivateKey.generate())

    @classmethod
    def from_skey(cls, skey: str) -> Signer:
        parts = skey.split("+", 4)
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"] or not _HEX_ID.fullmatch(parts[3]):
            raise NoteError("not a signer key (PRIVATE+KEY+<name>+<id>+<key>)")
        raw = _b64decode(parts[4])
        if len(raw) != 33:
            raise NoteError("a signer key holds a type byte and a 32-byte Ed25519 seed")
        check_name(parts[2])
        signer = cls(parts[2], raw[0], Ed25519PrivateKey.from_private_bytes(raw[1:]))
        verifier = signer.verifier()  # checks the type
        if verifier.key_id != int(parts[3], 16):
            raise NoteError(f"the key ID of {parts[2]}'s signer key does not match its key")
        return signer

    def _seed(self) -> bytes:
        return self.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def skey(self) -> str:
        material = base64.b64encode(bytes([self.sig_type]) + self._seed()).decode("ascii")
        return f"PRIVATE+KEY+{self.name}+{self.key_id:08x}+{material}"

    def verifier(self) -> Verifier:
        public = self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return Verifier(self.name, self.sig_type, public)

    @property
    def key_id(self) -> int:
        return self.verifier().key_id

    def sign(self, text: str, timestamp: int | None = None) -> Signature:
        """Sign a note's text; a cosigner needs the time (POSIX seconds) it vouches for."""
        check_text(text)
        if self.sig_type == COSIGNATURE_V1:
            if timestamp is None or not 0 < timestamp < 2**63:
                raise NoteError("a cosignature needs a timestamp")
            data = timestamp.to_bytes(8, "big") + self.private_key.sign(
                cosigned_message(text, timestamp)
            )
        else:
            data = self.private_key.sign(text.encode("utf-8"))
        return Signature(self.name, self.key_id, data)


def check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("a note's text ends with a newline")
    if _CONTROL.search(text):
        raise NoteError("a note holds no control character but newline")


@dataclass(frozen=True)
class Note:
    """A parsed note: its text, every signature line, and those verified by a known key."""

    text: str
    signatures: tuple[Signature, ...]
    verified: tuple[Signature, ...] = ()

    def render(self) -> str:
        return self.text + "\n" + "".join(s.line() for s in self.signatures)


def parse_note(message: str | bytes) -> Note:
    """A note's syntax only (nothing is verified)."""
    if isinstance(message, bytes):
        try:
            message = message.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NoteError("a note is UTF-8") from exc
    if _CONTROL.search(message) or not message.endswith("\n"):
        raise NoteError("a note ends with a newline and holds no other control character")
    split = message.rfind("\n\n")
    if split < 0:
        raise NoteError("a note has a blank line before its signatures")
    text, lines = message[: split + 1], message[split + 2 :].splitlines()
    if not lines:
        raise NoteError("a note without signatures")
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"more than {MAX_SIGNATURES} signatures")
    return Note(text, tuple(parse_signature_line(line) for line in lines))


def parse_signature_line(line: str) -> Signature:
    parts = line.split(" ")
    if len(parts) != 3 or parts[0] != EM_DASH:
        raise NoteError("a signature line is '— <name> <signature>'")
    check_name(parts[1])
    blob = _b64decode(parts[2])
    if len(blob) < 5:
        raise NoteError(f"the signature by {parts[1]} is too short")
    return Signature(parts[1], int.from_bytes(blob[:4], "big"), blob[4:])


def open_note(message: str | bytes, verifiers: Sequence[Verifier]) -> Note:
    """Parse and verify: the note, with the signatures of the known keys that verified."""
    parsed = parse_note(message)
    known = {(v.name, v.key_id): v for v in verifiers}
    verified = []
    for signature in parsed.signatures:
        verifier = known.get((signature.name, signature.key_id))
        if verifier is None:
            continue  # an unknown key (a witness we do not rely on, a rotated key): ignored
        if not verifier.verifies(parsed.text, signature):
            raise NoteError(f"the signature by {signature.name} does not verify")
        verified.append(signature)
    if not verified:
        raise NoteError("no signature by a known key")
    return Note(parsed.text, parsed.signatures, tuple(verified))


def sign_note(text: str, signers: Sequence[Signer], timestamp: int | None = None) -> str:
    """The signed note: the text, a blank line, one signature per signer."""
    return Note(text, tuple(s.sign(text, timestamp) for s in signers)).render()
