"""Reading the audit records among log lines captured with ``structlog.testing.capture_logs``."""

from __future__ import annotations

from typing import Any


def audits(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request records among ``logs``, in order."""
    return [entry for entry in logs if entry["event"] == "request"]
