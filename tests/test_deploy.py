"""deploy/ checked without a Docker engine or a cluster: what can be validated here, offline.

YAML parses; the compose file against the Compose Specification's JSON schema (vendored by
check-jsonschema); the Kubernetes manifests against Kubernetes' own JSON schemas (shipped by
kubernetes-validate, strict: unknown fields are errors); the Dockerfiles with hadolint; the
systemd unit with ``systemd-analyze verify``. Then what the schemas cannot say: the
NetworkPolicies are evaluated (a small model of NetworkPolicy's egress semantics) to prove an
agent pod reaches opgate's agent ports and DNS and nothing else; probes point at the right
paths and ports; nothing secret is committed. Nothing here starts a container or a pod:
deploy/README.md says what was not run.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import importlib.util
import ipaddress
import json
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate.utils as kubernetes_validate
import pytest
import yaml

from proxy.policy.reload import validated_policy
from proxy.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "container" / "Dockerfile"
UNIT = DEPLOY / "systemd" / "opgate.service"

# opgate's default drain deadline on SIGTERM (in-flight requests finish up to it). Every stop
# timeout in deploy/ must exceed the deadline configured there, or SIGKILL cuts the drain short.
DEFAULT_DRAIN_SECONDS: float = Settings.model_fields["drain_seconds"].default
AGENT_PORT, FORWARD_PORT, OPS_PORT = 8080, 3128, 8081
# Oldest and newest Kubernetes versions the manifests are validated against.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|PRIVATE|CREDENTIAL", re.IGNORECASE)
PLACEHOLDER = "REPLACE_ME"


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    """The file's documents; a fresh copy each time, so a test may change what it gets."""
    return copy.deepcopy(_parsed(path))


@functools.cache
def _parsed(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text("utf-8")) if doc is not None]


def manifests(*names: str) -> list[dict[str, Any]]:
    if names:
        paths = [K8S / name for name in names]
    else:
        paths = sorted(set(K8S.rglob("*.yaml")) - {K8S / "kustomization.yaml"})
    return [doc for path in paths for doc in load_yaml_documents(path) if "kind" in doc]


def applied_manifests() -> list[dict[str, Any]]:
    """What ``kubectl apply -k deploy/k8s`` applies (the kustomization's resources)."""
    kustomization = load_yaml_documents(K8S / "kustomization.yaml")[0]
    return manifests(*kustomization["resources"])


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def compose() -> dict[str, Any]:
    return load_yaml_documents(COMPOSE)[0]


def deployment() -> dict[str, Any]:
    return one(applied_manifests(), "Deployment", "opgate")


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def drain_seconds(environment: dict[str, str]) -> float:
    """The drain deadline a deployment configures (OPGATE_DRAIN_SECONDS), else the default."""
    return float(environment.get("OPGATE_DRAIN_SECONDS", DEFAULT_DRAIN_SECONDS))


def longest_provider_timeout() -> float:
    """The longest ``timeouts.total_seconds`` among the policies deployed (the ConfigMap)."""
    config_map = one(applied_manifests(), "ConfigMap", "opgate-policies")
    policies = [yaml.safe_load(text) for text in config_map["data"].values()]
    return max(float(p["timeouts"]["total_seconds"]) for p in policies)


def tool(name: str) -> str:
    """An executable from this environment's scripts directory (test extras), else PATH."""
    local = Path(sysconfig.get_path("scripts")) / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"{name} is missing: install the test extras (pip install -e '.[test]')"
    return found


# --- every file parses --------------------------------------------------------------------


def test_every_yaml_file_in_deploy_parses() -> None:
    """Every YAML file under deploy/ parses, every document of it (multi-document files too)."""
    paths = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(paths) >= 10
    for path in paths:
        docs = load_yaml_documents(path)
        assert docs, f"{path} holds no document"
        assert all(isinstance(doc, dict) for doc in docs), path


