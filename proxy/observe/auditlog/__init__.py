"""The tamper-evident audit log: chaining (chain), the records appended (records), the writer
of request records and the checkpointer (writer), redaction (redact), verification (verify)
and ``opgate audit`` (cli). docs/audit.md describes the format.
"""
