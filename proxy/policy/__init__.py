"""The policy model: the YAML files a platform team edits (model), their loading with every
error located (load), lint, path canonicalisation (paths), JSON pointers read one way
(pointers), the precondition expression form (expressions), the loaded set (set) and hot
reload.

May import: errors only. Imported by: observe, gate, forward, recovery, operations, authoring
and the process.
"""
