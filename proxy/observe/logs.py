"""structlog configuration: one JSON object per line on stdout."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from proxy.observe.auditlog.redact import redact_log_line
from proxy.observe.telemetry import add_trace_ids


def log_processors() -> list[Any]:
    """The processor chain of opgate's log lines (tests render through the same one)."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="logged_at"),
        structlog.processors.format_exc_info,
        add_trace_ids,  # trace_id, span_id of the current span (proxy/observe/telemetry.py)
        redact_log_line,  # last before rendering: nothing secret is written
        structlog.processors.JSONRenderer(),
    ]


def configure_logging(level: str = "info") -> None:
    structlog.configure(
        processors=log_processors(),
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