# --- compose --------------------------------------------------------------------------------


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    """deploy/compose.yaml validates against the Compose Specification's JSON schema."""
    schema_text = (
        importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
        .joinpath("compose-spec.json")
        .read_text("utf-8")
    )
    schema = json.loads(schema_text)
    validator = jsonschema.Draft202012Validator(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(compose())
    ]
    assert errors == []
    broken = compose()
    broken["services"]["opgate"]["depends_on"]["postgres"]["condition"] = "service_healty"
    assert list(validator.iter_errors(broken)), "the schema check must catch a misspelling"


def test_compose_runs_postgres_16_migration_opgate_and_localstripe_in_order() -> None:
    """opgate starts after PostgreSQL and localstripe are healthy and the migration succeeded."""
    services = compose()["services"]
    assert set(services) == {"postgres", "migrate", "opgate", "localstripe"}
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["opgate"]["command"][0] == "serve"
    assert services["opgate"]["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
        "localstripe": {"condition": "service_healthy"},
    }
    for name in ("postgres", "opgate", "localstripe"):
        assert services[name]["healthcheck"]["test"], f"{name} has no healthcheck"
    assert "/readyz" in services["opgate"]["healthcheck"]["test"]
    for name in ("migrate", "opgate"):
        assert services[name]["build"]["dockerfile"] == "deploy/container/Dockerfile"
        assert services[name]["build"]["context"] == ".."


def test_compose_opgate_is_locked_down_and_drains_before_it_is_killed() -> None:
    """opgate runs read-only without capabilities, publishes only on loopback, drains on stop."""
    services = compose()["services"]
    opgate = services["opgate"]
    assert opgate["read_only"] is True
    assert opgate["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in opgate["security_opt"]
    assert "../policies:/etc/opgate/policies:ro" in opgate["volumes"]
    grace = opgate["stop_grace_period"]
    assert grace.endswith("s")
    drain = drain_seconds(opgate["environment"])
    assert drain > longest_provider_timeout()
    assert int(grace.removesuffix("s")) > drain
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert published
    assert all(p.startswith("127.0.0.1:") for p in published)


def test_compose_holds_no_plaintext_secret() -> None:
    """Every secret in the compose file is a required ${VAR:?} from the uncommitted .env."""
    for name, service in compose()["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key) or key == "OPGATE_AGENTS":
                assert re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]*\}", str(value)), (name, key)
            if key.endswith("DATABASE_URL"):
                password = re.match(r"postgresql://[^:]+:([^@]*)@", value)
                assert password, (name, key)
                assert password.group(1).startswith("${"), (name, key)
    example = (DEPLOY / ".env.example").read_text("utf-8")
    for line in example.splitlines():
        if line and not line.startswith("#"):
            assert PLACEHOLDER in line, f".env.example holds a value: {line}"


def test_filled_in_env_files_are_ignored_by_git() -> None:
    """A filled-in deploy/.env or systemd env file cannot be committed by accident."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    ignored = ["deploy/.env", "deploy/systemd/opgate.env"]
    kept = ["deploy/.env.example", "deploy/systemd/opgate.env.example"]
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", *ignored, *kept],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout.split() == ignored


# --- Kubernetes: schemas and structure ------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    """Every manifest (examples and the Secret template too) is valid, unknown fields refused."""
    docs = manifests()
    assert len(docs) >= 12
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(map(str, exc.path))
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {path}: {exc.message}")


def test_kubernetes_schema_check_catches_an_unknown_field() -> None:
    """The strict schema check refuses a misspelt field: it is not a check that passes anything."""
    broken = deployment()
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_kustomization_applies_every_manifest_but_the_secret_template() -> None:
    """`kubectl apply -k` creates each kind the deployment needs, and never the Secret template."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text("utf-8"))
    assert "namespace" not in kustomization  # it would move the agents' policy out of `agents`
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert listed == on_disk
    kinds = {doc["kind"] for doc in applied_manifests()}
    assert kinds >= {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "Job",
        "NetworkPolicy",
    }
    assert "Secret" not in kinds


