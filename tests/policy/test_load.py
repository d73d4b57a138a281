"""Policy files: the model's rules and every load error as file:line:col (proxy/policy/*)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from proxy.policy.load import PolicyLoadError, load_policy_dir, parse_policy_text
from proxy.policy.model import BodyKind, Classification, OperationRequirement
from proxy.policy.set import match_rule
from tests.support.paths import POLICIES

HEAD = """\
version: 1
provider: pay
route_prefix: /pay
upstream: https://pay.example
"""
RULES = """\
rules:
  - name: refund.create
    method: POST
    path: /v1/refunds
"""


def problems_of(text: str) -> list[str]:
    provider, problems = parse_policy_text(text, "pay.yaml")
    assert provider is None
    return [str(p) for p in problems]


# --- the shipped policies ----------------------------------------------------------------------


def test_shipped_policies_load() -> None:
    """The policies/ directory in the repository loads without a problem."""
    policy = load_policy_dir(POLICIES)
    stripe = policy.provider_named("stripe")
    assert stripe is not None
    assert stripe.idempotency.provider_deduplicates is True
    assert len(policy.version) == 16
    assert load_policy_dir(POLICIES).version == policy.version


def test_shipped_stripe_rules_route_as_documented() -> None:
    """Stripe calls route to the rules their names promise; reads need no operation."""
    policy = load_policy_dir(POLICIES)
    route = policy.route("/stripe/v1/payment_intents/pi_1/capture")
    assert route is not None
    assert route.path == "/v1/payment_intents/pi_1/capture"
    matched = match_rule(route.provider, "POST", route.path)
    assert matched is not None
    assert matched.rule.name == "payment_intent.capture"
    assert matched.path_params == {"intent": "pi_1"}
    read = match_rule(route.provider, "GET", "/v1/charges/ch_1")
    assert read is not None
    assert read.rule.operation is OperationRequirement.NONE
    assert read.rule.body is BodyKind.NONE
    assert match_rule(route.provider, "DELETE", "/v1/charges/ch_1") is None
    assert policy.route("/stripe") is None
    assert policy.route("/stripey/v1/charges") is None


def test_metadata_field_respects_inject_metadata() -> None:
    """The injected field is the provider's, except on rules that refuse metadata."""
    stripe = load_policy_dir(POLICIES).provider_named("stripe")
    assert stripe is not None
    refund, cancel = stripe.rule_named("refund.create"), stripe.rule_named("payment_intent.cancel")
    assert refund is not None
    assert cancel is not None
    assert stripe.metadata_field(refund) == "metadata[operation_id]"
    assert stripe.metadata_field(cancel) is None


# --- one broken file at a time -----------------------------------------------------------------

