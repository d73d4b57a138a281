"""`opgate policy check|schema|test|explain` (proxy/authoring/commands.py), run as a user runs
them: in a subprocess, against the shipped policies and copies of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from proxy.authoring.cases import case_files, load_cases, run_cases
from proxy.authoring.commands import render_schema
from proxy.policy.load import load_policy_dir
from tests.support.cli import run_cli
from tests.support.opgate import SHIPPED_POLICIES
from tests.support.paths import FIXTURES

CORPUS = FIXTURES / "policies"


def test_the_shipped_schema_file_is_up_to_date() -> None:
    """policies/schema.json is what `opgate policy schema` writes from the models today."""
    assert (SHIPPED_POLICIES / "schema.json").read_text() == render_schema(), (
        "regenerate it: python -m proxy policy schema -o policies/schema.json"
    )


def test_policy_schema_describes_the_format_for_editors() -> None:
    """The schema forbids unknown keys and spells paths and modes as YAML authors write them."""
    result = run_cli("policy", "schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    rule = schema["$defs"]["Rule"]
    assert schema["additionalProperties"] is False
    assert rule["additionalProperties"] is False
    assert rule["properties"]["path"]["type"] == "string"
    assert schema["$defs"]["Mode"]["enum"] == ["enforce", "report"]
    assert set(schema["required"]) == {"version", "provider", "route_prefix", "upstream", "rules"}


def test_policy_check_exits_non_zero_with_every_finding(tmp_path: Path) -> None:
    """Shadowed rules and injection collisions (which load) still fail the check, with places."""
    for name in ("shadowed_rule", "injection_collision"):
        shutil.copy(CORPUS / f"{name}.yaml", tmp_path / f"{name}.yaml")
    (tmp_path / "injection_collision.yaml").write_text(
        (tmp_path / "injection_collision.yaml")
        .read_text()
        .replace("/pay", "/pay2")
        .replace("provider: pay", "provider: pay2")
    )
    result = run_cli("policy", "check", str(tmp_path))
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert any(f"{tmp_path / 'shadowed_rule.yaml'}:11:11: rule 'intent.cancel'" in x for x in lines)
    assert any(f"{tmp_path / 'injection_collision.yaml'}:10:22: rule" in x for x in lines)
    assert "2 errors" in result.stdout


def test_policy_check_secrets_dir_turns_a_missing_secret_into_an_error(tmp_path: Path) -> None:
    """Offline a missing credential is a warning; against the deployment's secrets, an error."""
    shutil.copy(CORPUS / "unconfigured_secret.yaml", tmp_path / "pay.yaml")
    offline = run_cli("policy", "check", str(tmp_path))
    assert offline.returncode == 0, offline.stderr
    assert "warning: secret 'pay_corpus_key'" in offline.stdout
    secrets = tmp_path.parent / "secrets"
    secrets.mkdir()
    strict = run_cli("policy", "check", str(tmp_path), "--secrets-dir", str(secrets))
    assert strict.returncode == 1
    (secrets / "pay_corpus_key").write_text("sk_test_1\n")
    configured = run_cli("policy", "check", str(tmp_path), "--secrets-dir", str(secrets))
    assert configured.returncode == 0, configured.stderr
    assert configured.stderr == ""


