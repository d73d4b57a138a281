"""What a replacement agent does next, and how opgate learns what happened at the provider:
``next_action`` (pure), the agents' recovery API (api), reconciliation lookups (reconcile) and
the background loop that reconciles and escalates (background).

May import: gate, observe, policy, store, settings, errors. Never operations or authoring.
Imported by: operations and the process.
"""