BROKEN: list[tuple[str, str, list[str]]] = [
    (
        "unknown key",
        HEAD + RULES + "    amout: amount\n",
        ["pay.yaml:9:5: rules.0.amout: Extra inputs are not permitted"],
    ),
    (
        "unknown top-level key",
        HEAD + "retries: 3\n" + RULES,
        ["pay.yaml:5:1: retries: Extra inputs are not permitted"],
    ),
    (
        "duplicate YAML key",
        HEAD + RULES + "    method: PUT\n",
        ["pay.yaml:9:5: duplicate key 'method'"],
    ),
    (
        "duplicate top-level YAML key",
        HEAD + "provider: other\n" + RULES,
        ["pay.yaml:5:1: duplicate key 'provider'"],
    ),
    (
        "bad method",
        HEAD + RULES.replace("POST", "FETCH"),
        [
            "pay.yaml:7:13: rules.0.method: Input should be "
            "'GET', 'HEAD', 'POST', 'PUT', 'PATCH' or 'DELETE'"
        ],
    ),
    (
        "mutating rule with operation none",
        HEAD + RULES + "    operation: none\n",
        [
            "pay.yaml:6:5: rules.0: Value error, "
            "POST changes the provider: it must require an operation"
        ],
    ),
    (
        "duplicate rule name",
        HEAD + RULES + "  - name: refund.create\n    method: PUT\n    path: /v1/refunds\n",
        ["pay.yaml:6:3: rules: Value error, rule name 'refund.create' is used twice"],
    ),
    (
        "confirmed and failed overlap",
        HEAD + "classify:\n  confirmed: [2xx]\n  failed: [400, 201]\n" + RULES,
        ["pay.yaml:6:3: classify: Value error, status 201 is both confirmed and failed"],
    ),
    (
        "invalid path pattern",
        HEAD + RULES.replace("/v1/refunds", "/v1/{refund"),
        [
            "pay.yaml:8:11: rules.0.path: Value error, "
            "path '/v1/{refund': segment '{refund' is neither literal nor {name}"
        ],
    ),
    (
        "bad YAML syntax",
        HEAD + RULES.replace("method: POST", "method: [POST"),
        [
            "pay.yaml:8:9: YAML does not parse: "
            "expected ',' or ']', but got ':' (while parsing a flow sequence)"
        ],
    ),
    ("empty file", "", ["pay.yaml:1:1: the file is empty"]),
    (
        "not a mapping",
        "- a\n",
        ["pay.yaml:1:1: (file): Input should be a valid dictionary or instance of Provider"],
    ),
    (
        "bad status class",
        HEAD + "classify:\n  failed: [6xx]\n" + RULES,
        [
            "pay.yaml:6:11: classify.failed: Value error, "
            "'6xx' is neither a status nor a class like '2xx'"
        ],
    ),
    (
        "unknown injection kind",
        HEAD + "metadata_injection:\n  kind: header\n  field: x\n" + RULES,
        [
            "pay.yaml:6:3: metadata_injection: Input tag 'header' found using 'kind' does not "
            "match any of the expected tags: 'form_field', 'json_pointer'"
        ],
    ),
    (
        "body none reading fields",
        HEAD + RULES.replace("POST", "GET") + "    body: none\n    free: [x]\n",
        [
            "pay.yaml:6:5: rules.0: Value error, "
            "a rule with `body: none` cannot read fields from the body"
        ],
    ),
    (
        "field named twice",
        HEAD + RULES + "    amount: amount\n    params: [amount]\n",
        [
            "pay.yaml:6:5: rules.0: Value error, "
            "a field is named twice among amount, currency and params"
        ],
    ),
    (
        "no rules",
        HEAD + "rules: []\n",
        ["pay.yaml:5:8: rules: List should have at least 1 item after validation, not 0"],
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [pytest.param(*case[1:], id=case[0]) for case in BROKEN]
)
def test_broken_policy_reports_file_line_column(text: str, expected: list[str]) -> None:
    """Each broken policy is reported as `file:line:col: message` pointing at the culprit."""
    assert problems_of(text) == expected


def test_every_error_of_a_file_is_reported() -> None:
    """A file with several independent errors reports all of them, each at its own line."""
    text = HEAD.replace("version: 1", "version: 2") + textwrap.dedent(
        """\
        retries: 3
        rules:
          - name: refund.create
            method: FETCH
            path: /v1/refunds
          - name: charge.create
            method: POST
            path: /v1//charges
        """
    )
    assert problems_of(text) == [
        "pay.yaml:1:10: version: Input should be 1",
        "pay.yaml:8:13: rules.0.method: Input should be "
        "'GET', 'HEAD', 'POST', 'PUT', 'PATCH' or 'DELETE'",
        "pay.yaml:12:11: rules.1.path: Value error, "
        "path '/v1//charges': segment '' is neither literal nor {name}",
        "pay.yaml:5:1: retries: Extra inputs are not permitted",
    ]


def test_duplicate_rule_name_is_reported_with_other_errors() -> None:
    """A duplicated rule name is reported alongside errors in other fields, not instead."""
    text = HEAD + "retries: 3\n" + RULES + RULES.replace("rules:\n", "")
    assert problems_of(text) == [
        "pay.yaml:7:3: rules: Value error, rule name 'refund.create' is used twice",
        "pay.yaml:5:1: retries: Extra inputs are not permitted",
    ]


def test_every_duplicate_key_is_reported() -> None:
    """Every duplicated YAML key in a file is reported, nested ones included."""
    text = HEAD + "version: 1\n" + RULES + "    path: /v1/x\n"
    assert problems_of(text) == [
        "pay.yaml:5:1: duplicate key 'version'",
        "pay.yaml:10:5: duplicate key 'path'",
    ]


# --- a directory -------------------------------------------------------------------------------


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, "utf-8")
    return path