def test_shipped_policy_tests_pass() -> None:
    """`opgate policy test policies/` runs the shipped cases and every one passes."""
    result = run_cli("policy", "test", str(SHIPPED_POLICIES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout
    assert "FAIL" not in result.stdout


def test_policy_test_fails_when_a_shipped_expectation_changes(tmp_path: Path) -> None:
    """Changing one shipped expectation (amount_mismatch -> allow) makes the run fail."""
    copy = tmp_path / "policies"
    shutil.copytree(SHIPPED_POLICIES, copy)
    cases = copy / "stripe.tests.yaml"
    original = "    expect: {decision: deny, reason: amount_mismatch}\n"
    assert cases.read_text().count(original) == 1
    cases.write_text(cases.read_text().replace(original, "    expect: {decision: allow}\n"))
    result = run_cli("policy", "test", str(copy), "--verbose")
    assert result.returncode == 1
    [failed] = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert "another amount" in failed
    assert "deny amount_mismatch  (expected allow)" in failed
    assert "1 failed" in result.stdout
    assert "fail               amount amount_mismatch" in result.stdout  # the explanation


def test_shipped_cases_cover_every_rule_and_the_main_rejections() -> None:
    """Each rule of every shipped policy is matched by some case; the main codes are all tested,
    and each provider's cases refuse a re-planned amount (re-planned content, where no rule
    moves money) and a key that is not the approved one (where the provider takes none, a
    re-send after an unknown outcome)."""
    policy = load_policy_dir(SHIPPED_POLICIES)
    rules_hit: set[tuple[str, str]] = set()
    reasons: set[str] = set()
    per_provider: dict[str, set[str]] = {}
    for path in case_files(SHIPPED_POLICIES):
        cases, problems = load_cases(path)
        assert problems == []
        assert cases is not None
        for result in run_cases(policy, cases, str(path)):
            target = result.explanation.target
            reason = str(result.explanation.outcome()["reason"])
            if target is not None:
                rules_hit.add((target.provider.provider, target.rule.name))
                per_provider.setdefault(target.provider.provider, set()).add(reason)
            reasons.add(reason)
    assert rules_hit == {(p.provider, r.name) for p in policy.providers for r in p.rules}
    for provider in policy.providers:
        moves_money = any(rule.amount is not None for rule in provider.rules)
        expected = {
            "amount_mismatch" if moves_money else "parameter_mismatch",
            "idempotency_key_mismatch" if provider.idempotency.takes_key else "reconcile_required",
        }
        assert expected <= per_provider[provider.provider], provider.provider
    assert {
        "amount_mismatch",
        "currency_mismatch",
        "parameter_mismatch",
        "parameter_unexpected",
        "target_mismatch",
        "idempotency_key_mismatch",
        "operation_scope_mismatch",
        "operation_required",
        "operation_in_flight",
        "no_matching_rule",
    } <= reasons


def test_test_files_are_not_policies(tmp_path: Path) -> None:
    """*.tests.yaml is skipped by the loader: editing cases never changes the policy version."""
    copy = tmp_path / "policies"
    shutil.copytree(SHIPPED_POLICIES, copy)
    before = load_policy_dir(copy).version
    (copy / "stripe.tests.yaml").write_text("not: [a policy\n")
    assert load_policy_dir(copy).version == before


def test_policy_explain_lists_every_check_and_the_decision(tmp_path: Path) -> None:
    """explain with an inline operation prints the rule, each check in order, the decision."""
    operation = tmp_path / "op.yaml"
    operation.write_text("action: refund.create\namount: 500\nparams: {charge: ch_1}\n")
    result = run_cli(
        "policy", "explain", "POST", "/stripe/v1/refunds",
        "--policy-dir", str(SHIPPED_POLICIES),
        "--form", "charge=ch_2", "--form", "amount=700",
        "--operation", str(operation),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "rule: stripe refund.create (path parameters {})" in lines
    checks = [line.split()[:2] for line in lines if line.startswith("  ")]
    assert checks == [
        ["pass", "scope"],
        ["pass", "target"],
        ["pass", "idempotency_key"],
        ["fail", "amount"],
        ["pass", "currency"],
        ["fail", "params"],
        ["pass", "injected_field"],
        ["pass", "no_unexpected_fields"],
    ]
    assert lines[-1] == "decision: deny amount_mismatch (422): amount is '700', approved 500"


def test_policy_explain_shows_the_precondition_stage_on_a_given_lookup_answer(
    tmp_path: Path,
) -> None:
    """explain --lookup gives the provider's answer: the stage and each assertion are printed,
    and the decision is the stage's refusal."""
    operation = tmp_path / "op.yaml"
    operation.write_text(
        "action: refund.create\namount: 500\nparams: {charge: ch_1}\napproved_seconds_ago: 900\n"
    )
    answer = tmp_path / "charge.json"
    answer.write_text(
        json.dumps({"status": "succeeded", "refunded": True, "amount": 500, "amount_refunded": 500})
    )
    result = run_cli(
        "policy", "explain", "POST", "/stripe/v1/refunds",
        "--policy-dir", str(SHIPPED_POLICIES),
        "--form", "charge=ch_1", "--form", "amount=500",
        "--operation", str(operation),
        "--lookup", f"/v1/charges/ch_1={answer}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "preconditions: due (approval_age), failed" in lines
    assert "  lookup /v1/charges/ch_1: 200" in lines
    assert lines[-1].startswith("decision: deny precondition_failed (409): /v1/charges/ch_1:")