def test_kustomize_renders_the_manifests() -> None:
    """kubectl's built-in kustomize renders deploy/k8s (no cluster needed) with the image set."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed here: kustomize rendering not checked")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    images = {
        c["image"]
        for doc in rendered
        if doc["kind"] in {"Deployment", "Job"}
        for c in doc["spec"]["template"]["spec"].get("initContainers", [])
        + doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/opgate:0.1.0"}


def test_deployment_runs_three_non_root_read_only_replicas() -> None:
    """Three replicas, non-root with a read-only root filesystem, no capabilities, no SA token."""
    spec = deployment()["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for each in pod["initContainers"] + pod["containers"]:
        context = each["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, each["name"]
        assert context["allowPrivilegeEscalation"] is False, each["name"]
        assert context["capabilities"]["drop"] == ["ALL"], each["name"]
        assert each["resources"]["requests"], each["name"]
        assert each["resources"]["limits"]["memory"], each["name"]


def test_deployment_probes_point_at_the_ops_listener() -> None:
    """Readiness asks /readyz and liveness /healthz, on the ops port (8081)."""
    main = container(deployment()["spec"]["template"]["spec"], "opgate")
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"agent": AGENT_PORT, "forward": FORWARD_PORT, "ops": OPS_PORT}
    probes = {
        kind: (main[kind]["httpGet"]["path"], ports[main[kind]["httpGet"]["port"]])
        for kind in ("readinessProbe", "livenessProbe", "startupProbe")
    }
    assert probes == {
        "readinessProbe": ("/readyz", OPS_PORT),
        "livenessProbe": ("/healthz", OPS_PORT),
        "startupProbe": ("/healthz", OPS_PORT),
    }


def test_deployment_grace_period_outlasts_prestop_and_the_drain() -> None:
    """SIGKILL comes only after preStop and a drain long enough for the slowest provider."""
    pod = deployment()["spec"]["template"]["spec"]
    main = container(pod, "opgate")
    pre_stop = main["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = drain_seconds({e["name"]: e["value"] for e in main["env"] if "value" in e})
    assert drain > longest_provider_timeout()
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + drain


def test_deployment_mounts_policies_credentials_and_a_shared_ca() -> None:
    """Policies from the ConfigMap (whole directory), credentials and the CA from Secrets."""
    pod = deployment()["spec"]["template"]["spec"]
    main = container(pod, "opgate")
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    policies = mounts["/etc/opgate/policies"]
    assert "subPath" not in policies  # a subPath mount is never updated by the kubelet
    assert volumes[policies["name"]]["configMap"]["name"] == "opgate-policies"
    credentials = volumes[mounts["/run/secrets/opgate"]["name"]]
    assert credentials["secret"]["secretName"] == "opgate-provider-credentials"
    env = {e["name"]: e for e in main["env"]}
    ca_dir = env["OPGATE_CA_DIR"]["value"]
    init = pod["initContainers"][0]
    assert ca_dir in " ".join(init["command"])
    ca_volume = next(m["name"] for m in init["volumeMounts"] if m.get("readOnly"))
    assert volumes[ca_volume]["secret"]["secretName"] == "opgate-forward-ca"


def test_services_expose_agent_forward_and_ops_ports_of_the_deployment() -> None:
    """The Services select the Deployment's pods and expose 8080, 3128 and 8081 by name."""
    docs = applied_manifests()
    pod_labels = deployment()["spec"]["template"]["metadata"]["labels"]
    exposed = {}
    for service in (one(docs, "Service", "opgate"), one(docs, "Service", "opgate-ops")):
        assert service["spec"]["selector"].items() <= pod_labels.items()
        for port in service["spec"]["ports"]:
            exposed[port["targetPort"]] = port["port"]
    assert exposed == {"agent": AGENT_PORT, "forward": FORWARD_PORT, "ops": OPS_PORT}
    assert one(docs, "Service", "opgate")["spec"]["ports"][0]["name"] == "agent"
    assert {p["port"] for p in one(docs, "Service", "opgate")["spec"]["ports"]} == {
        AGENT_PORT,
        FORWARD_PORT,
    }


