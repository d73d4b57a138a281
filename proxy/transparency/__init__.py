"""The audit log as a transparency log, pure: RFC 6962 Merkle trees and their proofs (merkle),
C2SP signed notes with Ed25519 (note), tlog-checkpoints and cosignatures (checkpoint), the
tlog-witness exchange's text (witness), the signed map of where each stream ends (heads), and
compact JWS under ES256 (jws): opgate's one verifier of signed mandates and receipts, at the
gate and in a bundle alike. No IO and no settings, so that a reviewer verifies a bundle with
the wheel alone (``opgate audit verify-bundle``).

May import: nothing of opgate's (only the standard library and ``cryptography``). Imported by
observe (the integrator, bundles), mandates (jws) and the process (``opgate audit``).
"""
