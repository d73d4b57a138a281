"""One agent request, top to bottom (``pipeline.handle_agent_request``): identify the agent and
the operation (intake, identity, headers, bodies), decide with ordered pure checks (checks,
decision, reasons), claim, inject (credentials), send (upstream), classify the answer, and
answer refusals as problem+json (problem), including requests aiohttp's parser refuses before
any handler runs (framing).

May import: runtime, observe, policy, store, settings, errors. Never recovery, operations,
authoring or the process modules. Imported by: forward, recovery, operations, authoring, the
process.
"""
