"""The audit log as a transparency log, pure: RFC 6962 Merkle trees and their proofs (merkle),
C2SP signed notes with Ed25519 (note), tlog-checkpoints and cosignatures (checkpoint), the
tlog-witness exchange's text (witness), and the signed map of where each stream ends (heads).
No IO and no settings, so that a reviewer verifies a bundle with the wheel alone
(``opgate audit verify-bundle``).

May import: nothing of opgate's (only the standard library and ``cryptography``). Imported by
observe (the integrator, bundles) and the process (``opgate audit``).
"""
