"""One operation id across everything opgate writes: the row, the audit log, the log lines, the
spans and the provider's own record; redaction of every sink; metrics; the failure-window query.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
import structlog
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from proxy.observe.logs import log_processors
from tests.support.auditlog import run_cli
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import (
    AGENT_TOKEN,
    PROVIDER_SECRET,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
    fault_policy,
)
from tests.support.paths import AUDIT_DOC

AUDIT_KEY = "observe-audit-key-planted-0123456789"
AGENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
AGENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{AGENT_TRACE_ID}-{AGENT_SPAN_ID}-01"
DOCS = AUDIT_DOC


@dataclass
class Observed:
    gate: Opgate
    logs: io.StringIO
    spans: InMemorySpanExporter

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.logs.getvalue().splitlines()]

    async def flush(self) -> None:
        observability = self.gate.running.gateway.observability
        assert observability is not None
        assert observability.writer is not None
        await observability.writer.flush()


@pytest.fixture
def rendered_logs() -> Iterator[io.StringIO]:
    """opgate's real log processor chain, rendering into a buffer instead of stdout."""
    saved = structlog.get_config()
    buffer = io.StringIO()
    structlog.configure(
        processors=log_processors(),
        logger_factory=structlog.PrintLoggerFactory(buffer),
        cache_logger_on_first_use=False,  # nothing may keep this configuration afterwards
    )
    try:
        yield buffer
    finally:
        structlog.configure(**saved)


@pytest_asyncio.fixture(loop_scope="session")
async def observed(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    localstripe_url: str,
    rendered_logs: io.StringIO,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Observed]:
    """opgate before localstripe (Stripe) and the fault provider, its logs and spans captured."""
    monkeypatch.setenv("OPGATE_SECRET_AUDIT_KEY", AUDIT_KEY)
    shutil.copy(SHIPPED_POLICIES / "stripe.yaml", policy_dir / "stripe.yaml")
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, total_timeout=1.0))
    async with start_opgate(
        upstream_overrides={"stripe": localstripe_url, "fault": fault_provider.url},
        audit_redact_fields=["approval_ref"],
    ) as gate:
        exporter = InMemorySpanExporter()
        observability = gate.running.gateway.observability
        assert observability is not None
        observability.telemetry.add_span_processor(SimpleSpanProcessor(exporter))
        yield Observed(gate, rendered_logs, exporter)


def _spans_of(spans: InMemorySpanExporter, trace_id: str) -> list[ReadableSpan]:
    return [
        s
        for s in spans.get_finished_spans()
        if s.context is not None and format(s.context.trace_id, "032x") == trace_id
    ]


async def _audit_records(database_url: str, operation_id: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT kind, record::text AS record FROM audit_log WHERE operation_id = $1"
            " ORDER BY at, stream, seq",
            operation_id,
        )
    finally:
        await conn.close()
    return [{"kind": r["kind"], **json.loads(r["record"])} for r in rows]


