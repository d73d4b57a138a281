"""The ``opgate`` command line (also ``python -m proxy``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from proxy.authoring.commands import add_policy_commands
from proxy.observe.auditlog.cli import add_audit_commands
from proxy.observe.logs import configure_logging
from proxy.operations.cli import add_ops_commands
from proxy.operations.proposals_cli import add_proposal_commands


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    result: int = handler(args)
    return result


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opgate")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opgate",
        # plain text: the module docstring is reStructuredText, a terminal shows it verbatim
        description="opgate: a tool-boundary enforcing egress proxy for AI agents "
        "(also: python -m proxy).",
    )
    parser.add_argument("--version", action="version", version=f"opgate {_version()}")
    commands = parser.add_subparsers()

    serve = commands.add_parser("serve", help="run the agent listener and the operations API")
    _setting_flags(serve)
    serve.add_argument("--dev", action="store_true", help="generate local trial tokens")
    serve.add_argument(
        "--workers", type=int, help="worker processes sharing the ports (default: one per core)"
    )
    serve.set_defaults(handler=_serve)

    migrate = commands.add_parser("migrate", help="apply the database schema and exit")
    _setting_flags(migrate)
    migrate.set_defaults(handler=_migrate)

    token = commands.add_parser("token", help="make a new agent or admin token")
    token.set_defaults(handler=_token)

    ca = commands.add_parser("ca", help="the forward-proxy interception CA")
    ca_commands = ca.add_subparsers()
    ca_init = ca_commands.add_parser("init", help="create the CA (kept if it exists)")
    ca_init.add_argument("--data-dir", type=Path)
    ca_init.add_argument("--ca-dir", type=Path, help="default: <data_dir>/ca")
    ca_init.set_defaults(handler=_ca_init)

    mcp = commands.add_parser(
        "mcp", help="serve opgate's operations as MCP tools over stdio, relayed to an opgate"
    )
    mcp.add_argument("--url", required=True, help="the opgate agent listener, http://HOST:PORT")
    mcp.add_argument(
        "--token", help="the agent's opgate token (default: $OPGATE_AGENT_TOKEN, kept out of ps)"
    )
    mcp.set_defaults(handler=_mcp)

    add_ops_commands(commands)
    add_proposal_commands(commands)  # proposals list, approve, decline
    add_audit_commands(commands)  # audit verify, show, export: proxy/observe/auditlog/cli.py

    policy = commands.add_parser("policy", help="policy tools")
    policy_commands = policy.add_subparsers()
    add_policy_commands(
        policy_commands
    )  # check, schema, test, explain: proxy/authoring/commands.py
    return parser


def _setting_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="PostgreSQL primary (default: embedded)")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--policy-dir", type=Path)
    parser.add_argument("--agent-listen", help="HOST:PORT of the agent listener")
    parser.add_argument("--ops-listen", help="HOST:PORT of the operations API")


def _settings(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> Any:
    from pydantic_settings import SettingsError

    from proxy.settings import load_settings

    flags = {
        "database_url": args.database_url,
        "data_dir": args.data_dir,
        "policy_dir": args.policy_dir,
        "agent_listen": args.agent_listen,
        "ops_listen": args.ops_listen,
        **(extra or {}),
    }
    try:
        return load_settings(flags)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            print(f"opgate: setting {where}: {err['msg']}", file=sys.stderr)
        raise SystemExit(2) from exc
    except SettingsError as exc:
        # raised before any field is validated, for a dict or list setting whose variable is
        # not JSON, in a sentence that names neither the variable nor what is wrong
        found = re.search(r'parsing value for field "(\w+)"', str(exc))
        field = found.group(1) if found else "?"
        print(f"opgate: setting {field} (OPGATE_{field.upper()}): not valid JSON", file=sys.stderr)
        raise SystemExit(2) from exc


def _serve(args: argparse.Namespace) -> int:
    from proxy.devmode import DEV_AGENT_ID, dev_credentials, dev_overrides
    from proxy.errors import (
        ConfigurationError,
        ReplicationNotDurable,
        StoreUnavailable,
        store_unavailable_line,
    )
    from proxy.policy.load import PolicyLoadError
    from proxy.policy.reload import load_validated_policy
    from proxy.server import serve
    from proxy.workers import effective_workers, run_supervisor

    settings = _settings(args, {"workers": args.workers})
    configure_logging(settings.log_level)
    if args.dev:
        creds = dev_credentials(settings.data_dir)
        # the audit log's signing key, unless one is configured (read as a secret: Secrets)
        if not (settings.secrets_dir and (settings.secrets_dir / "transparency_key").is_file()):
            os.environ.setdefault("OPGATE_SECRET_TRANSPARENCY_KEY", creds["transparency_key"])
        explicit = settings.model_dump(exclude_unset=True)
        settings = type(settings)(**dev_overrides(creds, explicit))
        print(
            f"opgate dev mode: admin token {creds['admin_token']}, "
            f"agent token ({DEV_AGENT_ID}, tenant demo) {creds['agent_token']} "
            f"(kept in {settings.data_dir / 'dev-credentials.json'})",
            file=sys.stderr,
        )
    try:
        if settings.database_url:  # the embedded default is exempt: it has no standby
            _check_follows_primary(settings.database_url)
        workers = effective_workers(settings)
        if workers == 1:
            asyncio.run(serve(settings))
        else:
            # Validate the policy once up front: workers that cannot start would only respawn.
            load_validated_policy(settings.policy_dir)
            return run_supervisor(settings, workers)
    except PolicyLoadError as exc:
        print(f"opgate: the policy set is invalid:\n{exc}", file=sys.stderr)
        return 2
    except ReplicationNotDurable as exc:  # before ConfigurationError, its base
        print(f"opgate: the database's replication is not durable: {exc}", file=sys.stderr)
        return 2
    except ConfigurationError as exc:  # a listener's address, the database URL...
        print(f"opgate: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(store_unavailable_line(exc), file=sys.stderr)
        return 2
    return 0


def _check_follows_primary(database_url: str) -> None:
    """Several hosts that may be a standby: ConfigurationError. One host: said once, here,
    before any worker starts."""
    import os

    import structlog

    from proxy.store.dsn import check_follows_primary

    warning = check_follows_primary(database_url, os.environ)
    if warning is not None:
        structlog.get_logger("opgate.server").warning("database_single_host", detail=warning)


def _mcp(args: argparse.Namespace) -> int:
    import os

    import anyio

    from proxy.mcp.stdio import serve_stdio

    token = args.token or os.environ.get("OPGATE_AGENT_TOKEN")
    if not token:
        print("opgate mcp: give --token or set OPGATE_AGENT_TOKEN", file=sys.stderr)
        return 2
    anyio.run(serve_stdio, args.url, token)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from proxy.errors import StoreUnavailable, store_unavailable_line
    from proxy.store.embedded import database_dsn
    from proxy.store.migrate import migrate

    settings = _settings(args)

    async def run() -> list[int]:
        async with database_dsn(settings.database_url, settings.data_dir) as dsn:
            return await migrate(dsn)

    try:
        applied = asyncio.run(run())
    except StoreUnavailable as exc:
        print(store_unavailable_line(exc), file=sys.stderr)
        return 2
    print(f"applied migrations: {applied or 'none (up to date)'}")
    return 0


def _ca_init(args: argparse.Namespace) -> int:
    from proxy.forward.ca import CA_CERT_FILE, init_ca
    from proxy.settings import load_settings

    settings = load_settings({"data_dir": args.data_dir, "ca_dir": args.ca_dir})
    created = init_ca(settings.forward_ca_dir)
    cert = settings.forward_ca_dir / CA_CERT_FILE
    print(f"{'created' if created else 'exists'}: {cert}")
    print("Agents trust it with SSL_CERT_FILE / REQUESTS_CA_BUNDLE (the key stays here).")
    return 0


def _token(args: argparse.Namespace) -> int:
    from proxy.gate.identity import new_token, token_digest

    token = new_token()
    print(f"token:        {token}")
    print(f"token_sha256: {token_digest(token)}")
    print("Give the token to its holder; configure only the digest.", file=sys.stderr)
    return 0
