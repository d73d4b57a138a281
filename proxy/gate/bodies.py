"""Strict request-body parsing, field lookup, injection and canonical re-serialisation. Pure.

opgate forwards exactly what it validated: the body is parsed once, strictly, checked, and the
canonical serialisation of that parse (plus injections) is what leaves. Anything that could be
read two ways is refused rather than guessed:

- form: a duplicated key, a pair without '=', an empty pair, a bare ';' (some servers split on
  it), a bad percent-escape, bytes that are not UTF-8 once decoded;
- JSON: a duplicated key, NaN/Infinity, an integer outside +-(2**53-1) (a float-based parser at the
  provider would round it), a lone surrogate, a top level that is not an object.

Fields are addressed the way the provider spells them: form keys as sent
(``metadata[operation_id]``), JSON leaves by JSON pointer (``/metadata/operation_id``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import quote

from proxy.policy.model import BodyKind

JsonLeaf = str | int | float | bool | None | dict[str, Any] | list[Any]
_MAX_SAFE_INT = 2**53 - 1
_PERCENT = re.compile(rb"%([0-9A-Fa-f]{2})")
_MEDIA_TYPES = {
    BodyKind.FORM: "application/x-www-form-urlencoded",
    BodyKind.JSON: "application/json",
}


class BodyRejected(ValueError):
    """The body (or its content type) cannot be read one way only."""

    def __init__(self, message: str, *, content_type: bool = False) -> None:
        super().__init__(message)
        self.content_type = content_type


@dataclass(frozen=True)
class ParsedBody:
    kind: BodyKind
    form: tuple[tuple[str, str], ...] = ()  # ordered pairs, keys unique
    json: dict[str, Any] | None = None

    def fields(self) -> dict[str, JsonLeaf]:
        """Every leaf, addressed the way rules name fields (computed once: every payload check
        asks for it)."""
        return self._fields

    @cached_property
    def _fields(self) -> dict[str, JsonLeaf]:
        if self.kind is BodyKind.FORM:
            return dict(self.form)
        if self.kind is BodyKind.JSON and self.json:  # an empty object has no leaves
            return dict(_json_leaves(self.json, ""))
        return {}

    def serialise(self) -> bytes:
        if self.kind is BodyKind.FORM:
            return "&".join(
                f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in self.form
            ).encode("ascii")
        if self.kind is BodyKind.JSON:
            return json.dumps(self.json, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return b""

    @property
    def media_type(self) -> str | None:
        return _MEDIA_TYPES.get(self.kind)


def parse_body(kind: BodyKind, content_types: list[str], raw: bytes) -> ParsedBody:
    """Parse ``raw`` strictly as ``kind``; ``content_types`` are every Content-Type header sent."""
    if kind is BodyKind.NONE:
        if raw:
            raise BodyRejected("this call takes no body")
        return ParsedBody(BodyKind.NONE)
    _check_content_type(kind, content_types, raw)
    if kind is BodyKind.FORM:
        return ParsedBody(BodyKind.FORM, form=parse_form(raw))
    return ParsedBody(BodyKind.JSON, json=parse_json_object(raw))


def _check_content_type(kind: BodyKind, content_types: list[str], raw: bytes) -> None:
    if not content_types:
        if raw:
            raise BodyRejected("a body needs a Content-Type", content_type=True)
        return
    if len(content_types) > 1:
        raise BodyRejected("Content-Type is sent more than once", content_type=True)
    media, *params = [part.strip() for part in content_types[0].split(";")]
    if media.lower() != _MEDIA_TYPES[kind]:
        raise BodyRejected(
            f"this rule takes {_MEDIA_TYPES[kind]}, not {media or 'nothing'}", content_type=True
        )
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() != "charset" or value.strip().strip('"').lower() != "utf-8":
            raise BodyRejected(f"unsupported Content-Type parameter {param!r}", content_type=True)


def parse_form(raw: bytes) -> tuple[tuple[str, str], ...]:
    if not raw:
        return ()
    if b";" in raw:
        raise BodyRejected("a bare ';' in a form body is read as a separator by some servers")
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for part in raw.split(b"&"):
        if not part:
            raise BodyRejected("empty pair in form body")
        if b"=" not in part:
            raise BodyRejected("form pair without '='")
        raw_key, raw_value = part.split(b"=", 1)
        key, value = _form_decode(raw_key), _form_decode(raw_value)
        if not key:
            raise BodyRejected("empty key in form body")
        if key in seen:
            raise BodyRejected(f"form key {key!r} is sent more than once")
        seen.add(key)
        pairs.append((key, value))
    return tuple(pairs)


def _form_decode(raw: bytes) -> str:
    if any(b < 0x21 or b > 0x7E for b in raw):
        raise BodyRejected("form bodies must be percent-encoded ASCII")
    spaced = raw.replace(b"+", b" ")
    if spaced.count(b"%") != len(_PERCENT.findall(spaced)):
        raise BodyRejected("malformed percent-escape in form body")
    decoded = _PERCENT.sub(lambda m: bytes([int(m.group(1), 16)]), spaced)
    try:
        return decoded.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRejected("form body is not UTF-8 once decoded") from exc


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if raw.startswith(b"\xef\xbb\xbf"):
        raise BodyRejected("JSON body starts with a byte-order mark")
    try:
        text = raw.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_constant=_reject_constant,
            parse_int=_safe_int,
        )
    except UnicodeDecodeError as exc:
        raise BodyRejected("JSON body is not UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise BodyRejected(f"JSON body does not parse: {exc.msg} at {exc.pos}") from exc
    if not isinstance(value, dict):
        raise BodyRejected("JSON body must be an object")
    _reject_lone_surrogates(value)
    return value


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise BodyRejected(f"JSON key {key!r} is sent more than once")
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise BodyRejected(f"JSON constant {name} is not allowed")


def _safe_int(text: str) -> int:
    value = int(text)
    if abs(value) > _MAX_SAFE_INT:
        raise BodyRejected(f"integer {text} is outside the range every JSON parser reads alike")
    return value


def _reject_lone_surrogates(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BodyRejected("JSON string holds a lone surrogate") from exc
    elif isinstance(value, dict):
        for key, item in value.items():
            _reject_lone_surrogates(key)
            _reject_lone_surrogates(item)
    elif isinstance(value, list):
        for item in value:
            _reject_lone_surrogates(item)


def _json_leaves(value: Any, prefix: str) -> list[tuple[str, JsonLeaf]]:
    if isinstance(value, dict) and value:
        out: list[tuple[str, JsonLeaf]] = []
        for key, item in value.items():
            escaped = key.replace("~", "~0").replace("/", "~1")
            out.extend(_json_leaves(item, f"{prefix}/{escaped}"))
        return out
    if isinstance(value, list) and value:
        return [
            leaf for i, item in enumerate(value) for leaf in _json_leaves(item, f"{prefix}/{i}")
        ]
    return [(prefix, value)]


def inject(body: ParsedBody, field: str, value: str) -> ParsedBody:
    """``body`` with ``field`` set to ``value``; BodyRejected if the agent set it otherwise."""
    if body.kind is BodyKind.FORM:
        existing = dict(body.form).get(field)
        if existing is not None:
            if existing != value:
                raise BodyRejected(f"{field} is set by opgate")
            return body
        return ParsedBody(BodyKind.FORM, form=(*body.form, (field, value)))
    if body.kind is BodyKind.JSON:
        document = json.loads(json.dumps(body.json))  # a deep copy; the checked parse stays intact
        node: Any = document
        *parents, leaf = [p.replace("~1", "/").replace("~0", "~") for p in field.split("/")[1:]]
        for name in parents:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise BodyRejected(f"{field}: {name!r} is not an object")
            node = child
        if leaf in node and node[leaf] != value:
            raise BodyRejected(f"{field} is set by opgate")
        node[leaf] = value
        return ParsedBody(BodyKind.JSON, json=document)
    return body
