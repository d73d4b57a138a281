"""Approvals: turning an approval into an operation row (approvals), the operations API on
the operations listener (api) and its CLI (cli).

May import: admin, recovery, runtime, gate, observe, policy, store, settings, errors. Never
proposals (which builds on this). Imported by: the process, proposals, console and mcp.
"""