def test_directory_reports_problems_of_every_file(tmp_path: Path) -> None:
    """Loading a directory reports the problems of all its files in one PolicyLoadError."""
    a = write(tmp_path, "a.yaml", HEAD + RULES + "    amout: 1\n")
    b = write(tmp_path, "b.yaml", HEAD.replace("pay", "other") + RULES.replace("POST", "FETCH"))
    write(tmp_path, "notes.txt", "not a policy")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    messages = [str(p) for p in info.value.problems]
    assert messages == [
        f"{a}:9:5: rules.0.amout: Extra inputs are not permitted",
        f"{b}:7:13: rules.0.method: Input should be "
        "'GET', 'HEAD', 'POST', 'PUT', 'PATCH' or 'DELETE'",
    ]
    assert str(info.value) == "\n".join(messages)


def test_two_files_with_the_same_route_prefix(tmp_path: Path) -> None:
    """Two providers on one route prefix are refused, naming the later file and both providers."""
    write(tmp_path, "a.yaml", HEAD + RULES)
    b = write(tmp_path, "b.yaml", HEAD.replace("provider: pay", "provider: other") + RULES)
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    assert [str(p) for p in info.value.problems] == [
        f"{b}:1:1: route prefix /pay is used by pay and other"
    ]


def test_two_files_with_the_same_provider(tmp_path: Path) -> None:
    """Two files defining one provider are refused, naming both files."""
    a = write(tmp_path, "a.yaml", HEAD + RULES)
    b = write(tmp_path, "b.yaml", HEAD.replace("/pay", "/pay2") + RULES)
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    assert [str(p) for p in info.value.problems] == [
        f"{b}:1:1: provider 'pay' is defined twice (also in {a})"
    ]


@pytest.mark.parametrize(
    "make", [pytest.param(False, id="missing"), pytest.param(True, id="empty")]
)
def test_directory_without_policies(tmp_path: Path, make: bool) -> None:
    """A missing or empty policy directory is an error, not an empty policy."""
    directory = tmp_path / "policies"
    if make:
        directory.mkdir()
    with pytest.raises(PolicyLoadError, match=r"no \*\.yaml policy files found"):
        load_policy_dir(directory)


def test_version_names_the_file_contents(tmp_path: Path) -> None:
    """The policy version changes when any file's text changes."""
    path = write(tmp_path, "pay.yaml", HEAD + RULES)
    before = load_policy_dir(tmp_path).version
    path.write_text(HEAD + RULES + "    free: [reason]\n", "utf-8")
    assert load_policy_dir(tmp_path).version != before


# --- the model ---------------------------------------------------------------------------------


def test_classification_defaults_and_overrides() -> None:
    """2xx confirms by default, nothing fails; a rule's classify replaces the provider's."""
    default = Classification()
    assert default.is_confirmed(201)
    assert not default.is_confirmed(400)
    assert not default.is_failed(400)
    text = HEAD + "classify:\n  failed: [4xx]\n" + RULES + "    classify:\n      failed: [402]\n"
    provider, problems = parse_policy_text(text, "pay.yaml")
    assert problems == []
    assert provider is not None
    rule = provider.rules[0]
    assert provider.classification_for(rule).is_failed(402)
    assert not provider.classification_for(rule).is_failed(400)
    assert provider.classify.is_failed(400)


