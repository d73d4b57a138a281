"""The tamper-evident audit log: chaining, checkpoints, verification, export (docs/audit.md)."""
