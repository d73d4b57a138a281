"""What opgate tells the outside: the canonical audit record of each request (audit), sent
exactly once by the one object that owns its life (record_life), the observer that spans,
counts and queues it (observer), the health of its sinks (sinks), tracing (telemetry),
Prometheus metrics (metrics) and their sharing between workers (shared_metrics), log setup
(logs), and the tamper-evident audit log in PostgreSQL (auditlog/).

May import: policy, store, settings, errors. Never gate or anything above it: the request
path hands records in through ``record_life.RecordLife``. Imported by: gate and everything
above it.
"""
