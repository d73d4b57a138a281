"""Proposals: an agent asks for an approval, a human decides. Above operations: a proposal is
planned as an approval is (operations.approvals), and its API and CLI extend the operations
listener's and ``opgate``'s.

rules.py      pure: a proposal read and planned as an approval, four eyes, what the agent is told
proposing.py  the acts (propose, approve, decline), one function each for every front end
api.py        the agents' and the operations listener's proposal routes
cli.py        ``opgate proposals ...``: list, approve, decline from a terminal

May import: operations, admin, recovery, runtime, gate, observe, policy, store, settings,
errors. Imported by: console, mcp, the process.
"""
