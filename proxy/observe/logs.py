"""structlog configuration: one JSON object per line on stdout.

The audit line (one per agent request, audit.py) is the record's stored JSON with the line's
own fields (level, time logged, trace ids, run) appended, written straight to stdout while the
configuration ``configure_logging`` installed is in force: the record is redacted and turned
into JSON once, for the log line and the audit log alike, and the line's own fields are
rendered directly, not by the processors (``_own_fields``: the same bytes). Under any other
configuration (a test's capture, a deployment's own) the line goes through structlog's
processors as every other line does.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO, cast

import structlog
from opentelemetry import trace

from proxy.observe.auditlog.redact import redact_log_line
from proxy.observe.sinks import GuardedStream
from proxy.observe.telemetry import add_trace_ids

# Writes one prerendered info line: (the record's JSON object, the record's fields).
PrerenderedWriter = Callable[[str, Mapping[str, Any]], None]

# The run of this process's audit writer (its ``run_id``, as in its ``started`` record and in
# ``audit_instance_runs``), once it has started: every line carries it. A line's
# ``instance_seq`` is numbered from 1 again by each run, and a restart keeps the instance id,
# so only (run_id, instance_seq) names one record in a stream that several runs (or
# ``--workers``) write to.
_run_id: str | None = None


def bind_run(run_id: str | None) -> None:
    """From now on, every line names this run (None: no run, as before the writer starts)."""
    global _run_id
    _run_id = run_id


def add_run_id(logger: Any, method: str, event_dict: Any) -> Any:
    """The run that numbers this process's records, where the line does not name one."""
    if _run_id is not None:
        event_dict.setdefault("run_id", _run_id)
    return event_dict


def _line_fields() -> list[Any]:
    """The processors that add a line's own fields, before redaction and rendering."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="logged_at"),
        structlog.processors.format_exc_info,
        add_trace_ids,  # trace_id, span_id of the current span (proxy/observe/telemetry.py)
        add_run_id,
    ]


def log_processors() -> list[Any]:
    """The processor chain of opgate's log lines (tests render through the same one)."""
    return [
        *_line_fields(),
        redact_log_line,  # last before rendering: nothing secret is written
        structlog.processors.JSONRenderer(),
    ]


@dataclass(frozen=True)
class _Installed:
    """What ``configure_logging`` gave structlog, and what a prerendered line needs."""

    config: tuple[Any, ...]  # processors, wrapper class, logger factory: compared by identity
    line_fields: list[Any]
    printer: LineLogger
    info_enabled: bool


_installed: _Installed | None = None


def configure_logging(level: str = "info") -> None:
    global _installed
    processors = log_processors()
    threshold = logging.getLevelNamesMapping()[level.upper()]
    wrapper = structlog.make_filtering_bound_logger(threshold)
    # Guarded: a log sink that fails (EPIPE, ENOSPC) is counted and fails readiness, and never
    # raises into whoever logs (sinks.py).
    printer = LineLogger(cast(TextIO, GuardedStream(sys.stdout)))

    def factory(*args: Any) -> LineLogger:
        return printer

    structlog.configure(
        processors=processors,
        wrapper_class=wrapper,
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    _installed = _Installed(
        config=(processors, wrapper, factory),
        line_fields=processors[:-2],  # log_processors(): then the redaction, the renderer
        printer=printer,
        info_enabled=threshold <= logging.INFO,
    )


def prerendered_writer(config: Mapping[str, Any]) -> PrerenderedWriter | None:
    """While ``config`` (``structlog.get_config()``) is what ``configure_logging`` installed:
    a writer of the info line structlog would write for a record, given the record's JSON
    object. None under any other configuration."""
    installed = _installed
    if installed is None:
        return None
    current = (config.get("processors"), config.get("wrapper_class"), config.get("logger_factory"))
    if any(now is not then for now, then in zip(current, installed.config, strict=True)):
        return None
    if not installed.info_enabled:
        return _filtered_out

    def write(record_json: str, fields: Mapping[str, Any]) -> None:
        if structlog.contextvars.get_contextvars():  # opgate binds none; whoever does: theirs
            installed.printer.msg(with_line_fields(record_json, fields, installed.line_fields))
            return
        own = _own_fields(fields)
        if not own:
            line = record_json
        elif record_json == "{}":
            line = "{" + own + "}"
        else:
            line = record_json[:-1] + "," + own + "}"
        installed.printer.msg(line)

    return write


def _own_fields(fields: Mapping[str, Any]) -> str:
    """The line's own fields as ``_line_fields``' processors add them to an info line without
    bound context variables, rendered as ``with_line_fields`` renders them (``"name":value``,
    comma-separated, in the processors' order, those the record has left out), without
    running the processors or the JSON encoder: this is every request's work. The same bytes
    (tests/observe/test_logs.py compares them over many records)."""
    own: list[str] = []
    if "level" not in fields:
        own.append('"level":"info"')
    if "logged_at" not in fields:  # TimeStamper(fmt="iso", utc=True)'s stamp
        own.append('"logged_at":"' + datetime.now(UTC).isoformat().replace("+00:00", "Z") + '"')
    context = trace.get_current_span().get_span_context()
    if context.is_valid:  # add_trace_ids
        if "trace_id" not in fields:
            own.append(f'"trace_id":"{context.trace_id:032x}"')
        if "span_id" not in fields:
            own.append(f'"span_id":"{context.span_id:016x}"')
    if _run_id is not None and "run_id" not in fields:
        own.append('"run_id":' + json.dumps(_run_id))
    return ",".join(own)


class LineLogger:
    """What ``structlog.PrintLogger`` is to a stream (each line, then a newline, then a flush,
    under a lock), with the line and its newline in one write. One for the process: the audit
    line's writer writes through it too, so no two lines interleave whichever thread writes."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        with self._lock:
            self._stream.write(message + "\n")
            self._stream.flush()

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _filtered_out(record_json: str, fields: Mapping[str, Any]) -> None:
    """The level filters info lines out: structlog would write nothing either."""


def with_line_fields(record_json: str, fields: Mapping[str, Any], line_fields: list[Any]) -> str:
    """``record_json`` (the JSON object of ``fields``) with the line's own fields appended, as
    the processors add them to a line of ``fields``: a field the record has keeps the record's
    value (the trace ids are added only where missing; no record has a level or a logging time).
    """
    added: dict[str, Any] = {}
    for processor in line_fields:
        added = processor(None, "info", added)
    added = {name: value for name, value in added.items() if name not in fields}
    if not added:
        return record_json
    rendered = json.dumps(added, separators=(",", ":"))
    if record_json == "{}":
        return rendered
    return record_json[:-1] + "," + rendered[1:]
