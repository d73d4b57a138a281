"""The tamper-evident audit log: chaining (chain), the records appended (records), what can be
stored (storable), the writer of request records and the checkpointer (writer), the counting of
repeated pre-authentication denials (denials), redaction (redact), verification (verify),
retention (retention), the periodic rounds of the checkpointer and the integrator (periodic);
the transparency log over it: the integrator that makes records leaves of the Merkle tree and
signs checkpoints (integrator), the witnesses it asks to cosign (witnesses), proofs (proofs),
the check of the stored records against the signed tree (treecheck), offline bundles (bundle)
and what their records say of each operation, checked against what they refer to (evidence),
the minimal witness (witness_server). Over them all, ``opgate audit`` as one command module
(cli) and the text it prints (reports). docs/audit.md describes the formats.
"""
