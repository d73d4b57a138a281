"""``opgate policy check``: every problem of a policy directory, with its place and a fix. Pure.

Beyond what loading refuses (YAML, schema, unknown keys, duplicate names and prefixes), it finds
what loads but cannot be meant:

- a rule that can never match, because an earlier rule of the same method matches every path
  it does (pairwise: a rule covered only by several earlier rules together is not reported);
- two providers sending to the same upstream (scheme, host and base path) whose rules overlap:
  one endpoint reachable through two policies is governed by the weaker one;
- a rule comparing the field opgate injects the operation id into (or a parent or child of it),
  or a form-field injection on a JSON rule (and the reverse): the injection cannot work;
- a credential secret that is not configured: a warning, unless the check is told where the
  deployment's secrets are (``--secrets-dir``), when it is an error;
- a field a rule can never read: on a JSON rule every field must be a JSON pointer, on a form
  rule a form key; ``*`` where it means nothing (proxy.policy.fields); a parameter compared
  both whole and element by element; an idempotency key that a rule's requests cannot carry;
- spend budgets on a provider none of whose rules reads an amount (a warning: they count
  nothing);
- a rule without an operation that takes a body: only a read's query may go unapproved (the
  gate refuses a query on every rule that takes an operation or a body), and a body there would
  be forwarded unchecked.
- a reconcile lookup on a rule that writes the operation id nowhere (``inject_metadata:
  false``, or no ``metadata_injection``): it matches on the id, so it can never find the
  effect (a warning: every unknown outcome of the rule goes to a human).

A file that fails the schema still has its rules checked one by one, where they parse: one
typo does not hide the findings that would follow it.

Errors make ``opgate policy check`` exit non-zero, and a reload or a start refuse the set.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ValidationError

from proxy.policy.fields import never_matches, param_matcher
from proxy.policy.load import (
    PolicyProblem,
    cross_file_problems,
    is_payments_text,
    parse_policy_text,
    parse_yaml_model,
)
from proxy.policy.model import (
    BodyKind,
    FormFieldInjection,
    OAuth2ClientCredentials,
    OperationRequirement,
    Provider,
    Rule,
)
from proxy.policy.paths import PathPattern, Segment
from proxy.policy.payments import PaymentsPolicy

SCHEMA_HINT = "see the policy JSON Schema (`opgate policy schema`)"


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    column: int
    message: str
    hint: str | None = None
    severity: Severity = Severity.ERROR

    def __str__(self) -> str:
        level = "warning: " if self.severity is Severity.WARNING else ""
        fix = f"; fix: {self.hint}" if self.hint else ""
        return f"{self.file}:{self.line}:{self.column}: {level}{self.message}{fix}"

    def as_problem(self) -> PolicyProblem:
        return PolicyProblem(self.file, self.line, self.column, self.message)


@dataclass(frozen=True)
class SecretsCheck:
    """Whether a named secret is configured, and whether a missing one is an error."""

    configured: Callable[[str], bool]
    required: bool


def lint_policy_texts(
    texts: list[tuple[Path, str]], secrets: SecretsCheck | None = None
) -> list[Finding]:
    """Every finding for the files ``texts`` (path, content), in file order."""
    findings: list[Finding] = []
    parsed: list[tuple[Provider, Path, yaml.Node]] = []
    for path, text in texts:
        if is_payments_text(text):  # the set's payment limits: no rules to lint
            _, problems = parse_yaml_model(text, str(path), PaymentsPolicy)
            findings.extend(_from_problem(p) for p in problems)
            continue
        provider, problems = parse_policy_text(text, str(path))
        findings.extend(_from_problem(p) for p in problems)
        if provider is None and problems:
            findings.extend(_rules_of_unloadable_file(text, str(path)))
        if provider is not None:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            assert node is not None  # it parsed into a provider
            parsed.append((provider, path, node))
    findings.extend(
        Finding(
            p.file,
            p.line,
            p.column,
            p.message,
            "each provider name and route prefix belongs to one file: rename or merge them",
        )
        for p in cross_file_problems([(provider, path) for provider, path, _ in parsed])
    )
    for provider, path, node in parsed:
        findings.extend(_shadowed_rules(provider, str(path), node))
        findings.extend(_injection_collisions(provider, str(path), node))
        findings.extend(_reads_with_a_body(provider, str(path), node))
        for j, rule in enumerate(provider.rules):
            findings.extend(_field_grammar(rule, str(path), node, j))
        findings.extend(_key_placement(provider, str(path), node))
        findings.extend(_idle_budgets(provider, str(path), node))
        findings.extend(_blind_lookups(provider, str(path), node))
        if secrets is not None:
            findings.extend(_unconfigured_secret(provider, str(path), node, secrets))
    findings.extend(_overlaps_across_files(parsed))
    return findings


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.ERROR]


# --- path patterns ------------------------------------------------------------------------------


def pattern_covers(wide: PathPattern, narrow: PathPattern) -> bool:
    """Whether every path ``narrow`` matches is matched by ``wide`` too."""
    w, n = wide.segments, narrow.segments
    if w and w[-1].rest:
        fixed = len(w) - 1
        # narrow's paths must have at least len(w) segments, the first `fixed` covered one-to-one
        if _min_length(n) < len(w):
            return False
        return all(_segment_covers(w[i], n[i]) for i in range(fixed))
    if n and n[-1].rest:
        return False  # narrow matches arbitrarily long paths, wide a fixed number of segments
    return len(w) == len(n) and all(_segment_covers(a, b) for a, b in zip(w, n, strict=True))


def patterns_overlap(a: PathPattern, b: PathPattern) -> bool:
    """Whether some path matches both."""
    sa, sb = a.segments, b.segments
    a_rest, b_rest = bool(sa and sa[-1].rest), bool(sb and sb[-1].rest)
    fixed_a, fixed_b = len(sa) - a_rest, len(sb) - b_rest
    if not a_rest and not b_rest and len(sa) != len(sb):
        return False
    if a_rest and not b_rest and len(sb) < len(sa):
        return False
    if b_rest and not a_rest and len(sa) < len(sb):
        return False
    for i in range(min(fixed_a, fixed_b)):
        x, y = sa[i], sb[i]
        if x.literal is not None and y.literal is not None and x.literal != y.literal:
            return False
    return True


def _min_length(segments: tuple[Segment, ...]) -> int:
    return len(segments)  # a {rest...} segment takes at least one path segment


def _segment_covers(wide: Segment, narrow: Segment) -> bool:
    if narrow.rest:
        return False
    if wide.param is not None:
        return True
    return narrow.literal is not None and narrow.literal == wide.literal


# --- the findings -------------------------------------------------------------------------------


def _shadowed_rules(provider: Provider, file: str, root: yaml.Node) -> Iterator[Finding]:
    for j, later in enumerate(provider.rules):
        for i, earlier in enumerate(provider.rules[:j]):
            if earlier.method == later.method and pattern_covers(earlier.path, later.path):
                line = _mark(_node(root, ("rules", i)))[0]
                yield _at(
                    file,
                    _node(root, ("rules", j, "path")),
                    f"rule {later.name!r} can never match: rule {earlier.name!r} (line {line}) "
                    f"matches every {later.method} {later.path.text} request first",
                    f"move {later.name!r} above {earlier.name!r}, or narrow the path of "
                    f"{earlier.name!r}",
                )
                break


def _reads_with_a_body(provider: Provider, file: str, root: yaml.Node) -> Iterator[Finding]:
    """A rule without an operation is forwarded unchecked: its query is all a read carries
    (gate.intake refuses a query on every other rule), so a body there would be a parameter
    nothing approves. ``body`` defaults to ``form``: a read must say ``body: none``."""
    for j, rule in enumerate(provider.rules):
        if rule.operation is OperationRequirement.NONE and rule.body is not BodyKind.NONE:
            yield _at(
                file,
                _node(root, ("rules", j, "body")) or _node(root, ("rules", j)),
                f"rule {rule.name!r} takes no operation but a {rule.body.value} body: it would "
                "be forwarded unchecked (a read's query is its only parameter)",
                "set `body: none` on a read, or `operation: required` if the call needs a body",
            )


def _injection_collisions(provider: Provider, file: str, root: yaml.Node) -> Iterator[Finding]:
    injection = provider.metadata_injection
    if injection is None:
        return
    form_injection = isinstance(injection, FormFieldInjection)
    for j, rule in enumerate(provider.rules):
        field = provider.metadata_field(rule)
        if field is None or rule.body is BodyKind.NONE:
            continue
        if form_injection != (rule.body is BodyKind.FORM):
            kind = "form_field" if form_injection else "json_pointer"
            yield _at(
                file,
                _node(root, ("rules", j, "body")) or _node(root, ("rules", j)),
                f"rule {rule.name!r} takes a {rule.body.value} body but metadata_injection "
                f"is a {kind}: opgate could not inject the operation id",
                "set `inject_metadata: false` on the rule, or use the injection kind of its body",
            )
            continue
        for where, named in _compared_fields(rule):
            if _same_or_nested(field, named, form=form_injection):
                key = where[0]
                yield _at(
                    file,
                    _node(root, ("rules", j, *where)),
                    f"rule {rule.name!r} compares {named!r} ({key}), but opgate sets {field!r} "
                    "to the operation id",
                    f"remove {named!r} from {key}, or set `inject_metadata: false` on the rule",
                )


def _field_grammar(rule: Rule, file: str, root: yaml.Node, j: int) -> Iterator[Finding]:
    """Fields the rule's body kind can never hold, or patterns that can never match."""
    if rule.body is BodyKind.NONE:
        return
    json = rule.body is BodyKind.JSON
    named: list[tuple[tuple[str, int] | tuple[str], str]] = [
        *_compared_fields(rule),
        *((("free", i), f) for i, f in enumerate(rule.free)),
    ]
    for where, field in named:
        why = never_matches(field, json=json, role=where[0])
        if why is not None:
            yield _at(
                file,
                _node(root, ("rules", j, *where)),
                f"rule {rule.name!r}: {why}; it would refuse or miss every request",
                "name JSON body fields by pointer (/a/b), form fields by key (a[b])",
            )
    for a in rule.params:
        for b in rule.params:
            if a != b and param_matcher(a, json=json).fullmatch(b):
                yield _at(
                    file,
                    _node(root, ("rules", j, "params")),
                    f"rule {rule.name!r} compares {b!r} inside {a!r}, which is compared whole",
                    f"keep one of {a!r} and {b!r}",
                )


