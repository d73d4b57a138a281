"""Rule path patterns (``/v1/payment_intents/{intent}/capture``) and canonical request paths.

Pure. Patterns are matched segment by segment against a path that has already been checked to
be canonical, so one request path can match a pattern in one way only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PARAM = re.compile(r"^\{([a-z_][a-z0-9_]*)(\.\.\.)?\}$")
_LITERAL = re.compile(r"^[A-Za-z0-9_.~-]+$")
# Unreserved characters plus a few sub-delims that provider ids use; no '%': an escaped byte
# could decode differently at the provider than here.
_CANONICAL_SEGMENT = re.compile(r"^[A-Za-z0-9_.~:@!$'()*+,;=-]+$")


@dataclass(frozen=True)
class Segment:
    literal: str | None = None
    param: str | None = None
    rest: bool = False  # {name...}: the remaining segments, joined by '/'


@dataclass(frozen=True)
class PathPattern:
    text: str
    segments: tuple[Segment, ...]

    @classmethod
    def parse(cls, text: str) -> PathPattern:
        if not text.startswith("/") or text == "/":
            raise ValueError(f"path {text!r} must start with '/' and name at least one segment")
        segments: list[Segment] = []
        names: set[str] = set()
        parts = text[1:].split("/")
        for index, part in enumerate(parts):
            param = _PARAM.match(part)
            if param:
                name, rest = param.group(1), bool(param.group(2))
                if name in names:
                    raise ValueError(f"path {text!r} names parameter {name!r} twice")
                if rest and index != len(parts) - 1:
                    raise ValueError(f"path {text!r}: {{{name}...}} must be the last segment")
                names.add(name)
                segments.append(Segment(param=name, rest=rest))
            elif _LITERAL.match(part) and part not in (".", ".."):
                segments.append(Segment(literal=part))
            else:
                raise ValueError(f"path {text!r}: segment {part!r} is neither literal nor {{name}}")
        return cls(text, tuple(segments))

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(s.param for s in self.segments if s.param is not None)

    def match(self, path: str) -> dict[str, str] | None:
        """The parameters if ``path`` (canonical, see ``is_canonical_path``) matches."""
        parts = path[1:].split("/")
        params: dict[str, str] = {}
        for index, segment in enumerate(self.segments):
            if segment.rest:
                if index >= len(parts):
                    return None
                params[segment.param or ""] = "/".join(parts[index:])
                return params
            if index >= len(parts):
                return None
            if segment.literal is not None and parts[index] != segment.literal:
                return None
            if segment.param is not None:
                params[segment.param] = parts[index]
        return params if len(parts) == len(self.segments) else None

    def render(self, params: dict[str, str]) -> str:
        """The concrete path for approved parameters; raises ValueError if one is bad."""
        missing = set(self.param_names) - set(params)
        extra = set(params) - set(self.param_names)
        if missing or extra:
            raise ValueError(
                f"path {self.text} needs parameters {sorted(self.param_names)}; "
                f"missing {sorted(missing)}, unexpected {sorted(extra)}"
            )
        out: list[str] = []
        for segment in self.segments:
            if segment.literal is not None:
                out.append(segment.literal)
                continue
            value = params[segment.param or ""]
            pieces = value.split("/") if segment.rest else [value]
            if not all(_CANONICAL_SEGMENT.match(p) and p not in (".", "..") for p in pieces):
                raise ValueError(f"path parameter {segment.param}={value!r} is not canonical")
            out.append(value)
        return "/" + "/".join(out)


def is_canonical_path(path: str) -> bool:
    """True for '/a/b' paths without escapes, dot segments, empty segments or a trailing '/'."""
    if not path.startswith("/") or path == "/":
        return False
    return all(
        _CANONICAL_SEGMENT.match(part) and part not in (".", "..") for part in path[1:].split("/")
    )
