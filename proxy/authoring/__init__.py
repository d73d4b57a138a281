"""The platform team's policy tooling: ``opgate policy check|schema|test|explain`` (commands),
policy test cases (cases), explanations that run the gate's own intake and checks (explain)
and ``POST /v1/explain`` (explain_api); the reference pages that restate code,
docs/reference/codes.md, settings.md and cli.md (reference).

May import: admin, runtime, gate, observe, policy, store, settings, errors. Imported by: the
process.
"""