def _key_placement(provider: Provider, file: str, root: yaml.Node) -> Iterator[Finding]:
    """Every rule that takes an operation must be able to carry its idempotency key."""
    key = provider.idempotency
    if key.body_field is not None:
        for kind in (BodyKind.JSON, BodyKind.FORM):
            uses = any(
                r.body is kind and r.operation is OperationRequirement.REQUIRED
                for r in provider.rules
            )
            why = never_matches(key.body_field, json=kind is BodyKind.JSON, role="body_field")
            if uses and why is not None:
                yield _at(
                    file,
                    _node(root, ("idempotency", "body_field")),
                    f"idempotency.body_field: {why} (a {kind.value} rule carries the key)",
                    "give the key's field in the spelling of the rules' body",
                )
    if key.header is not None or not key.takes_key:  # no key: operations are named by header
        return
    for j, rule in enumerate(provider.rules):
        required = rule.operation is OperationRequirement.REQUIRED and rule.send_key
        if required and rule.body is BodyKind.NONE:
            yield _at(
                file,
                _node(root, ("rules", j, "body")) or _node(root, ("rules", j)),
                f"rule {rule.name!r} takes no body and the idempotency key has no header: "
                "its requests could not carry the key",
                "give the key a header too (idempotency.header), or give the rule a body",
            )