@pytest.mark.parametrize(
    ("confirmed", "failed"),
    [
        pytest.param(["2xx"], ["2xx"], id="same class"),
        pytest.param([200], ["2xx"], id="status inside a class"),
        pytest.param([600], [], id="not an HTTP status"),
        pytest.param(["2XX"], [], id="uppercase class"),
        pytest.param(["20x"], [], id="partial class"),
    ],
)
def test_invalid_classifications(confirmed: list[int | str], failed: list[int | str]) -> None:
    """Overlapping or malformed status specs are refused."""
    with pytest.raises(ValueError, match=r"status|class"):
        Classification(confirmed=confirmed, failed=failed)


@pytest.mark.parametrize(
    "header",
    [
        "Authorization",
        "host",
        "X-Operation-Id",
        "Idempotency-Key",
        "PAYMENT-SIGNATURE",
        "X-PAYMENT",
    ],
)
def test_forward_headers_cannot_pass_reserved_headers(header: str) -> None:
    """A policy cannot forward a header opgate sets or strips, e.g. the agent's own token."""
    text = HEAD + f"forward_headers: [Accept, {header}]\n" + RULES
    [problem] = problems_of(text)
    assert "forward_headers may not list" in problem
    assert header in problem


def test_a_dashboard_search_url_is_an_https_template_over_the_operation() -> None:
    """``dashboard_search_url`` loads as an https URL template over the operation id and its
    approved values; plain http or a template that does not parse is refused at its line."""
    good = HEAD + "dashboard_search_url: https://pay.example/search?q={operation_id}\n" + RULES
    provider, problems = parse_policy_text(good, "pay.yaml")
    assert problems == []
    assert provider is not None
    assert provider.dashboard_search_url == "https://pay.example/search?q={operation_id}"
    plain = HEAD + "dashboard_search_url: http://pay.example/search?q={operation_id}\n" + RULES
    assert problems_of(plain)[0].startswith("pay.yaml:5:")
    broken = HEAD + "dashboard_search_url: https://pay.example/search?q={operation_id\n" + RULES
    assert "dashboard_search_url" in problems_of(broken)[0]


def test_the_shipped_stripe_policy_names_its_dashboard_search() -> None:
    """Stripe's dashboard has a search URL: the shipped policy sets it for the console."""
    stripe = load_policy_dir(POLICIES).provider_named("stripe")
    assert stripe is not None
    assert stripe.dashboard_search_url == "https://dashboard.stripe.com/search?query={operation_id}"


X402_RULE = """\
rules:
  - name: report.buy
    method: GET
    path: /report
    body: none
    operation: {operation}
    x402:
      wallet_secret: paid_wallet
      networks: [{network}]
      assets: ["0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"]
"""


def test_an_x402_rule_loads_with_its_networks_and_assets() -> None:
    """A rule's x402 declaration loads, with ``exact`` as its default scheme."""
    text = HEAD + X402_RULE.format(operation="required", network='"eip155:8453"')
    provider, problems = parse_policy_text(text, "pay.yaml")
    assert problems == []
    assert provider is not None
    terms = provider.rules[0].x402
    assert terms is not None
    assert (terms.schemes, terms.networks) == (["exact"], ["eip155:8453"])


@pytest.mark.parametrize(
    ("operation", "network", "words"),
    [
        pytest.param("none", '"eip155:8453"', "x402 needs `operation: required`", id="no-op"),
        pytest.param("required", '"solana:mainnet"', "eip155", id="not-caip2-evm"),
        pytest.param("required", '"eip155:0"', "eip155", id="chain-zero"),
    ],
)
def test_an_x402_rule_without_an_operation_or_with_a_foreign_network_is_refused(
    operation: str, network: str, words: str
) -> None:
    """x402 is approved per operation, and only EVM networks (CAIP-2 eip155) are paid."""
    problems = problems_of(HEAD + X402_RULE.format(operation=operation, network=network))
    assert any(words in problem for problem in problems), problems
