"""Redaction for every sink that leaves opgate: log lines, span attributes, audit rows, exports.

Two rules, applied to any nested structure of dicts, lists and strings:
- a value under a sensitive key (built in: credentials, tokens, cookies; plus the configured
  ``audit_redact_fields``) is replaced by ``[REDACTED]``;
- a known secret value (each provider credential opgate is configured with, the audit key) is
  cut out of any string it appears in, whatever the key.
Records are built from named facts, never from headers or bodies, so this is the second line of
defence, not the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

REDACTED = "[REDACTED]"
# Compared lowercased, with '-' read as '_'.
BUILTIN_SENSITIVE_KEYS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "cookie",
        "set_cookie",
        "token",
        "agent_token",
        "admin_token",
        "password",
        "secret",
        "api_key",
        "credential",
        "credentials",
        "audit_key",
    }
)
_MIN_SECRET_LENGTH = 6  # shorter "secrets" would redact ordinary words


def _normal(key: str) -> str:
    return key.lower().replace("-", "_")


_SCALARS = frozenset({int, float, bool})
_KNOWN_KEYS = 4096


class Redactor:
    def __init__(self, fields: Iterable[str] = (), secrets: Iterable[str] = ()) -> None:
        self._keys = BUILTIN_SENSITIVE_KEYS | {_normal(f) for f in fields}
        self._secrets = tuple(
            sorted({s for s in secrets if len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True)
        )
        # Whether each key seen so far is sensitive: records and log lines repeat the same few
        # dozen keys on every request. Bounded, since some keys come from outside.
        self._sensitive: dict[str, bool] = {}

    def is_sensitive(self, key: str) -> bool:
        known = self._sensitive.get(key)
        if known is None:
            known = _normal(key) in self._keys
            if len(self._sensitive) < _KNOWN_KEYS:
                self._sensitive[key] = known
        return known

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value

    def value(self, value: Any) -> Any:
        if value is None or type(value) in _SCALARS:  # most of a record: no ABC check
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return self.mapping(value)
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value

    def mapping(self, data: Mapping[str, Any]) -> dict[str, Any]:
        # A record's values are mostly scalars, None and strings holding no secret: those are
        # copied as they are without a call each (this runs for every request's record).
        texts = self._secrets and "\x00".join(v for v in data.values() if type(v) is str)
        clean = not texts or not any(secret in texts for secret in self._secrets)
        redacted: dict[str, Any] = {}
        known = self._sensitive
        for key, value in data.items():
            sensitive = known.get(key)
            if sensitive is None:
                sensitive = self.is_sensitive(str(key))
            if sensitive:
                redacted[key] = REDACTED
            elif value is None or type(value) in _SCALARS or (clean and type(value) is str):
                redacted[key] = value
            else:
                redacted[key] = self.value(value)
        return redacted


# The process's redactor for log lines: structlog's configuration is process-wide too.
_log_redactor = Redactor()


def set_log_redactor(redactor: Redactor) -> None:
    global _log_redactor
    _log_redactor = redactor


# Set while a log line whose fields were redacted already is written (the audit record:
# redacted once for every sink), so the processor below does not do it again.
ALREADY_REDACTED: ContextVar[bool] = ContextVar("opgate_log_line_redacted", default=False)


def redact_record(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A record redacted by the process's redactor, once, for the log line and the audit log."""
    return _log_redactor.mapping(fields)


def redact_log_line(_logger: object, _method: str, event_dict: Any) -> Any:
    """structlog processor: the log line as it will be rendered, redacted (unless its fields
    were, and nothing but opgate's own trace ids and timestamps was added since)."""
    if ALREADY_REDACTED.get():
        return event_dict
    return _log_redactor.mapping(event_dict)
