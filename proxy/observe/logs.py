"""structlog configuration: one JSON object per line on stdout.

The audit line (one per agent request, audit.py) is the record's stored JSON with the line's
own fields (level, time logged, trace ids) appended, written straight to stdout while the
configuration ``configure_logging`` installed is in force: the record is redacted and turned
into JSON once, for the log line and the audit log alike. Under any other configuration (a
test's capture, a deployment's own) the line goes through structlog's processors as every
other line does.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO, cast

import structlog

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
    printer: structlog.PrintLogger
    info_enabled: bool


_installed: _Installed | None = None


def configure_logging(level: str = "info") -> None:
    global _installed
    processors = log_processors()
    threshold = logging.getLevelNamesMapping()[level.upper()]
    wrapper = structlog.make_filtering_bound_logger(threshold)
    # Guarded: a log sink that fails (EPIPE, ENOSPC) is counted and fails readiness, and never
    # raises into whoever logs (sinks.py).
    # (GuardedStream has what print needs of a TextIO: write and flush.)
    factory = structlog.PrintLoggerFactory(cast(TextIO, GuardedStream(sys.stdout)))
    structlog.configure(
        processors=processors,
        wrapper_class=wrapper,
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    _installed = _Installed(
        config=(processors, wrapper, factory),
        line_fields=processors[:-2],  # log_processors(): then the redaction, the renderer
        printer=factory(),
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
        installed.printer.msg(with_line_fields(record_json, fields, installed.line_fields))

    return write


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
