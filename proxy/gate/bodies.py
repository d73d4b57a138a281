"""Strict request-body parsing, field lookup, injection and canonical re-serialisation. Pure.

opgate forwards exactly what it validated: the body is parsed once, strictly, checked, and the
canonical serialisation of that parse (plus injections) is what leaves. Anything that could be
read two ways is refused rather than guessed:

- form: a duplicated key, a pair without '=', an empty pair, a bare ';' (some servers split on
  it), a bad percent-escape, bytes that are not UTF-8 once decoded;
- JSON: a duplicated key, NaN/Infinity, an integer outside +-(2**53-1) (a float-based parser at the
  provider would round it), a number whose float does not serialise back to the value written
  (``1e400`` would leave as the bare word ``Infinity``, ``1.00000000000000000001`` as ``1.0``),
  nesting deeper than ``MAX_JSON_DEPTH``, a lone surrogate, a top level that is not an object.

Fields are addressed the way the provider spells them: form keys as sent
(``metadata[operation_id]``), JSON leaves by JSON pointer (``/metadata/operation_id``).
``form_key_readings`` says how bracket parsers (Rack, qs, PHP) may read a form key, so that a key
spelt differently from the injected field but read as it can be refused.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property, lru_cache
from typing import Any
from urllib.parse import quote, quote_plus

from proxy.policy import pointers
from proxy.policy.fields import form_param_parts
from proxy.policy.model import BodyKind

JsonLeaf = str | int | float | bool | None | dict[str, Any] | list[Any]
_MAX_SAFE_INT = 2**53 - 1
_MAX_SAFE_INT_DIGITS = len(str(_MAX_SAFE_INT))
# Objects and arrays nested deeper than this are refused before parsing: no provider API takes
# documents this deep, and every recursive walk of a parsed body (parse, leaves, copy) stays far
# below Python's recursion limit.
MAX_JSON_DEPTH = 64
# A JSON string, terminated or running to the end of the body. Possessive, so that a body of
# unterminated strings is scanned once (no backtracking, no retry per quote).
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENING = frozenset(b"[{")
# What a form body may carry unescaped: printable ASCII but the separators and '%', '+' (space).
_FORM_RAW = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "%&+;=")
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

    def value_at(self, field: str) -> Any:
        """What the body holds at ``field``: a JSON pointer's value (a leaf, or the whole object
        or array below it), a form key's text; ABSENT if nothing is there. A ``*`` (params
        grammar, proxy.policy.fields) yields the list of every array element's value, in order,
        with ABSENT for an element that lacks it."""
        if self.kind is BodyKind.JSON:
            return _json_value(self.json or {}, field.split("/")[1:])
        if self.kind is BodyKind.FORM:
            parts = form_param_parts(field)
            pairs = dict(self.form)
            if parts is None:
                return pairs.get(field, ABSENT)
            return _form_elements(pairs, *parts)
        return ABSENT

    def serialise(self) -> bytes:
        if self.kind is BodyKind.FORM:
            return "&".join(
                f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in self.form
            ).encode("ascii")
        if self.kind is BodyKind.JSON:
            return _dump_json(self.json)
        return b""

    def smallest_size(self) -> int:
        """The fewest bytes a body that parses to this one can have: what an agent must send at
        least (form: every character the parser reads raw left unescaped, space as '+')."""
        if self.kind is BodyKind.FORM:
            return len(
                "&".join(
                    f"{quote_plus(k, safe=_FORM_RAW)}={quote_plus(v, safe=_FORM_RAW)}"
                    for k, v in self.form
                )
            )
        return len(self.serialise())

    @property
    def media_type(self) -> str | None:
        return _MEDIA_TYPES.get(self.kind)


class _Absent:
    """Nothing at that field (distinct from a JSON null)."""

    def __repr__(self) -> str:
        return "absent"


ABSENT: Any = _Absent()


def _json_value(node: Any, tokens: list[str]) -> Any:
    for index, raw in enumerate(tokens):
        if raw == "*":
            if not isinstance(node, list):
                return ABSENT
            return [_json_value(item, tokens[index + 1 :]) for item in node]
        node = pointers.step(node, pointers.unescape(raw))
        if node is pointers.MISSING:
            return ABSENT
    return node


def _form_elements(pairs: dict[str, str], before: str, after: str) -> Any:
    """``items[0][sku]``, ``items[1][sku]``... as a list; ABSENT if no index is sent, and a
    gap (``items[0]``, ``items[2]``) leaves ABSENT at the missing position, never a shift."""
    pattern = re.compile(re.escape(before) + r"\[(0|[1-9][0-9]*)\]" + re.escape(after))
    found = {int(m.group(1)): v for k, v in pairs.items() if (m := pattern.fullmatch(k))}
    if not found:
        return ABSENT
    return [found.get(i, ABSENT) for i in range(max(found) + 1)]


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
    _check_depth(raw)
    try:
        text = raw.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_constant=_reject_constant,
            parse_int=_safe_int,
            parse_float=_exact_float,
        )
    except UnicodeDecodeError as exc:
        raise BodyRejected("JSON body is not UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise BodyRejected(f"JSON body does not parse: {exc.msg} at {exc.pos}") from exc
    if not isinstance(value, dict):
        raise BodyRejected("JSON body must be an object")
    _reject_lone_surrogates(value)
    return value


def _check_depth(raw: bytes) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH before the recursive parser sees it (30,000
    levels would otherwise end in a RecursionError). Brackets inside strings do not count; up to
    the first syntax error this reads the structure exactly as json.loads does."""
    depth = 0
    for byte in _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS):
        if byte in _OPENING:
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise BodyRejected(f"JSON body is nested deeper than {MAX_JSON_DEPTH} levels")
        else:
            depth -= 1


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
    if len(text.lstrip("-")) > _MAX_SAFE_INT_DIGITS:  # before int(): it refuses 4,300+ digits
        raise BodyRejected(f"integer {text[:20]}... is outside the range every parser reads alike")
    value = int(text)
    if abs(value) > _MAX_SAFE_INT:
        raise BodyRejected(f"integer {text} is outside the range every JSON parser reads alike")
    return value