async def test_one_operation_id_joins_row_audit_logs_spans_and_provider(
    observed: Observed,
    localstripe_url: str,
    fault_provider: FaultProvider,
    database_url: str,
    tmp_path: Path,
) -> None:
    """A Stripe refund (localstripe) and a fault-provider refund, each sent with the agent's
    traceparent: the row, its audit records, the log lines, the spans (server and client) and
    the provider's record (metadata, X-Operation-Id) all carry the same operation id, and the
    provider got the client span's traceparent in the agent's trace."""
    gate = observed.gate
    charge = await create_charge(localstripe_url, 2000)
    stripe_op = await gate.approve(
        provider="stripe",
        action="refund.create",
        amount=500,
        currency=None,
        params={"charge": charge},
    )
    fault_op = await gate.approve()
    sent = [
        (stripe_op, "/stripe/v1/refunds", f"charge={charge}&amount=500"),
        (fault_op, "/fault/v1/refunds", "amount=500&currency=usd&charge=ch_1"),
    ]
    for op, path, body in sent:
        status, headers, _ = await gate.send(
            path,
            data=body,
            headers={"X-Operation-Id": op["operation_id"], "traceparent": TRACEPARENT},
        )
        assert status == 200
        assert headers["X-Operation-Id"] == op["operation_id"]
    await observed.flush()

    for op, _, _ in sent:
        operation_id = op["operation_id"]
        row = await gate.operation(operation_id)
        assert row["status"] == "confirmed"
        records = await _audit_records(database_url, operation_id)
        assert [(r["kind"], r.get("decision") or r.get("event")) for r in records] == [
            ("transition", "created"),
            ("transition", "claimed"),
            ("transition", "confirmed"),
            ("request", "allow"),
        ]
        assert all(r["operation_id"] == operation_id for r in records)
        assert {r["policy_version"] for r in records} == {gate.running.gateway.policy.version}
        [line] = [
            entry
            for entry in observed.log_lines()
            if entry["event"] == "request" and entry.get("operation_id") == operation_id
        ]
        assert line["trace_id"] == AGENT_TRACE_ID
        assert line["decision"] == "allow"
        request_record = records[-1]
        assert {k: line[k] for k in request_record if k != "kind"} == {
            k: v for k, v in request_record.items() if k != "kind"
        }  # the PostgreSQL record and the log line: same fields, same values
        server = [
            s
            for s in _spans_of(observed.spans, AGENT_TRACE_ID)
            if s.attributes and s.attributes.get("opgate.operation_id") == operation_id
        ]
        [server_span] = [s for s in server if s.name == "opgate.agent_request"]
        [client_span] = [s for s in server if s.name != "opgate.agent_request"]
        assert server_span.parent is not None
        assert format(server_span.parent.span_id, "016x") == AGENT_SPAN_ID
        assert client_span.parent is not None
        assert server_span.context is not None
        assert client_span.parent.span_id == server_span.context.span_id
        attributes = server_span.attributes or {}
        assert attributes["opgate.decision"] == "allow"
        assert attributes["opgate.rule"] == "refund.create"
        assert (attributes["opgate.status_before"], attributes["opgate.status_after"]) == (
            "created",
            "confirmed",
        )
        assert attributes["opgate.provider_status"] == 200
        assert line["span_id"] == format(server_span.context.span_id, "016x")
        # the stable HTTP semantic conventions, on both sides
        assert attributes["url.scheme"] == "http"
        assert attributes["server.address"] == "127.0.0.1"
        assert isinstance(attributes["server.port"], int)
        assert attributes["http.route"]
        assert attributes["http.response.status_code"] == 200
        client = client_span.attributes or {}
        assert client["http.request.method"] == "POST"
        assert client["url.full"].endswith("/v1/refunds")
        assert "http.method" not in client
        assert "http.url" not in client

    [refund] = await list_refunds(localstripe_url, charge=charge)
    assert refund["metadata"]["operation_id"] == stripe_op["operation_id"]
    [received] = fault_provider.requests
    assert received.headers["X-Operation-Id"] == fault_op["operation_id"]
    version, trace_id, parent_id, _ = received.headers["traceparent"].split("-")
    assert (version, trace_id) == ("00", AGENT_TRACE_ID)
    fault_client_span = next(
        s
        for s in _spans_of(observed.spans, AGENT_TRACE_ID)
        if s.name != "opgate.agent_request"
        and (s.attributes or {}).get("opgate.operation_id") == fault_op["operation_id"]
    )
    assert fault_client_span.context is not None
    assert parent_id == format(fault_client_span.context.span_id, "016x") != AGENT_SPAN_ID

    env = {"PATH": "/usr/bin:/bin", "OPGATE_SECRET_AUDIT_KEY": AUDIT_KEY}
    code, shown = await run_cli(
        "audit", "show", fault_op["operation_id"], "--database-url", database_url, env=env
    )
    assert code == 0
    assert shown.splitlines()[0] == f"operation {fault_op['operation_id']}: 4 audit records"
    assert [line.split()[:4:3] for line in shown.splitlines()[3:]] == [
        ["ok", "created"],
        ["ok", "claimed"],
        ["ok", "confirmed"],
        ["ok", "allow"],
    ]
    export = tmp_path / "audit.jsonl"
    code, _ = await run_cli(
        "audit",
        "export",
        "--since",
        "2000-01-01",
        "--until",
        "2999-01-01",
        "--database-url",
        database_url,
        "-o",
        str(export),
        env=env,
    )
    assert code == 0
    exported = [json.loads(line) for line in export.read_text().splitlines()]
    mine = [e for e in exported if e.get("operation_id") == fault_op["operation_id"]]
    assert len(mine) == 4
    assert all(e["audit_hash"] and e["recorded_at"] for e in mine)


