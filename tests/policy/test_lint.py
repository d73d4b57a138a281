"""`opgate policy check` (proxy/policy/lint.py): a broken-policy corpus, one fixture per error
class under tests/fixtures/policies/, with the exact message and place of each finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.policy.lint import (
    SecretsCheck,
    Severity,
    lint_policy_texts,
    pattern_covers,
    patterns_overlap,
)
from proxy.policy.model import Rule
from proxy.policy.paths import PathPattern
from tests.support.opgate import SHIPPED_POLICIES
from tests.support.paths import FIXTURES

CORPUS = FIXTURES / "policies"
NO_SECRETS = SecretsCheck(lambda name: False, required=False)
RULE_KEYS = ", ".join(sorted(Rule.model_fields))

CASES = [
    (
        "yaml_syntax",
        "yaml_syntax.yaml:8:10: YAML does not parse: mapping values are not allowed here; "
        "fix: check the indentation and quoting at this place",
    ),
    (
        "duplicate_key",
        "duplicate_key.yaml:10:5: duplicate key 'amount'; "
        "fix: YAML would keep only the last one: remove the other",
    ),
    (
        "schema_error",
        "schema_error.yaml:7:13: rules.0.method: Input should be 'GET', 'HEAD', 'POST', 'PUT', "
        "'PATCH' or 'DELETE'; fix: see the policy JSON Schema (`opgate policy schema`)",
    ),
    (
        "unknown_key",
        "unknown_key.yaml:9:5: rules.0.parms: Extra inputs are not permitted; "
        f"fix: did you mean 'params'? (allowed here: {RULE_KEYS})",
    ),
    (
        "duplicate_rule_name",
        "duplicate_rule_name.yaml:6:3: rules: Value error, rule name 'refund.create' is used "
        "twice; fix: rule names are the operations' `action`: give each rule its own",
    ),
    (
        "shadowed_rule",
        "shadowed_rule.yaml:11:11: rule 'intent.cancel' can never match: rule 'intent.any' "
        "(line 6) matches every POST /v1/payment_intents/{intent}/cancel request first; "
        "fix: move 'intent.cancel' above 'intent.any', or narrow the path of 'intent.any'",
    ),
    (
        "read_with_body",
        "read_with_body.yaml:6:5: rule 'read' takes no operation but a form body: it would be "
        "forwarded unchecked (a read's query is its only parameter); "
        "fix: set `body: none` on a read, or `operation: required` if the call needs a body",
    ),
    (
        "injection_collision",
        "injection_collision.yaml:10:22: rule 'refund.create' compares 'metadata[operation_id]' "
        "(params), but opgate sets 'metadata[operation_id]' to the operation id; "
        "fix: remove 'metadata[operation_id]' from params, or set `inject_metadata: false` "
        "on the rule",
    ),
    (
        "injection_kind_mismatch",
        "injection_kind_mismatch.yaml:10:11: rule 'transfer.create' takes a json body but "
        "metadata_injection is a form_field: opgate could not inject the operation id; "
        "fix: set `inject_metadata: false` on the rule, or use the injection kind of its body",
    ),
    (
        "unconfigured_secret",
        "unconfigured_secret.yaml:5:61: warning: secret 'pay_corpus_key' of provider 'pay' is "
        "not configured; fix: set OPGATE_SECRET_PAY_CORPUS_KEY or write "
        "<secrets_dir>/pay_corpus_key; until then its requests are refused "
        "(credential_unavailable)",
    ),
]


def lint_fixture(name: str, secrets: SecretsCheck = NO_SECRETS) -> list[str]:
    path = CORPUS / f"{name}.yaml"
    return [str(f) for f in lint_policy_texts([(Path(path.name), path.read_text())], secrets)]


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_error_class_is_reported_exactly(name: str, expected: str) -> None:
    """Each broken fixture yields exactly one finding, with its message, place and fix."""
    assert lint_fixture(name) == [expected]


def test_the_corpus_has_one_fixture_per_case() -> None:
    """Every fixture file is asserted above, so a new error class cannot go untested."""
    files = {p.stem for p in CORPUS.glob("*.yaml")}
    assert files == {name for name, _ in CASES}


def test_overlapping_rules_across_files_for_the_same_upstream() -> None:
    """Two providers sending to one upstream (host spelled differently) with overlapping rules."""
    directory = CORPUS / "overlap_across_files"
    texts = [(Path(p.name), p.read_text()) for p in sorted(directory.glob("*.yaml"))]
    assert [str(f) for f in lint_policy_texts(texts)] == [
        "b_pay_connect.yaml:8:11: rule 'anything' overlaps rule 'refund.create' of provider "
        "'pay' (a_pay.yaml:6): POST requests to https://PAY.example:443/ can go through either "
        "policy; fix: give each upstream endpoint one rule in one provider file"
    ]


def test_a_missing_secret_is_an_error_when_the_deployment_secrets_are_given() -> None:
    """With --secrets-dir (required), the same finding is an error, not a warning."""
    path = CORPUS / "unconfigured_secret.yaml"
    [finding] = lint_policy_texts(
        [(Path(path.name), path.read_text())], SecretsCheck(lambda name: False, required=True)
    )
    assert finding.severity is Severity.ERROR
    configured = SecretsCheck(lambda name: name == "pay_corpus_key", required=True)
    assert lint_policy_texts([(Path(path.name), path.read_text())], configured) == []


def test_the_shipped_policies_have_no_finding() -> None:
    """The shipped directory is clean (its secret configured)."""
    texts = [(p, p.read_text()) for p in sorted(SHIPPED_POLICIES.glob("*.yaml"))]
    texts = [(p, t) for p, t in texts if not p.name.endswith(".tests.yaml")]
    assert lint_policy_texts(texts, SecretsCheck(lambda name: True, required=True)) == []


@pytest.mark.parametrize(
    ("wide", "narrow", "covers"),
    [
        ("/v1/{rest...}", "/v1/refunds", True),
        ("/v1/{rest...}", "/v1/{a}/{b...}", True),
        ("/v1/{rest...}", "/v2/refunds", False),
        ("/v1/{rest...}", "/v1", False),
        ("/v1/{a}", "/v1/{b...}", False),
        ("/v1/{a}/cancel", "/v1/x/cancel", True),
        ("/v1/x/cancel", "/v1/{a}/cancel", False),
        ("/v1/{a}", "/v1/{a}/capture", False),
    ],
)
def test_pattern_subsumption(wide: str, narrow: str, covers: bool) -> None:
    """A pattern covers another only if it matches every path the other matches."""
    assert pattern_covers(PathPattern.parse(wide), PathPattern.parse(narrow)) is covers


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("/v1/{rest...}", "/v1/refunds", True),
        ("/v1/refunds", "/v1/charges", False),
        ("/v1/{a}/cancel", "/v1/x/{verb}", True),
        ("/v1/{a}", "/v1/{a}/{b}", False),
        ("/v2/{rest...}", "/v1/{rest...}", False),
    ],
)
def test_pattern_overlap(a: str, b: str, overlap: bool) -> None:
    """Two patterns overlap if some path matches both, whichever is written first."""
    pa, pb = PathPattern.parse(a), PathPattern.parse(b)
    assert patterns_overlap(pa, pb) is overlap
    assert patterns_overlap(pb, pa) is overlap