def test_pod_disruption_budget_keeps_replicas_serving() -> None:
    """The PodDisruptionBudget selects opgate's pods and lets fewer than all of them go at once."""
    budget = one(applied_manifests(), "PodDisruptionBudget", "opgate")["spec"]
    pod_labels = deployment()["spec"]["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
    assert 0 < budget["maxUnavailable"] < deployment()["spec"]["replicas"]


def test_migration_job_runs_opgate_migrate_as_non_root() -> None:
    """The Job runs `opgate migrate` once, non-root, read-only, against the same database."""
    job = one(applied_manifests(), "Job", "opgate-migrate")["spec"]
    pod = job["template"]["spec"]
    migrate = pod["containers"][0]
    assert migrate["args"] == ["migrate"]
    assert (
        migrate["image"] == container(deployment()["spec"]["template"]["spec"], "opgate")["image"]
    )
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert migrate["securityContext"]["readOnlyRootFilesystem"] is True
    url = next(e for e in migrate["env"] if e["name"] == "OPGATE_DATABASE_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "opgate-config", "key": "database-url"}


def test_policy_configmap_holds_a_policy_set_opgate_accepts() -> None:
    """The ConfigMap's policies pass opgate's own load and lint (the set a replica would serve)."""
    config_map = one(applied_manifests(), "ConfigMap", "opgate-policies")
    texts = [
        (Path("/etc/opgate/policies") / name, text) for name, text in config_map["data"].items()
    ]
    assert texts
    policy = validated_policy(texts, "/etc/opgate/policies")
    assert policy.version


def test_secret_template_holds_placeholders_only_and_every_key_opgate_reads() -> None:
    """The Secret example has no real value, and every Secret key the pods read is in it."""
    secrets = {doc["metadata"]["name"]: doc for doc in manifests("secret.example.yaml")}
    for name, secret in secrets.items():
        assert "data" not in secret, name  # base64 would hide a real value from review
        for key, value in secret["stringData"].items():
            assert PLACEHOLDER in value, f"{name}/{key} is not a placeholder"
    read: set[tuple[str, str | None]] = set()
    for workload in (deployment(), one(applied_manifests(), "Job", "opgate-migrate")):
        pod = workload["spec"]["template"]["spec"]
        for each in pod.get("initContainers", []) + pod["containers"]:
            for env in each.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    read.add((ref["name"], ref["key"]))
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                read.add((volume["secret"]["secretName"], None))
    for name, key in read:
        assert name in secrets, f"the template lacks Secret {name}"
        assert key is None or key in secrets[name]["stringData"], f"{name} lacks {key}"


# --- Kubernetes: the NetworkPolicy that makes the tool boundary -----------------------------


@dataclass(frozen=True)
class Endpoint:
    """A pod (namespace and labels) or an address outside the cluster, and a port on it."""

    port: int
    protocol: str = "TCP"
    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    ip: str = "10.96.0.1"  # used only when namespace is None (outside the cluster)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "matchExpressions not modelled"
    wanted: dict[str, str] = selector.get("matchLabels", {})
    return wanted.items() <= labels.items()


def peer_matches(peer: dict[str, Any], source_namespace: str, dest: Endpoint) -> bool:
    if "ipBlock" in peer:
        if dest.namespace is not None:  # pod addresses are matched by selectors here
            return False
        block = peer["ipBlock"]
        address = ipaddress.ip_address(dest.ip)
        within = [ipaddress.ip_network(c) for c in [block["cidr"], *block.get("except", [])]]
        in_cidr = address.version == within[0].version and address in within[0]
        return in_cidr and not any(
            address.version == n.version and address in n for n in within[1:]
        )
    if dest.namespace is None:
        return False
    namespace_labels = {"kubernetes.io/metadata.name": dest.namespace}
    if "namespaceSelector" in peer:
        namespace_ok = selects(peer["namespaceSelector"], namespace_labels)
    else:
        namespace_ok = dest.namespace == source_namespace
    return namespace_ok and selects(peer.get("podSelector", {}), dest.labels)


def egress_allowed(
    policies: list[dict[str, Any]], namespace: str, labels: dict[str, str], dest: Endpoint
) -> bool:
    """NetworkPolicy egress semantics for a pod: unrestricted unless selected, then the union."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == namespace
        and "Egress" in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("egress", []):
            ports = rule.get("ports")
            port_ok = ports is None or any(
                p.get("port") == dest.port and p.get("protocol", "TCP") == dest.protocol
                for p in ports
            )
            peers = rule.get("to")
            peer_ok = peers is None or any(peer_matches(p, namespace, dest) for p in peers)
            if port_ok and peer_ok:
                return True
    return False


def network_policies() -> list[dict[str, Any]]:
    return [doc for doc in applied_manifests() if doc["kind"] == "NetworkPolicy"]


def opgate_pod(port: int) -> Endpoint:
    labels = deployment()["spec"]["template"]["metadata"]["labels"]
    return Endpoint(port=port, namespace="opgate", labels=labels)


KUBE_DNS = {"k8s-app": "kube-dns"}
AGENT_LABELS = {"opgate.dev/role": "agent", "app": "example-agent"}


def destinations() -> Iterator[tuple[str, Endpoint, bool]]:
    """(scenario, destination, may an agent reach it)."""
    yield "opgate agent listener", opgate_pod(AGENT_PORT), True
    yield "opgate forward proxy", opgate_pod(FORWARD_PORT), True
    yield "DNS over UDP", Endpoint(53, "UDP", "kube-system", KUBE_DNS), True
    yield "DNS over TCP", Endpoint(53, "TCP", "kube-system", KUBE_DNS), True
    yield "opgate operations API", opgate_pod(OPS_PORT), False
    yield "Stripe directly", Endpoint(443, ip="54.187.216.72"), False
    yield "the internet over HTTP", Endpoint(80, ip="93.184.216.34"), False
    yield "cloud metadata", Endpoint(80, ip="169.254.169.254"), False
    yield (
        "PostgreSQL",
        Endpoint(5432, namespace="db", labels={"opgate.dev/database": "true"}),
        False,
    )
    yield "another pod in agents", Endpoint(8080, namespace="agents", labels={"app": "x"}), False
    yield "a public resolver", Endpoint(53, "UDP", ip="8.8.8.8"), False


@pytest.mark.parametrize(
    ("scenario", "dest", "reachable"),
    list(destinations()),
    ids=[scenario for scenario, _, _ in destinations()],
)
def test_agent_pods_reach_only_dns_and_opgates_agent_ports(
    scenario: str, dest: Endpoint, reachable: bool
) -> None:
    """An agent pod reaches DNS and opgate's agent ports, and nothing else: no way around opgate."""
    assert egress_allowed(network_policies(), "agents", AGENT_LABELS, dest) is reachable


def test_a_pod_in_the_agents_namespace_without_the_label_reaches_nothing() -> None:
    """A forgotten label cuts an agent off instead of letting it out (namespace default deny)."""
    unlabelled = {"app": "example-agent"}
    for _, dest, _ in destinations():
        assert not egress_allowed(network_policies(), "agents", unlabelled, dest), dest


def test_the_example_agent_carries_the_label_the_policy_allows() -> None:
    """The example agent Deployment is labelled so the policy lets it reach opgate."""
    example = manifests("examples/agent.yaml")[0]
    labels = example["spec"]["template"]["metadata"]["labels"]
    assert example["metadata"]["namespace"] == "agents"
    assert egress_allowed(network_policies(), "agents", labels, opgate_pod(FORWARD_PORT))
    assert not egress_allowed(network_policies(), "agents", labels, opgate_pod(OPS_PORT))


def test_opgate_reaches_providers_and_its_database_but_not_private_or_metadata_addresses() -> None:
    """opgate's egress: DNS, PostgreSQL/PgBouncer, public HTTPS; not metadata or private nets."""
    policies = network_policies()
    labels = deployment()["spec"]["template"]["metadata"]["labels"]

    def reaches(dest: Endpoint) -> bool:
        return egress_allowed(policies, "opgate", labels, dest)

    assert reaches(Endpoint(53, "UDP", "kube-system", KUBE_DNS))
    assert reaches(Endpoint(5432, namespace="db", labels={"opgate.dev/database": "true"}))
    assert reaches(Endpoint(6432, namespace="db", labels={"opgate.dev/database": "true"}))
    assert reaches(Endpoint(443, ip="54.187.216.72"))
    assert reaches(Endpoint(443, ip="2600:1f14::1"))
    assert not reaches(Endpoint(443, ip="169.254.169.254"))
    assert not reaches(Endpoint(443, ip="10.0.0.5"))
    assert not reaches(Endpoint(443, ip="192.168.1.1"))
    assert not reaches(Endpoint(80, ip="54.187.216.72"))
    assert not reaches(Endpoint(5432, namespace="db", labels={"app": "postgres"}))


def test_only_agents_reach_opgates_agent_ports_and_never_its_ops_port() -> None:
    """opgate's ingress: agents on 8080/3128, approvers on 8081; agents never on 8081."""
    policy = one(network_policies(), "NetworkPolicy", "opgate")["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    by_port: dict[int, list[dict[str, Any]]] = {}
    for rule in policy["ingress"]:
        for port in rule["ports"]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    assert set(by_port) == {AGENT_PORT, FORWARD_PORT, OPS_PORT}
    for peer in by_port[OPS_PORT]:
        assert not selects(peer["podSelector"], AGENT_LABELS)
    for peer in by_port[AGENT_PORT] + by_port[FORWARD_PORT]:
        assert selects(peer["podSelector"], AGENT_LABELS)


# --- container image ----------------------------------------------------------------------


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text("utf-8"))
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_builds_in_stages_and_runs_as_a_numeric_non_root_user() -> None:
    """A build stage makes the wheels, a slim runtime installs them and runs as UID 10001."""
    steps = dockerfile_instructions(DOCKERFILE)
    stages = [args for op, args in steps if op == "FROM"]
    assert len(stages) >= 2
    assert stages[0].endswith("AS build")
    assert stages[-1].endswith("AS runtime")
    runtime = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    users = [args for op, args in runtime if op == "USER"]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit()  # numeric, so Kubernetes' runAsNonRoot can verify it
    assert int(uid) != 0
    installs = [args for op, args in runtime if op == "RUN" and "pip install" in args]
    assert len(installs) == 1
    assert "from=build" in installs[0]
    assert "--no-index" in installs[0]


def test_dockerfile_bakes_no_secret_and_checks_health() -> None:
    """No secret-looking ENV/ARG value, no secrets copied in; HEALTHCHECK asks /healthz."""
    steps = dockerfile_instructions(DOCKERFILE)
    for op, args in steps:
        if op in {"ENV", "ARG"}:
            for name, _, value in re.findall(r"([A-Z0-9_]+)(=)?(\S*)", args):
                if SECRET_NAME.search(name):
                    assert name == "OPGATE_SECRETS_DIR", name  # a path, not a secret
                    assert value.startswith("/run/"), value
        if op in {"COPY", "ADD"}:
            assert not re.search(r"\.env\b|secret|\.pem|\.key\b", args), args
    health = [args for op, args in steps if op == "HEALTHCHECK"]
    assert len(health) == 1
    assert "/healthz" in health[0]
    exposed = {int(p) for op, args in steps if op == "EXPOSE" for p in args.split()}
    assert exposed == {AGENT_PORT, FORWARD_PORT, OPS_PORT}
    env = " ".join(args for op, args in steps if op == "ENV")
    assert "OPGATE_POLICY_DIR=/etc/opgate/policies" in env
    assert dict(steps)["ENTRYPOINT"] == '["opgate"]'


@pytest.mark.parametrize("path", [DOCKERFILE, DEPLOY / "localstripe" / "Dockerfile"])
def test_dockerfiles_pass_hadolint(path: Path) -> None:
    """hadolint (Dockerfile best practices and shell checks) finds nothing, warnings included."""
    result = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- the container health check --------------------------------------------------------------


def healthcheck_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "opgate_healthcheck", DEPLOY / "container" / "healthcheck.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ("0.0.0.0:8081", "http://127.0.0.1:8081/healthz"),
        ("[::]:8081", "http://[::1]:8081/healthz"),
        ("127.0.0.1:9000", "http://127.0.0.1:9000/healthz"),
        ("[::1]:8081", "http://[::1]:8081/healthz"),
    ],
    ids=["IPv4 wildcard", "IPv6 wildcard", "one IPv4 address", "one IPv6 address"],
)
def test_healthcheck_probes_the_ops_listener_on_a_reachable_address(listen: str, url: str) -> None:
    """A wildcard bind address is probed on loopback; a specific one as it is."""
    assert healthcheck_module().health_url(listen, "/healthz") == url


