"""`policy check` on what only non-Stripe policies can get wrong: field names that are not the
body kind's (a name on a JSON rule, a pointer on a form rule), `*` where it can never match, an
idempotency key a rule cannot carry; and rule findings in a file that also fails the schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.policy.lint import lint_policy_texts

HEAD = """version: 1
provider: p
route_prefix: /p
upstream: https://p.example
"""


def findings(text: str) -> list[str]:
    return [f.message for f in lint_policy_texts([(Path("p.yaml"), text)])]


def rule(body: str, fields: str) -> str:
    return HEAD + f"rules:\n  - {{name: a, method: POST, path: /v1/a, body: {body}, {fields}}}\n"


@pytest.mark.parametrize(
    ("body", "fields", "expected"),
    [
        ("json", "amount: amount", "'amount' is not a JSON pointer"),
        ("json", "currency: currency", "'currency' is not a JSON pointer"),
        ("json", "free: [reason]", "'reason' is not a JSON pointer"),
        ("json", "params: [items/*/sku]", "'items/*/sku' is not a JSON pointer"),
        ("json", 'params: ["/items/*sku"]', "in params '*' must be a whole token"),
        ("json", "params: [/a~2b]", "'/a~2b' is not a JSON pointer"),
        ("form", "amount: /amount", "'/amount' is a JSON pointer, but this rule takes a form"),
        ("form", 'params: ["items[*]x[*]"]', "in form params '*' must be one whole bracket group"),
        ("json", 'params: [/items, "/items/*/sku"]', "compares '/items/*/sku' inside '/items'"),
    ],
)
def test_fields_a_rule_can_never_read_are_errors(body: str, fields: str, expected: str) -> None:
    """Each field that could never match a request of the rule's body kind is reported."""
    found = findings(rule(body, fields))
    assert any(expected in message for message in found), found


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ("json", "amount: /amount/value, amount_format: decimal, currency: /amount/currency_code"),
        ("json", 'params: ["/items/*/sku"], free: ["/metadata/*", /note]'),
        ("form", 'params: ["items[*][sku]"], free: ["metadata[*]"]'),
    ],
)
def test_fields_in_the_body_kinds_spelling_pass(body: str, fields: str) -> None:
    """Pointers on JSON rules, form keys on form rules and whole-token stars are fine."""
    assert findings(rule(body, fields)) == []


def test_a_decimal_amount_needs_its_currency() -> None:
    """`amount_format: decimal` without a currency field is refused: the exponent is unknown."""
    found = findings(rule("json", "amount: /amount/value, amount_format: decimal"))
    assert any("amount_format: decimal needs `amount` and `currency`" in m for m in found), found


def test_a_key_in_a_json_pointer_on_form_rules_is_an_error() -> None:
    """The key's body field must be spelt the way the rules that carry it take fields."""
    text = (
        HEAD
        + "idempotency: {body_field: /idempotency_key}\n"
        + rule("form", "free: [x]")[len(HEAD) :]
    )
    found = findings(text)
    assert any("idempotency.body_field" in m for m in found), found


def test_a_key_without_header_needs_a_body_on_every_rule_with_an_operation() -> None:
    """header: null leaves a body-less rule no place for the key: an error."""
    text = (
        HEAD
        + "idempotency: {header: null, body_field: /idempotency_key}\n"
        + "rules:\n  - {name: a, method: DELETE, path: /v1/a, body: none}\n"
    )
    found = findings(text)
    assert any("its requests could not carry the key" in m for m in found), found


@pytest.mark.parametrize(
    "idempotency", ["none", "{header: null}", "{header: null, body_field: null}"]
)
def test_a_provider_without_an_idempotency_key_loads(idempotency: str) -> None:
    """`idempotency: none` (and the documented `header: null` with no body_field): the
    provider takes no key, opgate sends none, and agents name operations by X-Operation-Id."""
    text = HEAD + f"idempotency: {idempotency}\n" + rule("json", "free: [/x]")[len(HEAD) :]
    assert findings(text) == []


def test_a_body_less_rule_needs_no_place_for_a_key_the_provider_does_not_take() -> None:
    """With no key at all, a body-less rule's operation is named by X-Operation-Id: fine."""
    text = (
        HEAD + "idempotency: none\nrules:\n  - {name: a, method: DELETE, path: /v1/a, body: none}\n"
    )
    assert findings(text) == []


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("provider_deduplicates: true, retention_seconds: 60", "provider_deduplicates"),
        ("max_length: 10", "max_length"),
        ("characters: a-z", "characters"),
    ],
)
def test_key_properties_without_a_key_are_refused(field: str, expected: str) -> None:
    """What the provider does with a key means nothing where it takes none: refused, named."""
    text = HEAD + f"idempotency: {{header: null, {field}}}\n" + rule("json", "")[len(HEAD) :]
    found = findings(text)
    assert any(expected in m and "takes no key" in m for m in found), found


def test_a_lookup_matching_an_id_opgate_never_wrote_is_a_warning() -> None:
    """A reconcile lookup matches the operation id opgate injected: on a rule that injects
    none (`inject_metadata: false`, or no metadata_injection) it can never find the effect."""
    text = rule(
        "json",
        "inject_metadata: false, reconcile: {lookups: [{path: /v1/a, match: /body}]}",
    )
    found = lint_policy_texts([(Path("p.yaml"), text)])
    assert [f.severity.value for f in found] == ["warning"], found
    assert "can never match" in found[0].message, found[0].message


def test_rules_are_still_checked_when_the_file_fails_the_schema() -> None:
    """A typo elsewhere in the file does not hide a rule's field findings."""
    text = rule("json", "amount: amount").replace("upstream:", "upstreem:")
    found = findings(text)
    assert any("Extra inputs" in m or "upstreem" in m for m in found), found
    assert any("'amount' is not a JSON pointer" in m for m in found), found


def test_an_oauth2_client_id_secret_that_is_not_configured_is_reported() -> None:
    """Both secrets an OAuth2 credential names are checked, the client id's too."""
    from proxy.policy.lint import SecretsCheck

    text = (
        HEAD
        + (
            "credential: {kind: oauth2_client_credentials, token_url: /v1/oauth2/token,"
            " client_id_secret: pp_id, secret: pp_secret}\n"
        )
        + rule("json", "free: [/x]")[len(HEAD) :]
    )
    found = lint_policy_texts(
        [(Path("p.yaml"), text)], SecretsCheck(lambda name: name == "pp_secret", required=True)
    )
    assert [f.message for f in found] == ["secret 'pp_id' of provider 'p' is not configured"]