def _exact_float(text: str) -> float:
    """The float, if serialising it gives back the value written: ``0.1`` and ``1.5e3`` pass,
    ``1e400`` (infinity), ``1e-400`` (zero) and ``1.00000000000000000001`` (1.0) do not, since
    what would leave is not what was checked."""
    value = float(text)
    if not math.isfinite(value) or Decimal(repr(value)) != Decimal(text):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise BodyRejected(f"JSON number {shown} cannot be kept exactly as a double")
    return value


def _dump_json(document: Any) -> bytes:
    # allow_nan=False: a non-finite float must never leave as the bare word Infinity or NaN
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


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
            escaped = pointers.escape(key)
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
        document = copy.deepcopy(body.json or {})  # the checked parse stays intact
        node, leaf = _parent_object(document, field, create=True)
        if leaf in node and node[leaf] != value:
            raise BodyRejected(f"{field} is set by opgate")
        node[leaf] = value
        return ParsedBody(BodyKind.JSON, json=document)
    return body


def with_value(body: ParsedBody, field: str, value: str) -> ParsedBody:
    """``body`` with the field it holds set to ``value`` (in place, order kept); a field it does
    not hold stays absent. For writing the approved spelling of a value the checks accepted."""
    if body.kind is BodyKind.FORM:
        return ParsedBody(
            BodyKind.FORM, form=tuple((k, value if k == field else v) for k, v in body.form)
        )
    if body.kind is BodyKind.JSON and field in body.fields():
        document = copy.deepcopy(body.json or {})
        node, leaf = _parent_object(document, field, create=False)
        node[leaf] = value
        return ParsedBody(BodyKind.JSON, json=document)
    return body


def body_from_fields(kind: BodyKind, fields: Mapping[str, Any]) -> ParsedBody:
    """The body holding exactly ``fields`` (form values are text; JSON fields are pointers).
    A ``*`` field (params grammar) takes a list: one element per array index, in order."""
    if kind is BodyKind.FORM:
        pairs: list[tuple[str, str]] = []
        for key, value in fields.items():
            parts = form_param_parts(key)
            values = value if parts is not None and isinstance(value, list) else [value]
            for index, item in enumerate(values):
                if not isinstance(item, str):
                    raise BodyRejected("form fields are text")
                pairs.append((f"{parts[0]}[{index}]{parts[1]}" if parts else key, item))
        return ParsedBody(BodyKind.FORM, form=tuple(pairs))
    if kind is BodyKind.JSON:
        root: dict[str, Any] = {}
        for pointer, value in fields.items():
            tokens = pointer.split("/")[1:]
            if not tokens:
                raise BodyRejected("the whole body is not a field")
            if len(tokens) > MAX_JSON_DEPTH:  # bounded as a body's nesting is (_check_depth)
                raise BodyRejected(f"a pointer deeper than {MAX_JSON_DEPTH} levels")
            _put(root, pointers.unescape(tokens[0]), tokens[1:], value, pointer)
        _no_holes(root)
        return ParsedBody(BodyKind.JSON, json=root)
    if fields:
        raise BodyRejected("this call takes no body")
    return ParsedBody(BodyKind.NONE)


_HOLE: Any = object()  # an array position no field has filled yet


