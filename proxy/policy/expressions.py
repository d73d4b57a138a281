"""Precondition assertions: a small, safe expression form, parsed here and evaluated here.

An assertion compares two sides with exactly one operator; a side is a sum of terms::

    /refunded == false
    /amount_refunded + approved.amount <= /amount
    /status in ["succeeded", "pending"]

    term      := pointer | literal | approved
    pointer   := an RFC 6901 JSON pointer into the lookup's answer: /a/b/0 (~0 is ~, ~1 is /)
    literal   := "json string" | integer | true | false | null | [literal, ...]
    approved  := approved.amount | approved.currency | approved.params.<name>
                 | approved.path_params.<name>
    operator  := == | != | <= | < | >= | > | in

No parentheses, no ``and``/``or`` (a rule lists several assertions, all of which must hold), no
second operator: ``a == b == c`` is refused, not read one way or the other. Nothing is passed to
``eval``; the tokenizer accepts only the characters above. Types are strict, as in JSON: ``+``
and the orderings take numbers only (never booleans), ``==`` holds only between values of the
same JSON type, ``in`` needs a list on its right.

Pure: parsing is done by the policy loader (a malformed assertion is a policy error), and
``evaluate`` runs on a lookup's answer and the approved operation, both given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.policy import pointers

OPERATORS = ("==", "!=", "<=", "<", ">=", ">", "in")
APPROVED_FIELDS = ("amount", "currency")
APPROVED_MAPS = ("params", "path_params")


class ExpressionError(ValueError):
    """The assertion is not in the expression form (the message says where and why)."""


@dataclass(frozen=True)
class Pointer:
    text: str  # as written, e.g. /amount_refunded

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(pointers.tokens(self.text))


@dataclass(frozen=True)
class Literal:
    value: Any  # a JSON value: str, int, bool, None, or a list of those


@dataclass(frozen=True)
class Approved:
    field: str  # amount | currency | params | path_params
    name: str | None = None  # the parameter's name, for params and path_params

    @property
    def text(self) -> str:
        return f"approved.{self.field}" + (f".{self.name}" if self.name is not None else "")


Term = Pointer | Literal | Approved


@dataclass(frozen=True)
class Side:
    terms: tuple[Term, ...]  # more than one: their sum


@dataclass(frozen=True)
class Assertion:
    text: str
    left: Side
    operator: str
    right: Side

    def terms(self) -> tuple[Term, ...]:
        return self.left.terms + self.right.terms

    def pointers(self) -> tuple[Pointer, ...]:
        return tuple(t for t in self.terms() if isinstance(t, Pointer))


# --- tokenizer -------------------------------------------------------------------------------
_POINTER = re.compile(r"/(?:[A-Za-z0-9_.-]|~[01])*(?:/(?:[A-Za-z0-9_.-]|~[01])*)*")
_APPROVED = re.compile(r"approved\.[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_\[\]/*-]+)?")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PUNCT = ("==", "!=", "<=", ">=", "<", ">", "+", "[", "]", ",")
_WORD_LITERALS = {"true": True, "false": False, "null": None}
_DIGITS = frozenset("0123456789")
_WORD_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")


@dataclass(frozen=True)
class _Token:
    kind: str  # op, punct, term
    text: str
    at: int
    term: Term | None = None


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == " ":
            i += 1
            continue
        if ch == "/":
            m = _POINTER.match(text, i)
            assert m is not None  # "/" alone matches
            out.append(_Token("term", m.group(), i, Pointer(m.group())))
            i = m.end()
        elif ch == '"':
            m = _STRING.match(text, i)
            if m is None:
                raise ExpressionError(f"at {i}: an unterminated or malformed string")
            out.append(_Token("term", m.group(), i, Literal(json.loads(m.group()))))
            i = m.end()
        elif ch == "-" or ch in _DIGITS:
            m = _NUMBER.match(text, i)
            if m is None:
                raise ExpressionError(f"at {i}: {ch!r} does not start a number")
            out.append(_Token("term", m.group(), i, Literal(int(m.group()))))
            i = m.end()
        elif text.startswith("approved.", i):
            m = _APPROVED.match(text, i)
            if m is None:
                raise ExpressionError(f"at {i}: malformed approved reference")
            out.append(_Token("term", m.group(), i, _approved(m.group(), i)))
            i = m.end()
        elif ch in _WORD_START:
            m = _WORD.match(text, i)
            assert m is not None
            word = m.group()
            if word == "in":
                out.append(_Token("op", word, i))
            elif word in _WORD_LITERALS:
                out.append(_Token("term", word, i, Literal(_WORD_LITERALS[word])))
            else:
                raise ExpressionError(
                    f"at {i}: {word!r} is not a pointer, a literal or approved.<field>"
                )
            i = m.end()
        else:
            punct = next((p for p in _PUNCT if text.startswith(p, i)), None)
            if punct is None:
                raise ExpressionError(f"at {i}: unexpected {ch!r}")
            kind = "op" if punct in OPERATORS else "punct"
            out.append(_Token(kind, punct, i))
            i += len(punct)
        # a term must be followed by a space, an operator or punctuation, never glued to
        # another term ("/a/b" is one pointer; "1true" is refused)
        if out[-1].kind == "term" and i < len(text) and (text[i].isalnum() or text[i] in '/"_'):
            raise ExpressionError(f"at {i}: {text[out[-1].at : i + 1]!r} runs two terms together")
    return out


def _approved(text: str, at: int) -> Approved:
    parts = text.split(".", 2)
    field = parts[1]
    name = parts[2] if len(parts) == 3 else None
    if field in APPROVED_FIELDS and name is None:
        return Approved(field)
    if field in APPROVED_MAPS and name is not None:
        return Approved(field, name)
    raise ExpressionError(
        f"at {at}: {text!r}: approved values are approved.amount, approved.currency, "
        "approved.params.<name> and approved.path_params.<name>"
    )


# --- parser ----------------------------------------------------------------------------------
def parse(text: str) -> Assertion:
    """One assertion, or ExpressionError saying what is wrong with it."""
    if not text.strip():
        raise ExpressionError("an empty assertion")
    if any(c in text for c in "\t\r\n"):
        raise ExpressionError("an assertion is one line, spaces only")
    tokens = _tokens(text)
    position = 0

    def side() -> tuple[Side, int]:
        nonlocal position
        terms = [term()]
        while position < len(tokens) and tokens[position].text == "+":
            position += 1
            terms.append(term())
        return Side(tuple(terms)), position

    def term() -> Term:
        nonlocal position
        if position >= len(tokens):
            raise ExpressionError("the assertion ends where a value was expected")
        token = tokens[position]
        if token.text == "[":
            return list_literal()
        if token.kind != "term" or token.term is None:
            raise ExpressionError(f"at {token.at}: {token.text!r} where a value was expected")
        position += 1
        return token.term

    def list_literal() -> Literal:
        nonlocal position
        start = tokens[position].at
        position += 1
        items: list[Any] = []
        while True:
            if position >= len(tokens):
                raise ExpressionError(f"at {start}: an unclosed list")
            if tokens[position].text == "]" and not items:
                position += 1
                return Literal(items)
            item = term()
            if not isinstance(item, Literal):
                raise ExpressionError(f"at {start}: a list holds literals only")
            items.append(item.value)
            if position < len(tokens) and tokens[position].text == ",":
                position += 1
                continue
            if position < len(tokens) and tokens[position].text == "]":
                position += 1
                return Literal(items)
            raise ExpressionError(f"at {start}: a list's items are separated by commas")

    left, _ = side()
    if position >= len(tokens) or tokens[position].kind != "op":
        where = tokens[position].at if position < len(tokens) else len(text)
        raise ExpressionError(f"at {where}: an assertion needs one of {' '.join(OPERATORS)}")
    operator = tokens[position].text
    position += 1
    right, _ = side()
    if position < len(tokens):
        token = tokens[position]
        raise ExpressionError(
            f"at {token.at}: {token.text!r} after a complete assertion (one operator each; "
            "list several assertions instead)"
        )
    return Assertion(text, left, operator, right)


# --- validation against the rule (policy check) ---------------------------------------------
def _static_type(term: Term, approved_types: Mapping[str, str]) -> str | None:
    """The JSON type a term is known to have before any lookup (None: known only then)."""
    if isinstance(term, Literal):
        return _json_type(term.value)
    if isinstance(term, Approved) and term.name is None:
        return approved_types.get(term.field)
    return None


def problems(
    assertion: Assertion,
    *,
    has_amount: bool,
    has_currency: bool,
    params: frozenset[str],
    path_params: frozenset[str],
) -> list[str]:
    """What is wrong with ``assertion`` on a rule with these approved fields: values the rule
    never approves, and types that can never compare (a string summed, a number ``in`` a
    string)."""
    found: list[str] = []
    for term in assertion.terms():
        if not isinstance(term, Approved):
            continue
        if term.field == "amount" and not has_amount:
            found.append(f"{term.text}: the rule approves no amount")
        elif term.field == "currency" and not has_currency:
            found.append(f"{term.text}: the rule approves no currency")
        elif term.field == "params" and term.name not in params:
            found.append(f"{term.text}: not among the rule's params {sorted(params)}")
        elif term.field == "path_params" and term.name not in path_params:
            found.append(f"{term.text}: the rule's path has no {{{term.name}}}")
    types = {"amount": "number", "currency": "string"}
    sides = (assertion.left, assertion.right)
    side_types: list[str | None] = []
    for side in sides:
        known = [_static_type(t, types) for t in side.terms]
        if len(side.terms) > 1:
            wrong = [t for t, k in zip(side.terms, known, strict=True) if k not in (None, "number")]
            for term in wrong:
                found.append(f"{_shown(term)} is a {_static_type(term, types)}: + sums numbers")
            side_types.append("number")
        else:
            side_types.append(known[0])
    left, right = side_types
    op = assertion.operator
    if op in ("<", "<=", ">", ">="):
        for t in (left, right):
            if t not in (None, "number"):
                found.append(f"{op} orders numbers, not a {t}")
    elif op == "in":
        if right not in (None, "array"):
            found.append(f"in needs a list on its right, not a {right}")
        if right == "array" and left is not None:
            items = assertion.right.terms[0]
            assert isinstance(items, Literal)
            if not any(_json_type(v) == left for v in items.value):
                found.append(f"no item of {json.dumps(items.value)} is a {left}")
    elif left is not None and right is not None and left != right:
        always = "false" if op == "==" else "true"
        found.append(f"a {left} and a {right} are never equal: {op} is always {always}")
    return found


def _shown(term: Term) -> str:
    if isinstance(term, Pointer):
        return term.text
    if isinstance(term, Approved):
        return term.text
    return json.dumps(term.value)


# --- evaluation ------------------------------------------------------------------------------
# A pointer into the answer that names nothing, or an approved value the operation lacks.
MISSING = pointers.MISSING


@dataclass(frozen=True)
class Outcome:
    """One assertion on one answer: ``held`` True/False, or None when it could not be
    evaluated (``why``); ``values`` are what each pointer and approved value read as."""

    text: str
    held: bool | None
    values: dict[str, Any]
    why: str | None = None
    skipped: bool = False  # it names an approved value this operation does not have
    absent: tuple[str, ...] = ()  # pointers and approved values that read as nothing

    def as_evidence(self) -> dict[str, Any]:
        evidence: dict[str, Any] = {"require": self.text, "values": self.values}
        if self.absent:
            evidence["absent"] = list(self.absent)
        if self.skipped:
            evidence["skipped"] = self.why
        else:
            evidence["held"] = self.held
            if self.why is not None:
                evidence["why"] = self.why
        return evidence


def evaluate(assertion: Assertion, answer: Any, approved: Mapping[str, Any]) -> Outcome:
    """``answer``: the lookup's parsed JSON; ``approved``: amount, currency, params and
    path_params of the operation (an absent amount or currency is None)."""
    values: dict[str, Any] = {}
    absent: list[str] = []
    for term in assertion.terms():
        if isinstance(term, Literal):
            continue
        value = (
            resolve(answer, term) if isinstance(term, Pointer) else _approved_value(term, approved)
        )
        if value is MISSING:
            absent.append(term.text)
        else:
            values[term.text] = value
    for term in assertion.terms():
        if isinstance(term, Approved) and _approved_value(term, approved) is MISSING:
            why = f"{term.text} is not approved"
            return Outcome(assertion.text, None, values, why, True, tuple(absent))
    try:
        left = _side_value(assertion.left, answer, approved)
        right = _side_value(assertion.right, answer, approved)
        held = _compare(left, assertion.operator, right)
    except _Unevaluable as exc:
        return Outcome(assertion.text, None, values, str(exc), absent=tuple(absent))
    return Outcome(assertion.text, held, values)


class _Unevaluable(Exception):
    pass


def resolve(document: Any, pointer: Pointer) -> Any:
    return pointers.resolve(document, pointer.parts)


def _approved_value(term: Approved, approved: Mapping[str, Any]) -> Any:
    if term.name is None:
        value = approved.get(term.field)
        return MISSING if value is None else value
    mapping = approved.get(term.field) or {}
    return mapping.get(term.name, MISSING)


def _term_value(term: Term, answer: Any, approved: Mapping[str, Any]) -> Any:
    if isinstance(term, Literal):
        return term.value
    value = resolve(answer, term) if isinstance(term, Pointer) else _approved_value(term, approved)
    if value is MISSING:
        raise _Unevaluable(f"{_shown(term)} is absent")
    return value


def _side_value(side: Side, answer: Any, approved: Mapping[str, Any]) -> Any:
    values = [_term_value(t, answer, approved) for t in side.terms]
    if len(values) == 1:
        return values[0]
    if not all(_is_number(v) for v in values):
        raise _Unevaluable(f"+ sums numbers, not {[_json_type(v) for v in values]}")
    return sum(values)


def _compare(left: Any, operator: str, right: Any) -> bool:
    if operator == "==":
        return _same(left, right)
    if operator == "!=":
        return not _same(left, right)
    if operator == "in":
        if not isinstance(right, list):
            raise _Unevaluable(f"in needs a list on its right, not a {_json_type(right)}")
        return any(_same(left, item) for item in right)
    if not (_is_number(left) and _is_number(right)):
        kinds = f"{_json_type(left)} and {_json_type(right)}"
        raise _Unevaluable(f"{operator} orders numbers, not {kinds}")
    return bool(
        {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[operator]
    )


def _same(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if _json_type(a) != _json_type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
