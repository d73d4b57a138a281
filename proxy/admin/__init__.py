"""The operations listener's front door, shared by every API and page it serves (operations,
proposals, explain, the console): who may sign in and how a refusal is answered.

access.py  admin and approver sign-in (token digests), the listener's problem+json answers

May import: gate, settings, errors. Imported by: operations, proposals, authoring, console, the
process (server).
"""