def _idle_budgets(provider: Provider, file: str, root: yaml.Node) -> Iterator[Finding]:
    """A budget counts the amounts of rules that read one: with none, it caps nothing."""
    if provider.budgets and all(rule.amount is None for rule in provider.rules):
        yield _at(
            file,
            _node(root, ("budgets",)),
            f"provider {provider.provider!r} has budgets but no rule reads an amount: "
            "they count nothing",
            "name the amount field of the rules that move money (`amount:`)",
            Severity.WARNING,
        )


def _blind_lookups(provider: Provider, file: str, root: yaml.Node) -> Iterator[Finding]:
    """A lookup finds the effect whose ``match`` field holds the operation id opgate wrote
    into the request: a rule that writes it nowhere has lookups that can never match."""
    for j, rule in enumerate(provider.rules):
        if rule.reconcile is None or provider.metadata_field(rule) is not None:
            continue
        why = (
            "inject_metadata: false"
            if provider.metadata_injection is not None
            else "the provider has no metadata_injection"
        )
        for k, lookup in enumerate(rule.reconcile.lookups):
            yield _at(
                file,
                _node(root, ("rules", j, "reconcile", "lookups", k)),
                f"rule {rule.name!r}: the lookup {lookup.path} matches {lookup.match} against "
                f"the operation id, which opgate writes nowhere on this call ({why}): it can "
                "never match, and every unknown outcome goes to a human",
                "inject the operation id (metadata_injection, inject_metadata_at), or drop the "
                "lookup (docs/how-to/apis-without-idempotency.md)",
                Severity.WARNING,
            )


