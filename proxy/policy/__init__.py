"""The policy model: the YAML files a platform team edits (model), their loading with every
error located (load), lint, path canonicalisation (paths), JSON pointers read one way
(pointers), body field names and ``*`` (fields), amounts (amounts) and currencies' exponents
(currencies), budgets and rate limits (budgets), the set's limits on x402 payments across
payees (payments), the precondition expression form
(expressions), the body an approval implies (approved), the loaded set (set) and hot reload.

May import: errors only. Imported by: observe, gate, forward, recovery, operations, proposals,
authoring and the process.
"""
