"""``opgate policy check|schema|test|explain``: the platform team's policy tools.

Offline but for ``explain --operation-id`` (reads the operation from the database). Findings go
to stderr as ``file:line:col: message; fix: hint``; the exit status is 1 on any error or failed
case, so each command can run in the team's own CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from proxy.policy.model import Provider

SCHEMA_ID = "https://opgate.dev/schema/policy-v1.json"


def add_policy_commands(commands: Any) -> None:
    """Register the subcommands on ``opgate policy``'s subparsers."""
    check = commands.add_parser("check", help="validate a policy directory offline")
    check.add_argument("directory", type=Path)
    check.add_argument(
        "--secrets-dir",
        type=Path,
        default=os.environ.get("OPGATE_SECRETS_DIR") or None,
        help="the deployment's secrets: a missing credential becomes an error, not a warning",
    )
    check.set_defaults(handler=policy_check)

    schema = commands.add_parser("schema", help="write the JSON Schema of policy files")
    schema.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    schema.set_defaults(handler=policy_schema)

    test = commands.add_parser("test", help="run the *.tests.yaml cases next to the policies")
    test.add_argument("directory", type=Path)
    test.add_argument("-v", "--verbose", action="store_true", help="explain failed cases")
    test.set_defaults(handler=policy_test)

    explain = commands.add_parser("explain", help="which rule and checks decide a request")
    explain.add_argument("method")
    explain.add_argument("path", help="as the agent sends it, e.g. /stripe/v1/refunds")
    explain.add_argument("--policy-dir", type=Path, default=Path("policies"))
    explain.add_argument(
        "-H", "--header", action="append", default=[], help="'Name: value' (repeatable)"
    )
    body = explain.add_mutually_exclusive_group()
    body.add_argument("--form", action="append", help="name=value, form-encoded (repeatable)")
    body.add_argument("--json", dest="json_body", help="a JSON body")
    body.add_argument("--data", help="a raw body (give its Content-Type with -H)")
    explain.add_argument("--agent", help="ID:TENANT the request comes from")
    source = explain.add_mutually_exclusive_group()
    source.add_argument("--operation", type=Path, help="a YAML file with an operation row")
    source.add_argument("--operation-id", help="read this operation from the database")
    explain.add_argument(
        "--lookup",
        action="append",
        default=[],
        metavar="PATH=FILE",
        help="the provider's JSON answer (200) to a precondition lookup of PATH (repeatable)",
    )
    explain.add_argument("--database-url", help="default: OPGATE_DATABASE_URL")
    explain.add_argument("--output-json", action="store_true", help="print JSON")
    explain.set_defaults(handler=policy_explain)


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of a policy file, from the pydantic models (validation mode)."""
    schema = Provider.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "opgate policy file, version 1",
    }


def render_schema() -> str:
    return json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"


def policy_check(args: argparse.Namespace) -> int:
    from proxy.gate.credentials import CredentialSource
    from proxy.policy.lint import SecretsCheck, Severity, lint_policy_texts
    from proxy.policy.load import build_policy_set, read_policy_texts

    texts = read_policy_texts(args.directory)
    if not texts:
        print(f"{args.directory}:1:1: no *.yaml policy files found", file=sys.stderr)
        return 1
    secrets = CredentialSource(args.secrets_dir)
    findings = lint_policy_texts(
        texts,
        SecretsCheck(lambda name: secrets.secret(name) is not None, args.secrets_dir is not None),
    )
    # The findings and their summary are one report on one stream, the summary last: split
    # across stdout and stderr, a tool showing one stream before the other put it first.
    for finding in findings:
        print(finding)
    failed = [f for f in findings if f.severity is Severity.ERROR]
    if failed:
        print(f"{len(failed)} errors, {len(findings) - len(failed)} warnings")
        return 1
    policy = build_policy_set(texts, str(args.directory))
    rules = sum(len(p.rules) for p in policy.providers)
    warnings = f", {len(findings)} warnings" if findings else ""
    print(
        f"ok: {len(policy.providers)} providers, {rules} rules, version {policy.version}{warnings}"
    )
    return 0


def policy_schema(args: argparse.Namespace) -> int:
    text = render_schema()
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, "utf-8")
    return 0


def policy_test(args: argparse.Namespace) -> int:
    from proxy.authoring.cases import case_files, load_cases, render_table, run_cases
    from proxy.authoring.explain import render_text
    from proxy.policy.load import PolicyLoadError
    from proxy.policy.reload import load_validated_policy

    try:
        policy = load_validated_policy(args.directory)
    except PolicyLoadError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    files = case_files(args.directory)
    if not files:
        print(f"{args.directory}: no *.tests.yaml files", file=sys.stderr)
        return 1
    results = []
    broken = False
    for path in files:
        cases, problems = load_cases(path)
        for problem in problems:
            print(problem, file=sys.stderr)
        broken = broken or bool(problems)
        if cases is not None:
            results.extend(run_cases(policy, cases, str(path)))
    print(render_table(results))
    if args.verbose:
        for result in results:
            if not result.passed:
                print(f"\n--- {result.case}\n{render_text(result.explanation)}")
    return 1 if broken or not all(r.passed for r in results) else 0


def policy_explain(args: argparse.Namespace) -> int:
    from urllib.parse import urlencode

    from proxy.authoring.cases import CaseOperation
    from proxy.authoring.explain import EXPLAIN_AGENT, SampleRequest, explain, render_text
    from proxy.gate.checks import Agent
    from proxy.policy.load import PolicyLoadError, load_policy_dir, parse_yaml_model

    try:
        policy = load_policy_dir(args.policy_dir)
    except PolicyLoadError as exc:
        print(f"opgate: the policy set is invalid:\n{exc}", file=sys.stderr)
        return 2
    headers: list[tuple[str, str]] = []
    for header in args.header:
        name, sep, value = header.partition(":")
        if not sep:
            print(f"opgate: header {header!r} is not 'Name: value'", file=sys.stderr)
            return 2
        headers.append((name.strip(), value.strip()))
    names = {name.lower() for name, _ in headers}
    body = b""
    if args.form:
        body = urlencode([tuple(f.split("=", 1)) for f in args.form]).encode()
        if "content-type" not in names:
            headers.append(("Content-Type", "application/x-www-form-urlencoded"))
    elif args.json_body is not None:
        body = args.json_body.encode()
        if "content-type" not in names:
            headers.append(("Content-Type", "application/json"))
    elif args.data is not None:
        body = args.data.encode()
    agent: Agent | None = None
    if args.agent:
        agent_id, _, tenant = args.agent.partition(":")
        agent = Agent(agent_id=agent_id, tenant=tenant or agent_id)
    sample = SampleRequest(args.method.upper(), args.path, tuple(headers), body)
    lookups: dict[str, tuple[int, bytes]] = {}
    for given in args.lookup:
        path, sep, file = given.partition("=")
        if not sep:
            print(f"opgate: lookup {given!r} is not PATH=FILE", file=sys.stderr)
            return 2
        lookups[path] = (200, Path(file).read_bytes())

    if args.operation_id is not None:
        from proxy.errors import StoreUnavailable, store_unavailable_line

        try:
            explanation = asyncio.run(_explain_from_database(args, policy, sample, agent, lookups))
        except StoreUnavailable as exc:
            print(store_unavailable_line(exc), file=sys.stderr)
            return 2
    else:
        rows = []
        if args.operation is not None:
            spec, problems = parse_yaml_model(
                args.operation.read_text("utf-8"), str(args.operation), CaseOperation
            )
            if spec is None:
                for problem in problems:
                    print(problem, file=sys.stderr)
                return 2
            route = policy.route(args.path.partition("?")[0])
            tenant = agent.tenant if agent else spec.tenant or EXPLAIN_AGENT.tenant
            row = spec.row(policy, tenant, route.provider.provider if route else None)
            rows.append(row)
            sample = sample.with_header_default("X-Operation-Id", row.operation_id)
            agent = agent or Agent(agent_id=row.agent_id or "explain", tenant=row.tenant)
        sample = SampleRequest(
            sample.method, sample.path, sample.headers, sample.body, agent or EXPLAIN_AGENT
        )
        explanation = explain(policy, sample, rows, lookups)
    if args.output_json:
        print(json.dumps(explanation.to_json(), indent=2))
    else:
        print(render_text(explanation))
    return 0


async def _explain_from_database(
    args: argparse.Namespace, policy: Any, sample: Any, agent: Any, lookups: Any
) -> Any:
    from proxy.authoring.explain_api import explain_with_store
    from proxy.settings import load_settings
    from proxy.store.embedded import database_dsn
    from proxy.store.store import Store

    settings = load_settings({"database_url": args.database_url})
    async with database_dsn(settings.database_url, settings.data_dir) as dsn:
        store = await Store.open(dsn, min_size=1, max_size=1)
        try:
            return await explain_with_store(
                policy, store, sample, args.operation_id, agent, lookups
            )
        finally:
            await store.close()
