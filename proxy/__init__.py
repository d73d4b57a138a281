"""opgate: a tool-boundary enforcing egress proxy for AI agents.

The folders are the architecture; dependencies point down this list, never up
(tests/test_layout.py keeps them so):

    cli, server, workers, devmode   the process: commands, listeners, supervisor
    authoring/    the platform team's policy tooling: check, test, explain
    operations/   approvals: the operation rows, their API and CLI
    recovery/     what a replacement agent does next; reconciliation with the provider
    forward/      forward-proxy mode (HTTP(S)_PROXY): a front end to the gate
    gate/         one agent request, top to bottom: identify, check, claim, send, settle
    observe/      the audit record, the tamper-evident audit log, traces, metrics, logs
    policy/       the policy model: files, loading, lint, hot reload
    store/        PostgreSQL: every query, migrations, the embedded server
    transparency/ RFC 6962 trees, C2SP notes, checkpoints, witnesses: pure, imports nothing
    settings, errors   configuration and the exception tree, imported by all
"""
