"""What a replacement agent does next, and how opgate learns what happened at the provider:
``next_action`` (pure), the agents' recovery API (api), reconciliation lookups (reconcile), an
x402 payment judged by its nonce's state on the chain (x402_state), the background loop that
reconciles and escalates (background) and the signing of its escalation notices (webhooks).

May import: runtime, gate, observe, policy, store, settings, errors, x402. Never operations,
proposals or authoring. Imported by: operations, proposals, console, mcp and the process.
"""
