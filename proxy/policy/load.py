"""Load a policy directory: every ``*.yaml`` file, every error reported as ``file:line:col``.

``*.tests.yaml`` files are not policies: they hold a policy's test cases (``opgate policy
test``) and are skipped here, so they never change the set or its version.

All files are read and all errors collected before anything is refused, so the platform team
sees every problem in one run. YAML's silent "last duplicate key wins" is an error here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from proxy.policy.model import Provider
from proxy.policy.payments import NO_LIMITS, PaymentsPolicy, is_payments_document
from proxy.policy.set import PolicySet


@dataclass(frozen=True)
class PolicyProblem:
    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


class PolicyLoadError(Exception):
    """The policy set is invalid; ``problems`` lists every one."""

    def __init__(self, problems: list[PolicyProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def load_policy_dir(directory: Path) -> PolicySet:
    """Parse and validate every policy file; raises PolicyLoadError listing all problems."""
    return build_policy_set(read_policy_texts(directory), str(directory))


def read_policy_texts(directory: Path) -> list[tuple[Path, str]]:
    """Each policy file and its text, read once (a set is built from one reading)."""
    return [(path, path.read_text("utf-8")) for path in policy_files(directory)]


def policy_version(texts: list[tuple[Path, str]]) -> str:
    """The digest of the files that make a set: what audit records name."""
    digest = hashlib.sha256()
    for path, text in texts:
        digest.update(path.name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:16]


def build_policy_set(texts: list[tuple[Path, str]], directory: str) -> PolicySet:
    problems: list[PolicyProblem] = []
    providers: list[tuple[Provider, Path]] = []
    payments: list[PaymentsPolicy] = []
    payments_files: list[Path] = []
    if not texts:
        raise PolicyLoadError([PolicyProblem(directory, 1, 1, "no *.yaml policy files found")])
    for path, text in texts:
        if is_payments_text(text):
            limits, file_problems = parse_yaml_model(text, str(path), PaymentsPolicy)
            problems.extend(file_problems)
            payments_files.append(path)
            if limits is not None:
                payments.append(limits)
            continue
        provider, file_problems = parse_policy_text(text, str(path))
        problems.extend(file_problems)
        if provider is not None:
            providers.append((provider, path))
    problems.extend(cross_file_problems(providers))
    for path in payments_files[1:]:
        problems.append(
            PolicyProblem(
                str(path),
                1,
                1,
                f"the payment limits are declared once (also in {payments_files[0]})",
            )
        )
    if problems:
        raise PolicyLoadError(problems)
    x402_limits = payments[0].payments.x402 if payments else NO_LIMITS
    return PolicySet(
        tuple(p for p, _ in providers), version=policy_version(texts), x402_limits=x402_limits
    )


def is_payments_text(text: str) -> bool:
    """Whether a policy file is the set's payments file (``payments:``, no ``provider:``); a
    file that does not parse is read as a provider's, which reports why."""
    try:
        return is_payments_document(yaml.safe_load(text))
    except yaml.YAMLError:
        return False


TESTS_SUFFIX = ".tests.yaml"
_Model = TypeVar("_Model", bound=BaseModel)


def policy_files(directory: Path) -> list[Path]:
    """The policy files of a directory, in load order: ``*.yaml`` but not ``*.tests.yaml``."""
    if not directory.is_dir():
        return []
    return sorted(
        p for p in directory.glob("*.yaml") if p.is_file() and not p.name.endswith(TESTS_SUFFIX)
    )


def parse_policy_text(text: str, file: str) -> tuple[Provider | None, list[PolicyProblem]]:
    return parse_yaml_model(text, file, Provider)


def parse_yaml_model(
    text: str, file: str, model: type[_Model]
) -> tuple[_Model | None, list[PolicyProblem]]:
    """Strict YAML (no duplicate keys) validated as ``model``; every problem with its place."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        # the problem alone: str(exc) spans several lines and repeats the marks
        problem = getattr(exc, "problem", None) or str(exc).replace("\n", " ")
        context = getattr(exc, "context", None)
        if context:
            problem = f"{problem} ({context})"
        return None, [PolicyProblem(file, line, col, f"YAML does not parse: {problem}")]
    if node is None:
        return None, [PolicyProblem(file, 1, 1, "the file is empty")]
    duplicates = list(_duplicate_keys(node, file))
    if duplicates:
        return None, duplicates
    data = yaml.safe_load(text)
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, [_problem_from_error(file, node, err) for err in exc.errors()]


def _duplicate_keys(node: yaml.Node, file: str) -> list[PolicyProblem]:
    found: list[PolicyProblem] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = str(key.value)
            if name in seen:
                mark = key.start_mark
                found.append(
                    PolicyProblem(file, mark.line + 1, mark.column + 1, f"duplicate key {name!r}")
                )
            seen.add(name)
            found.extend(_duplicate_keys(value, file))
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found.extend(_duplicate_keys(item, file))
    return found


def _problem_from_error(file: str, root: yaml.Node, err: Any) -> PolicyProblem:
    loc = tuple(err.get("loc", ()))
    node = _node_at(root, loc, at_key=err.get("type") == "extra_forbidden")
    mark = node.start_mark
    where = ".".join(str(part) for part in loc) or "(file)"
    return PolicyProblem(file, mark.line + 1, mark.column + 1, f"{where}: {err['msg']}")


def _node_at(root: yaml.Node, loc: tuple[Any, ...], *, at_key: bool = False) -> yaml.Node:
    """The deepest YAML node along a pydantic error location (for its line and column);
    with ``at_key`` (an unknown key), the last step points at the key, not its value."""
    node = root
    for index, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            pair: tuple[yaml.Node, yaml.Node] | None = next(
                ((k, v) for k, v in node.value if k.value == part), None
            )
            if pair is None:
                return node
            if at_key and index == len(loc) - 1:
                return pair[0]
            node = pair[1]
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
        else:
            return node
    return node


def cross_file_problems(providers: list[tuple[Provider, Path]]) -> list[PolicyProblem]:
    """Names and route prefixes must be unique; reported against the later file."""
    problems: list[PolicyProblem] = []
    seen_names: dict[str, str] = {}
    seen_prefixes: dict[str, str] = {}
    for provider, path in providers:
        if provider.provider in seen_names:
            problems.append(
                PolicyProblem(
                    str(path),
                    1,
                    1,
                    f"provider {provider.provider!r} is defined twice "
                    f"(also in {seen_names[provider.provider]})",
                )
            )
        seen_names.setdefault(provider.provider, str(path))
        if provider.route_prefix in seen_prefixes:
            problems.append(
                PolicyProblem(
                    str(path),
                    1,
                    1,
                    f"route prefix {provider.route_prefix} is used by "
                    f"{seen_prefixes[provider.route_prefix]} and {provider.provider}",
                )
            )
        seen_prefixes.setdefault(provider.route_prefix, provider.provider)
    return problems
