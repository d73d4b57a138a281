"""Microbenchmark of one request's audit record: what ``emit`` and its parts cost in opgate's
own process, with the log line rendered as in production (to /dev/null).

    .venv/bin/python bench/audit_record_micro.py [count]

Prints microseconds per call; compare two checkouts in one sitting (the figures of a shared
machine drift between sittings).
"""

from __future__ import annotations

import json
import os
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.gate.bodies import BodyKind, reads_as_field
from proxy.observe.audit import AuditRecord, emit
from proxy.observe.auditlog.redact import Redactor, set_log_redactor
from proxy.observe.auditlog.storable import storable
from proxy.observe.logs import configure_logging


def record() -> AuditRecord:
    made = AuditRecord(
        request_id="abcd1234abcd1234",
        method="POST",
        path="/bench/v1/refunds",
        policy_version="0123456789abcdef",
    )
    made.agent_id, made.tenant, made.provider, made.rule = "agent", "t", "bench", "refund.create"
    made.operation_id, made.decision = "op_123456789012345678901234", "allow"
    made.status_before, made.status_after, made.attempt = "created", "confirmed", 1
    made.provider_status = made.response_status = 200
    made.forwarded_body_sha256, made.source = "ab" * 32, "127.0.0.1"
    return made


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    out = sys.stdout
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the log lines' sink for the whole run)
    configure_logging("info")
    redactor = Redactor(["card"], secrets=["sk_test_secret_value_123456"])
    set_log_redactor(redactor)
    fields = record().fields()
    keys = ("amount", "currency", "charge", "metadata[x]")
    cases = {
        "emit (the log line, no observer)": lambda: emit(record()),
        "AuditRecord.fields()": lambda: record().fields(),
        "redaction of a record": lambda: redactor.mapping(fields),
        "storable": lambda: storable(fields),
        "json.dumps of a record": lambda: json.dumps(fields),
        "reads_as_field, four keys": lambda: [
            reads_as_field(BodyKind.FORM, k, "metadata[operation_id]") for k in keys
        ],
    }
    for name, call in cases.items():
        seconds = timeit.timeit(call, number=count)
        print(f"{name:<36} {seconds / count * 1e6:8.2f} us", file=out)


if __name__ == "__main__":
    main()
