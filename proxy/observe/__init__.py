"""What opgate tells the outside: the canonical audit record of each request (audit), the
observer that spans, counts and queues it (observer), the health of its sinks (sinks), tracing
(telemetry), Prometheus metrics (metrics) and their sharing between workers (shared_metrics),
log setup (logs), and the tamper-evident audit log in PostgreSQL (auditlog/).

May import: policy, store, settings, errors. Never gate or anything above it: the request
path hands records in through ``audit.emit``. Imported by: gate and everything above it.
"""
