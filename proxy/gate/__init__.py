"""One agent request, top to bottom (``pipeline.handle_agent_request``): identify, decide with
ordered pure checks, claim, inject, send, classify, record, audit.

pipeline.py       the request on one screen, its stages numbered; also composed requests (mcp)
intake.py         stage 1: provider, rule, agent, operation reference, the parsed body
identity.py       agent tokens, token digests
ids.py            the one grammar of every id an operator or agent names, checked at entry
forwarded.py      what the forward listener hands over about a request it let through
headers.py        which headers cross, each way, and which can be read at all
bodies.py         strict body parsing (JSON, form) and bodies composed from fields
checks.py         the decision core: ordered pure checks, and the Agent they are about
transitions.py    may the operation be sent now: its row's transition, for the gate and recovery
decision.py       a decision's values: Deny, Forward, Replay
reasons.py        the stable refusal codes, each with status, title and next action
problem.py        refusals as RFC 9457 problem+json
dialects.py       refusals in a provider's own error shape
budgets.py        spend budgets at claim time, and their standings
limits.py         requests in flight and request rates per agent and tenant
cutoff.py         claims cut off before anything left, released as not_sent
preconditions.py  before a first send, ask the provider whether the approval still holds
resend.py         before a re-send of an unknown outcome, ask the provider
lookup.py         the rule's declared lookups: does the operation's effect exist?
credentials.py    the provider credential a policy injects
signatures.py     RFC 9421 signatures on what leaves, as the agent (policy agent_signature)
key_directory.py  the agents' public signing keys as a Web Bot Auth key directory, signed
oauth2.py         OAuth 2.0 client-credentials tokens for providers that want them
token_exchange.py an SDK's own OAuth token request, answered with the agent's opgate token
upstream.py       the one outbound exchange, translated into opgate's errors
x402_pay.py       stage 5b: an upstream's x402 402, paid once for the operation
classify.py       what a provider's answer means for the operation
framing.py        problem+json for requests aiohttp's parser refuses before any handler
shutdown.py       connections caught by a drain are closed at once

Entry points for the parts above (tests/test_layout.py ``GATE_ENTRY_POINTS``): pipeline,
reasons, problem, decision, checks, transitions, identity, ids, bodies, budgets. May import:
runtime, observe, policy, store, settings, errors, x402. Never recovery, operations, proposals,
authoring or the process modules. Imported by: runtime, admin, forward, recovery, operations,
proposals, authoring, console, mcp, the process.
"""
