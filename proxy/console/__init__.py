"""The web console for humans, on the operations listener under ``/console/``: operations and
their timelines, the escalation queue and its resolve form, the audit chain's state. Server-
rendered (Jinja2, autoescaped; no JavaScript, nothing from another origin), signed in with a
token exchanged for a server-side session (sessions), two roles: admin and read-only reviewer
(sessions), pages and forms (views), what each page shows (pages), the sentences a proposal
and an escalation read as (explain), rendering (render).

May import: proposals, operations, admin, recovery, runtime, gate (its entry points), observe,
policy, store, settings, errors.
Imported by: the process (server).
"""