class _OpsStandIn(BaseHTTPRequestHandler):
    """Answers like opgate's ops listener: alive, but not ready."""

    def do_GET(self) -> None:
        status = {"/healthz": 200, "/readyz": 503}.get(self.path, 404)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def ops_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OpsStandIn)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run_healthcheck(ops_listen: str, path: str, **extra_env: str) -> int:
    env = {"OPGATE_OPS_LISTEN": ops_listen, "PATH": "/usr/bin:/bin", **extra_env}
    script = str(DEPLOY / "container" / "healthcheck.py")
    result = subprocess.run(
        [sys.executable, script, path], env=env, capture_output=True, check=False, timeout=20
    )
    return result.returncode


def test_healthcheck_exits_zero_only_for_a_200(ops_port: int) -> None:
    """Healthy when /healthz answers 200; unhealthy on 503 and when nothing listens."""
    assert run_healthcheck(f"0.0.0.0:{ops_port}", "/healthz") == 0
    assert run_healthcheck(f"0.0.0.0:{ops_port}", "/readyz") == 1
    closed = socket_port_with_nothing_listening()
    assert run_healthcheck(f"127.0.0.1:{closed}", "/healthz") == 1


def test_healthcheck_ignores_proxy_settings(ops_port: int) -> None:
    """An HTTP_PROXY in the container's environment does not route the check elsewhere."""
    dead_proxy = f"http://127.0.0.1:{socket_port_with_nothing_listening()}"
    code = run_healthcheck(
        f"0.0.0.0:{ops_port}", "/healthz", HTTP_PROXY=dead_proxy, http_proxy=dead_proxy
    )
    assert code == 0


