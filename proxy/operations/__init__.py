"""Approvals: turning an approval into an operation row (approvals), the operations API on
the operations listener (api) and its CLI (cli).

May import: recovery, gate, observe, policy, store, settings, errors. Imported by: the process,
console and mcp.
"""