async def test_no_sink_holds_a_planted_secret(
    observed: Observed, database_url: str, tmp_path: Path
) -> None:
    """Provider credential, agent tokens (good and wrong), the audit key, a query-string
    value and a configured sensitive field: none reaches the log lines, the spans, the
    PostgreSQL audit records, the export or `audit show`."""
    gate = observed.gate
    planted_ref = "planted-approval-ref-9f8e7d"
    op = await gate.approve(approval_ref=planted_ref)
    await gate.send(
        "/fault/v1/refunds",
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": op["operation_id"], "X-Api-Secret": "planted-header-1"},
    )
    await gate.send("/fault/v1/refunds", data="amount=1", token="opg_wrong_token_planted")
    await gate.send(
        "/fault/v1/refunds?customer=planted-query-2", method="GET", data=None, content_type=None
    )
    await observed.flush()
    env = {"PATH": "/usr/bin:/bin", "OPGATE_SECRET_AUDIT_KEY": AUDIT_KEY}
    export = tmp_path / "audit.jsonl"
    code, _ = await run_cli(
        "audit",
        "export",
        "--since",
        "2000-01-01",
        "--until",
        "2999-01-01",
        "--database-url",
        database_url,
        "-o",
        str(export),
        env=env,
    )
    assert code == 0
    env["OPGATE_AUDIT_REDACT_FIELDS"] = '["approval_ref"]'
    code, shown = await run_cli(
        "audit", "show", op["operation_id"], "--database-url", database_url, env=env
    )
    assert code == 0
    code, _ = await run_cli(
        "audit",
        "export",
        "--since",
        "2000-01-01",
        "--until",
        "2999-01-01",
        "--database-url",
        database_url,
        "-o",
        str(tmp_path / "redacted.jsonl"),
        env=env,
    )
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT record::text AS text FROM audit_log")
        checkpoints = await conn.fetch("SELECT heads::text AS text FROM audit_checkpoints")
    finally:
        await conn.close()
    sinks = {
        "logs": observed.logs.getvalue(),
        "spans": "\n".join(s.to_json() for s in observed.spans.get_finished_spans()),
        "audit rows": "\n".join(r["text"] for r in [*rows, *checkpoints]),
        "export": export.read_text(),
        "redacted export": (tmp_path / "redacted.jsonl").read_text(),
        "show": shown,
    }
    assert "planted-query-2" not in sinks["logs"]  # sanity: the GET was made and logged...
    assert any(e.get("rule") == "read" for e in observed.log_lines())
    secrets = [
        AGENT_TOKEN,
        PROVIDER_SECRET,
        AUDIT_KEY,
        "opg_wrong_token_planted",
        "planted-header-1",
        "planted-query-2",
    ]
    for sink, text in sinks.items():
        assert op["operation_id"] in text, sink  # the sink was really scanned
        for secret in secrets:
            assert secret not in text, (sink, secret)
    # a configured field: redacted wherever opgate renders records (the database keeps what
    # operation_events keeps: docs/audit.md)
    for sink in ("logs", "spans", "redacted export", "show"):
        assert planted_ref not in sinks[sink], sink
    assert '"approval_ref":"[REDACTED]"' in sinks["redacted export"]