def socket_port_with_nothing_listening() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- systemd ------------------------------------------------------------------------------


def unit_directives(path: Path) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: sections of keys, a key may repeat (configparser refuses that)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in path.read_text("utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` reports nothing (unknown keys and bad values print warnings)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here; the unit is only parsed")
    # verify checks that ExecStart's program exists: stand one in for the installed opgate.
    stub = tmp_path / "opgate"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    unit = tmp_path / "opgate.service"
    unit.write_text(UNIT.read_text("utf-8").replace("/opt/opgate/bin/opgate", str(stub)))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0
    assert result.stdout + result.stderr == ""


def test_systemd_unit_is_hardened_reloads_on_sighup_and_drains_on_sigterm() -> None:
    """Unprivileged and sandboxed; reload is SIGHUP; the stop timeout exceeds the drain."""
    unit = unit_directives(UNIT)
    service = {key: values[-1] for key, values in unit["Service"].items()}
    assert service["ExecStart"].endswith("opgate serve")
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["KillSignal"] == "SIGTERM"
    environment = dict(v.split("=", 1) for v in unit["Service"]["Environment"])
    drain = drain_seconds(environment)
    assert drain > longest_provider_timeout()
    assert int(service["TimeoutStopSec"]) > drain
    assert service["DynamicUser"] == "yes" or service.get("User") not in (None, "root")
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "RestrictSUIDSGID": "yes",
    }.items():
        assert service[key] == value, key
    assert service["EnvironmentFile"] == "/etc/opgate/opgate.env"
    assert "OPGATE_SECRETS_DIR=/run/credentials/opgate.service" in unit["Service"]["Environment"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_env_example_holds_placeholders_only() -> None:
    """The env file example names every secret-bearing setting with a placeholder value."""
    lines = (DEPLOY / "systemd" / "opgate.env.example").read_text("utf-8").splitlines()
    values = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    for key in ("OPGATE_DATABASE_URL", "OPGATE_ADMIN_TOKEN_SHA256", "OPGATE_AGENTS"):
        assert PLACEHOLDER in values[key], key
    assert not any(key.startswith("OPGATE_SECRET_") for key in values)
