"""Keys of the transparency log in tests: the log's signing key (and, for rotation, the key
that replaces it, under the same origin), a witness's cosigning key, and one nobody trusts."""

from __future__ import annotations

from proxy.transparency import note

ORIGIN = "opgate.test/audit"
LOG_SIGNER = note.Signer.generate(ORIGIN)
ROTATED_SIGNER = note.Signer.generate(ORIGIN)  # the same log, its next key
UNKNOWN_SIGNER = note.Signer.generate(ORIGIN)  # the same name, a key no one was given
WITNESS_SIGNER = note.Signer.generate("w.test", note.COSIGNATURE_V1)