def _rules_of_unloadable_file(text: str, file: str) -> Iterator[Finding]:
    """The rule-level findings of a file that failed the schema, for the rules that parse."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    rules = data.get("rules") if isinstance(data, dict) else None
    if root is None or not isinstance(rules, list):
        return
    for j, item in enumerate(rules):
        try:
            rule = Rule.model_validate(item)
        except ValidationError:
            continue  # its own errors are already reported
        yield from _field_grammar(rule, file, root, j)


def _compared_fields(rule: Rule) -> Iterator[tuple[tuple[str, int] | tuple[str], str]]:
    """Each field the rule compares with the approval, and where it is written."""
    if rule.amount:
        yield ("amount",), rule.amount
    if rule.currency:
        yield ("currency",), rule.currency
    for index, name in enumerate(rule.params):
        yield ("params", index), name


def _same_or_nested(a: str, b: str, *, form: bool) -> bool:
    if a == b:
        return True
    child = "[" if form else "/"
    return a.startswith(b + child) or b.startswith(a + child)


def _unconfigured_secret(
    provider: Provider, file: str, root: yaml.Node, secrets: SecretsCheck
) -> Iterator[Finding]:
    credential = provider.credential
    if credential is None:
        return
    named = [("secret", credential.secret)]
    if isinstance(credential, OAuth2ClientCredentials) and credential.client_id_secret:
        named.append(("client_id_secret", credential.client_id_secret))
    for key, name in named:
        if secrets.configured(name):
            continue
        yield _at(
            file,
            _node(root, ("credential", key)),
            f"secret {name!r} of provider {provider.provider!r} is not configured",
            f"set OPGATE_SECRET_{name.upper()} or write <secrets_dir>/"
            f"{name}; until then its requests are refused (credential_unavailable)",
            Severity.ERROR if secrets.required else Severity.WARNING,
        )


def _overlaps_across_files(parsed: list[tuple[Provider, Path, yaml.Node]]) -> Iterator[Finding]:
    for b, (later, later_path, later_root) in enumerate(parsed):
        for earlier, earlier_path, earlier_root in parsed[:b]:
            if _upstream_key(earlier.upstream) != _upstream_key(later.upstream):
                continue
            for j, rule in enumerate(later.rules):
                other_index = next(
                    (
                        i
                        for i, other in enumerate(earlier.rules)
                        if other.method == rule.method and patterns_overlap(other.path, rule.path)
                    ),
                    None,
                )
                if other_index is None:
                    continue
                other = earlier.rules[other_index]
                line = _mark(_node(earlier_root, ("rules", other_index)))[0]
                yield _at(
                    str(later_path),
                    _node(later_root, ("rules", j, "path")),
                    f"rule {rule.name!r} overlaps rule {other.name!r} of provider "
                    f"{earlier.provider!r} ({earlier_path}:{line}): {rule.method} requests to "
                    f"{later.upstream} can go through either policy",
                    "give each upstream endpoint one rule in one provider file",
                )


def _upstream_key(upstream: str) -> tuple[str, str, str]:
    parts = urlsplit(upstream)
    default_port = {"http": 80, "https": 443}[parts.scheme]
    host = f"{(parts.hostname or '').lower()}:{parts.port or default_port}"
    return parts.scheme, host, parts.path.rstrip("/")


# --- places and hints ---------------------------------------------------------------------------


def _node(root: yaml.Node, path: tuple[str | int, ...]) -> yaml.Node | None:
    node: yaml.Node | None = root
    for part in path:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            node = next((v for k, v in node.value if k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            node = node.value[part] if part < len(node.value) else None
        else:
            return None
    return node


def _mark(node: yaml.Node | None) -> tuple[int, int]:
    if node is None:
        return 1, 1
    return node.start_mark.line + 1, node.start_mark.column + 1


def _at(
    file: str,
    node: yaml.Node | None,
    message: str,
    hint: str,
    severity: Severity = Severity.ERROR,
) -> Finding:
    line, column = _mark(node)
    return Finding(file, line, column, message, hint, severity)


_UNKNOWN_KEY = re.compile(r"^(?P<loc>[^:]*): Extra inputs are not permitted$")


def _from_problem(problem: PolicyProblem) -> Finding:
    return Finding(
        problem.file, problem.line, problem.column, problem.message, _hint(problem.message)
    )


def _hint(message: str) -> str:
    unknown = _UNKNOWN_KEY.match(message)
    if unknown:
        *parent, key = unknown.group("loc").split(".")
        allowed = sorted(_fields_at(Provider, parent))
        close = difflib.get_close_matches(key, allowed, n=1)
        if close:
            return f"did you mean {close[0]!r}? (allowed here: {', '.join(allowed)})"
        return f"remove it (allowed here: {', '.join(allowed)})"
    if message.startswith("duplicate key"):
        return "YAML would keep only the last one: remove the other"
    if message.startswith("YAML does not parse"):
        return "check the indentation and quoting at this place"
    if "must require an operation" in message:
        return "remove `operation: none`: only GET and HEAD may go without an operation"
    if "is used twice" in message:
        return "rule names are the operations' `action`: give each rule its own"
    if message.endswith("the file is empty") or "no *.yaml policy files" in message:
        return "a policy file holds one provider: version, provider, route_prefix, upstream, rules"
    return SCHEMA_HINT


def _fields_at(model: type[BaseModel], loc: list[str]) -> set[str]:
    """The keys the model at a pydantic error location accepts (a union: all its members')."""
    models = [model]
    for part in loc:
        if part.isdigit():
            continue  # a list index: the element type was taken with the field
        found: list[type[BaseModel]] = []
        for current in models:
            field = current.model_fields.get(part)
            if field is not None:
                found.extend(_models_in(field.annotation))
        if not found:
            return set().union(*(m.model_fields for m in models))
        models = found
    return set().union(*(m.model_fields for m in models))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or args:
        return [m for arg in args for m in _models_in(arg)]
    return []