def _put(parent: Any, key: Any, tokens: list[str], value: Any, pointer: str) -> None:
    """Write ``value`` at ``tokens`` below ``parent[key]``, creating objects and arrays."""
    if not tokens:
        if isinstance(parent, dict) and key in parent:
            raise BodyRejected(f"{pointer} is written twice")
        if isinstance(parent, list) and parent[key] is not _HOLE:
            raise BodyRejected(f"{pointer} is written twice")
        parent[key] = value
        return
    name, rest = tokens[0], tokens[1:]
    if name == "*":
        if not isinstance(value, list):
            raise BodyRejected(f"{pointer} takes a list, one value per element")
        child = _container(parent, key, list, pointer)
        child.extend([_HOLE] * (len(value) - len(child)))
        for index, item in enumerate(value):
            _put(child, index, rest, item, pointer)
        return
    _put(_container(parent, key, dict, pointer), pointers.unescape(name), rest, value, pointer)


def _container(parent: Any, key: Any, kind: type, pointer: str) -> Any:
    present = key in parent if isinstance(parent, dict) else parent[key] is not _HOLE
    if not present:
        parent[key] = kind()
    child = parent[key]
    if not isinstance(child, kind):
        raise BodyRejected(f"{pointer}: {key!r} is not an {'array' if kind is list else 'object'}")
    return child


def _no_holes(node: Any) -> None:
    if isinstance(node, dict):
        for item in node.values():
            _no_holes(item)
    elif isinstance(node, list):
        for item in node:
            if item is _HOLE:
                raise BodyRejected("the approved lists leave an array element empty")
            _no_holes(item)


def _parent_object(document: dict[str, Any], pointer: str, *, create: bool) -> tuple[Any, str]:
    """The object holding ``pointer``'s last token, and that token (parent objects created on
    demand). A token that indexes an array (``/purchase_units/0/custom_id``) steps into an
    element the body already has; arrays are never grown, and the holder is always an object."""
    node: Any = document
    *parents, leaf = pointers.tokens(pointer)
    for name in parents:
        if isinstance(node, list):
            position = pointers.array_index(name)
            if position is None or position >= len(node):
                raise BodyRejected(f"{pointer}: the array has no element {name!r}")
            child = node[position]
        else:
            child = node.setdefault(name, {}) if create else node.get(name)
        if not isinstance(child, dict | list):
            raise BodyRejected(f"{pointer}: {name!r} is not an object")
        node = child
    if not isinstance(node, dict):
        raise BodyRejected(f"{pointer}: its parent is not an object")
    return node, leaf


# How bracket parsers split a form key into the path of names they store its value under.
_KEY_SEPARATORS = re.compile(r"[\[\].]")
_BRACKET_GROUP = re.compile(r"\[([^\[\]]*)\]")
_DOTTED_NAME = re.compile(r"\.([^.\[]+)")


def form_key_readings(key: str) -> set[tuple[str, ...]]:
    """The paths a common bracket parser may store a form key's value under:

    - runs: every run between ``[``, ``]`` and ``.`` is a name (dots: qs; Rack 2 skips any brackets
      around a name, so ``metadata]operation_id`` is ``metadata[operation_id]`` to it; PHP
      drops what follows a closing bracket and leading spaces; Rack 3 reads ``[name]`` groups);
    - groups: the text before the first ``[...]`` group, then every group wherever it stands
      (qs skips what lies between groups: ``[a]x[b]`` is ``a[b]`` to it), on the key as sent
      and with qs's ``allowDots`` (``a.b`` is ``a[b]``).

    Names are stripped of surrounding spaces; empty runs are dropped. Whatever path one of
    those parsers reads a key as begins like one of these readings (tests/gate/test_bodies.py
    models the parsers and checks it), which may also flag keys none of them would confuse: a
    refusal, never a guess. A plain ``a[b][c]`` has the one reading ``("a", "b", "c")``."""
    readings = {tuple(name for part in _KEY_SEPARATORS.split(key) if (name := part.strip()))}
    for text in (key, _DOTTED_NAME.sub(r"[\1]", key)):
        groups = list(_BRACKET_GROUP.finditer(text))
        parent = (text[: groups[0].start()] if groups else text).strip()
        readings.add((*([parent] if parent else []), *(g.group(1).strip() for g in groups)))
    return readings


def reads_as_field(kind: BodyKind, field: str, target: str) -> bool:
    """Whether a provider may read ``field``, which is not ``target``, as ``target`` or as
    something inside it: a form key that a bracket parser splits into a path starting with
    ``target``'s, a JSON pointer below ``target``."""
    if field == target:
        return False
    if kind is BodyKind.JSON:
        return field.startswith(target + "/")
    if kind is BodyKind.FORM:
        if len(field) > _CACHED_KEY_LENGTH:
            return _form_key_reads_as(field, target)
        return _form_key_reads_as_cached(field, target)
    return False


def _form_key_reads_as(field: str, target: str) -> bool:
    targets = form_key_readings(target)
    return any(
        reading[: len(path)] == path for path in targets for reading in form_key_readings(field)
    )


# Every request asks this of each of its keys, and keys repeat from request to request: the
# answers are kept, for keys short enough that the cache stays small whatever agents send.
_CACHED_KEY_LENGTH = 256
_form_key_reads_as_cached = lru_cache(maxsize=4096)(_form_key_reads_as)
