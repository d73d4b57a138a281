"""opgate: a tool-boundary enforcing egress proxy for AI agents.

The folders are the architecture; dependencies point down this list, never up
(tests/test_layout.py keeps them so):

    cli, server, workers, devmode   the process: commands, listeners, supervisor
    console/      the web console for humans: operations, escalations, proposals, the audit
    mcp/          opgate's operations as MCP tools: the endpoint, the stdio relay, tasks
    proposals/    an agent asks for an approval, a human decides
    authoring/    the platform team's policy tooling: check, test, explain
    operations/   approvals: the operation rows, their API and CLI
    recovery/     what a replacement agent does next; reconciliation with the provider
    forward/      forward-proxy mode (HTTP(S)_PROXY): a front end to the gate
    admin/        the operations listener's sign-in and problem answers
    gate/         one agent request, top to bottom: identify, check, claim, send, settle
    observe/      the audit record, the tamper-evident audit log, traces, metrics, logs
    mandates/     AP2 Payment Mandates (SD-JWT) read as one operation's approval; receipts
    policy/       the policy model: files, loading, lint, hot reload
    store/        PostgreSQL: every query, migrations, the schema, the embedded server
    transparency/ RFC 6962 trees, C2SP notes, checkpoints, witnesses: pure, imports nothing
    x402/         x402 challenges, the payment an approval covers: pure, imports nothing
    runtime       the resources the process serves with, shared by both listeners
    settings, errors   configuration and the exception tree, imported by all
"""