async def test_failure_window_query_in_the_docs_runs(
    observed: Observed, fault_provider: FaultProvider, database_url: str
) -> None:
    """The worked example's SQL, run over the log lines and spans of an operation whose
    outcome became unknown, returns its request line and its spans in time order."""
    gate = observed.gate
    op = await gate.approve()
    fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
    status, _, _ = await gate.send(
        "/fault/v1/refunds",
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": op["operation_id"]},
    )
    assert status == 502
    text = DOCS.read_text()
    match = re.search(r"PREPARE failure_window\(text\) AS\n(.*?);\n", text, re.DOTALL)
    assert match is not None
    query = match.group(1)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "CREATE TEMP TABLE logs (line jsonb); CREATE TEMP TABLE spans (span jsonb)"
        )
        await conn.executemany(
            "INSERT INTO logs VALUES ($1::jsonb)",
            [(line,) for line in observed.logs.getvalue().splitlines()],
        )
        await conn.executemany(
            "INSERT INTO spans VALUES ($1::jsonb)",
            [(s.to_json(indent=None),) for s in observed.spans.get_finished_spans()],
        )
        rows = await conn.fetch(query, op["operation_id"])
    finally:
        await conn.close()
    assert [(r["source"], r["what"]) for r in rows] == [
        ("log", "operation_created"),  # the approval, on the operations listener
        ("span", "opgate.agent_request"),
        ("span", "POST"),
        ("log", "request"),
    ]
    assert "error unknown:status created->dispatched" in rows[3]["detail"]
    assert "provider=500" in rows[2]["detail"]
    assert len({r["trace_id"] for r in rows[1:]}) == 1


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = "^" + re.escape(name + (("{" + labels + "}") if labels else "")) + r" (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    assert match is not None, (name, labels, text)
    return float(match.group(1))


async def test_metrics_need_no_token_and_count_what_happened(
    observed: Observed, database_url: str
) -> None:
    """GET /metrics (no admin token): requests by decision and reason, operations by status,
    long-dispatched and escalated operations, pool usage, the upstream latency histogram."""
    gate = observed.gate
    done, waiting, stuck = await gate.approve(), await gate.approve(), await gate.approve()
    await gate.send(
        "/fault/v1/refunds",
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": done["operation_id"]},
    )
    await gate.send("/fault/v1/refunds", data="amount=1", headers={})
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET status = 'dispatched', attempts = 1,"
            " dispatched_at = now() - interval '1 hour', escalated_at = now()"
            " WHERE operation_id = $1",
            stuck["operation_id"],
        )
    finally:
        await conn.close()
    async with gate.http.get(f"{gate.ops_url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    allowed = 'decision="allow",reason="",provider="fault",rule="refund.create"'
    assert _metric(text, "opgate_requests_total", allowed) == 1
    denied = 'decision="deny",reason="operation_required",provider="fault",rule="refund.create"'
    assert _metric(text, "opgate_requests_total", denied) == 1
    assert _metric(text, "opgate_build_info", f'version="{version("opgate")}"') == 1
    policy = gate.running.gateway.policy.version
    assert _metric(text, "opgate_policy_info", f'policy_version="{policy}"') == 1
    assert _metric(text, "opgate_policy_reload_failures_total") == 0
    assert _metric(text, "opgate_operations", 'status="created"') == 1  # waiting
    assert waiting["status"] == "created"
    assert _metric(text, "opgate_operations", 'status="dispatched"') == 1
    assert _metric(text, "opgate_operations_dispatched_too_long") == 1
    assert _metric(text, "opgate_escalations_open") == 1
    assert _metric(text, "opgate_db_pool_max_connections") == 10
    assert _metric(text, "opgate_store_up") == 1
    count = [line for line in text.splitlines() if line.startswith("opgate_upstream_seconds_count")]
    assert len(count) == 1
    assert count[0].endswith(" 1")
    assert '"answer"' in count[0]
    assert "# TYPE opgate_upstream_seconds histogram" in text


async def test_a_5xx_answer_marks_the_server_span_as_an_error(
    observed: Observed, fault_provider: FaultProvider
) -> None:
    """The provider answered 500 (outcome unknown, 502 to the agent): the server span's status
    is ERROR, so a trace view shows the failure without reading attributes."""
    op = await observed.gate.approve()
    fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
    status, _, _ = await observed.gate.send(
        "/fault/v1/refunds",
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": op["operation_id"]},
    )
    assert status == 502
    [span] = [
        s
        for s in observed.spans.get_finished_spans()
        if s.name == "opgate.agent_request"
        and (s.attributes or {}).get("opgate.operation_id") == op["operation_id"]
    ]
    assert span.status.status_code is StatusCode.ERROR
