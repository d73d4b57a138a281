"""What a replacement agent does next, and how opgate learns what happened at the provider:
``next_action`` (pure), the agents' recovery API (api), reconciliation lookups (reconcile), the
background loop that reconciles and escalates (background) and the signing of its escalation
notices (webhooks).

May import: runtime, gate, observe, policy, store, settings, errors. Never operations,
proposals or authoring. Imported by: operations, proposals, console, mcp and the process.
"""
