"""Approvals: turning an approval into an operation row (approvals), the operations API on
the operations listener (api) and its CLI (cli), the audit log's proofs and bundles for
reviewers (audit_api), signed mandates as approvals (mandates_api), and an agent's JSON
document read bounded (agent_body).

May import: admin, mandates, recovery, runtime, gate, observe, policy, store, settings,
errors. Never proposals (which builds on this). Imported by: the process, proposals, console
and mcp.
"""
