"""Keys of the transparency log in tests: the log's signing key (and, for rotation, the key
that replaces it, under the same origin), a witness's cosigning key, and one nobody trusts."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from proxy.transparency import note

ORIGIN = "opgate.test/audit"
LOG_SIGNER = note.Signer.generate(ORIGIN)
ROTATED_SIGNER = note.Signer.generate(ORIGIN)  # the same log, its next key
UNKNOWN_SIGNER = note.Signer.generate(ORIGIN)  # the same name, a key no one was given
WITNESS_SIGNER = note.Signer.generate("w.test", note.COSIGNATURE_V1)


# --- RFC 6962, written again for minting test inputs ------------------------------------------
# The verifiers (proxy/transparency/merkle.py) check proofs; these make them, from the
# definitions in RFC 6962, 2.1 (MTH, PATH, PROOF/SUBPROOF), so that one bug cannot hide in
# both the making and the checking.
def leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(leaves: Sequence[bytes]) -> bytes:
    """The Merkle tree hash of these leaf hashes."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return _node(mth(leaves[:k]), mth(leaves[k:]))


def audit_path(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n]): leaf m's inclusion proof, bottom first."""
    if len(leaves) <= 1:
        return []
    k = _split(len(leaves))
    if m < k:
        return [*audit_path(m, leaves[:k]), mth(leaves[k:])]
    return [*audit_path(m - k, leaves[k:]), mth(leaves[:k])]


def consistency(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(m, D[n]): that the first m leaves' tree is a prefix of this one."""

    def sub(m: int, part: Sequence[bytes], whole: bool) -> list[bytes]:
        if m == len(part):
            return [] if whole else [mth(part)]
        k = _split(len(part))
        if m <= k:
            return [*sub(m, part[:k], whole), mth(part[k:])]
        return [*sub(m - k, part[k:], False), mth(part[:k])]

    return sub(m, leaves, True) if 0 < m < len(leaves) else []
