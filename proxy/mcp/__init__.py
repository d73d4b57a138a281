"""opgate's operations as MCP tools: the tools and their schemas (tools), the approved request
opgate composes for ``execute_operation`` (compose), the tool calls against the gateway (calls),
the Streamable HTTP endpoint on the agent listener (endpoint) and the stdio relay that local
agent runtimes spawn (stdio); the tasks extension (tasks), OAuth access tokens (auth), URL
elicitation for proposals (elicitation), operations as resources (resources), the listen
streams that watch operations and tasks (subscriptions), the proposal card as an MCP App
(apps), the JSON-RPC messages checked
before the SDK reads them (messages), the browser origins allowed (origins), the sealed
``requestState`` (request_state) and the capabilities kept the same on every era
(capabilities). Every mutating call goes through
``proxy.gate.pipeline``.

May import: proposals, operations, recovery, runtime, gate (its entry points), observe,
policy, store, settings, errors.
Never authoring or console. Imported by: the process (server, cli).
"""
