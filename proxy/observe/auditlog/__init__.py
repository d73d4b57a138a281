"""The tamper-evident audit log: chaining (chain), the records appended (records), what can be
stored (storable), the writer of request records and the checkpointer (writer), the counting of
repeated pre-authentication denials (denials), redaction (redact), verification (verify),
retention (retention) and ``opgate audit`` (cli). docs/audit.md describes the format.
"""
