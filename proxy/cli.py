"""The ``opgate`` command line (also ``python -m proxy``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from proxy.authoring.commands import add_policy_commands
from proxy.observe.auditlog.cli import add_audit_commands
from proxy.observe.logs import configure_logging
from proxy.operations.cli import add_ops_commands, run_ops
from proxy.proposals.cli import add_proposal_commands, run_proposals
from proxy.settings import InvalidSettings, Settings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the (sub)command that was given them, which lists its flags
        _Parser.refuse(args.command_prog, f"unrecognized arguments: {' '.join(unknown)}")
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        if getattr(args, "audit_dev", False):  # `opgate audit ... --dev`: dev mode is ours
            refused = _dev_audit_log(args)
            if refused is not None:
                print(f"opgate audit: {refused}", file=sys.stderr)
                return 2
        result: int = handler(args)
    except InvalidSettings as exc:  # every command that reads the settings
        for problem in exc.problems:
            print(f"opgate: {problem}", file=sys.stderr)
        return 2
    return result


class _Parser(argparse.ArgumentParser):
    """argparse, but a wrong flag is one line saying what is wrong and where the flags are
    listed, not the whole usage (the subcommands' parsers are of this class too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the innermost parser's value wins: which command was given a flag it does not know
        self.set_defaults(command_prog=self.prog)

    def error(self, message: str) -> NoReturn:
        self.refuse(self.prog, message)

    @staticmethod
    def refuse(prog: str, message: str) -> NoReturn:
        print(f"{prog}: {message} ({prog} --help lists the flags)", file=sys.stderr)
        raise SystemExit(2)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opgate")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="opgate",
        # plain text: the module docstring is reStructuredText, a terminal shows it verbatim
        description="opgate: a tool-boundary enforcing egress proxy for AI agents "
        "(also: python -m proxy).",
    )
    parser.add_argument("--version", action="version", version=f"opgate {_version()}")
    commands = parser.add_subparsers()

    serve = commands.add_parser(
        "serve", help="run the listeners: agents, the operations API, the forward proxy"
    )
    _setting_flags(serve)
    serve.add_argument(
        "--forward-listen",
        help="HOST:PORT of the forward-proxy listener (HTTPS_PROXY); null: none",
    )
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

    ops = add_ops_commands(commands)
    _operator_flags(ops)
    ops.set_defaults(handler=_operator(run_ops, "opgate ops"))
    proposals = add_proposal_commands(commands)  # proposals list, approve, decline
    _operator_flags(proposals)
    proposals.set_defaults(handler=_operator(run_proposals, "opgate proposals"))
    # audit verify, show, export, bundle, verify-bundle, ...: proxy/observe/auditlog/cli.py
    add_audit_commands(commands)

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
    """The settings, the flags given first (InvalidSettings: main says what is wrong)."""
    from proxy.settings import load_settings

    flags = {
        "database_url": args.database_url,
        "data_dir": args.data_dir,
        "policy_dir": args.policy_dir,
        "agent_listen": args.agent_listen,
        "ops_listen": args.ops_listen,
        **(extra or {}),
    }
    return load_settings(flags)


def _operator_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dev",
        action="store_true",
        help="as the admin of an `opgate serve --dev`: its token and its operations API "
        "(<data_dir>/dev-credentials.json, dev-instance.json)",
    )
    parser.add_argument("--data-dir", type=Path, help="--dev's data directory (default: data_dir)")


def _operator(
    run: Callable[[argparse.Namespace], int], command: str
) -> Callable[[argparse.Namespace], int]:
    """A client of the operations API (``opgate ops``, ``opgate proposals``), calling it where
    the server listens: ``--url``, else ``OPGATE_OPS_URL``, else (``--dev``) where the dev
    instance recorded it listens, else the ``ops_listen`` setting the server reads (its
    variable, or the config file). With ``--dev``, as the dev instance's admin."""

    def handler(args: argparse.Namespace) -> int:
        from proxy.devmode import NoDevInstance, operator_view
        from proxy.settings import load_settings

        settings = load_settings({"data_dir": args.data_dir})
        listen = settings.ops_listen
        if args.dev:
            try:
                creds, instance = operator_view(settings.data_dir)
            except NoDevInstance as exc:
                print(f"{command}: {exc} (or give --token)", file=sys.stderr)
                return 2
            args.token = creds["admin_token"]
            listen = instance.get("ops_listen") or listen
        args.url = args.url or os.environ.get("OPGATE_OPS_URL") or _client_url(listen)
        return run(args)

    return handler


def _dev_audit_log(args: argparse.Namespace) -> str | None:
    """``opgate audit ... --dev``: the database the dev instance recorded (unless one is given)
    into ``args``, and its log's signing key (unless one is configured) into the environment,
    before the audit command reads either; or why not."""
    from proxy.devmode import NoDevInstance, operator_view, use_dev_log_key
    from proxy.settings import load_settings

    given = {
        "database_url": args.database_url,
        "secrets_dir": args.secrets_dir,
        "data_dir": args.data_dir,
    }
    settings = load_settings(given)
    try:
        creds, instance = operator_view(settings.data_dir)
    except NoDevInstance as exc:
        return f"{exc} (or give --database-url and --log-key)"
    args.database_url = args.database_url or instance.get("database_url")
    use_dev_log_key(creds, settings.secrets_dir, os.environ)
    return None


def _client_url(listen: str) -> str:
    """The URL a client on this host calls a listener at: a wildcard address (``0.0.0.0``,
    ``[::]``) is called on loopback."""
    host, _, port = listen.rpartition(":")
    loopback = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}  # noqa: S104
    return f"http://{loopback.get(host, host)}:{port}"


def _serve(args: argparse.Namespace) -> int:
    from proxy.devmode import (
        DEV_AGENT_ID,
        dev_credentials,
        dev_overrides,
        record_dev_instance,
        use_dev_log_key,
    )
    from proxy.errors import (
        ConfigurationError,
        ReplicationNotDurable,
        StoreUnavailable,
        store_unavailable_line,
    )
    from proxy.observe.observer import transparency_signer
    from proxy.policy.load import PolicyLoadError
    from proxy.policy.reload import load_validated_policy
    from proxy.server import run_server
    from proxy.settings import Secrets
    from proxy.workers import effective_workers, run_supervisor

    settings = _settings(args, {"workers": args.workers, "forward_listen": args.forward_listen})
    configure_logging(settings.log_level)
    if args.dev:
        creds = dev_credentials(settings.data_dir)
        # the audit log's signing key, unless one is configured (read as a secret: Secrets)
        use_dev_log_key(creds, settings.secrets_dir, os.environ)
        explicit = settings.model_dump(exclude_unset=True)
        settings = type(settings)(**dev_overrides(creds, explicit))
        # where it runs, for `opgate ops|proposals|audit --dev` in another shell
        record_dev_instance(
            settings.data_dir,
            {
                "agent_listen": settings.agent_listen,
                "ops_listen": settings.ops_listen,
                "database_url": settings.database_url,
            },
        )
        signer = transparency_signer(Secrets(settings.secrets_dir))
        print(
            f"opgate dev mode: admin token {creds['admin_token']}, "
            f"agent token ({DEV_AGENT_ID}, tenant demo) {creds['agent_token']} "
            f"(kept in {settings.data_dir / 'dev-credentials.json'})",
            file=sys.stderr,
        )
        if signer is not None:
            print(
                f"opgate dev mode: the audit log's verifier key {signer.verifier().vkey()} "
                "(`opgate audit verify --dev` checks the log with it)",
                file=sys.stderr,
            )
    try:
        if settings.database_url:  # the embedded default is exempt: it has no standby
            _check_follows_primary(settings.database_url)
        # Validated once up front: workers that cannot start would only respawn.
        _warn_unconfigured(settings, load_validated_policy(settings.policy_dir))
        if settings.forward_listen:  # made once, not by each worker at once
            _forward_ca(settings)
        workers = effective_workers(settings)
        if workers == 1:
            run_server(settings)
        else:
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


def _warn_unconfigured(settings: Settings, policy: Any) -> None:
    """A warning line for each thing a start can do without but that leaves part of opgate
    refusing everyone: no admin token, no agents, a provider whose secrets are missing."""
    import structlog

    from proxy.settings import Secrets

    log = structlog.get_logger("opgate.server")
    if settings.admin_token_sha256 is None:
        log.warning(
            "no_admin_token",
            detail="nobody can approve operations: set admin_token_sha256 "
            "(`opgate token` prints a token and its digest)",
        )
    if not settings.agents:
        log.warning(
            "no_agents",
            detail="every agent request is refused: configure agents (id, tenant, token_sha256)",
        )
    secrets = Secrets(settings.secrets_dir)
    for provider in policy.providers:
        credential = provider.credential
        names = [getattr(credential, "client_id_secret", None), getattr(credential, "secret", None)]
        missing = [name for name in names if name and secrets.secret(name) is None]
        if missing:
            log.warning(
                "provider_secret_missing",
                provider=provider.provider,
                secrets=missing,
                detail="its requests are refused (503 credential_unavailable): set "
                "OPGATE_SECRET_<NAME> or <secrets_dir>/<name>",
            )


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


def _forward_ca(settings: Settings) -> bool:
    """The forward proxy's CA, made if absent (True: made now); a directory that cannot hold
    it is InvalidSettings naming ca_dir (or data_dir, when ca_dir is not set)."""
    from proxy.forward.ca import init_ca

    try:
        return init_ca(settings.forward_ca_dir)
    except OSError as exc:
        import os

        setting = "ca_dir" if settings.ca_dir is not None else "data_dir"
        variable = f"OPGATE_{setting.upper()}"
        source = f" ({variable})" if variable in os.environ else ""  # else a flag or the file
        reason = exc.strerror or str(exc)
        raise InvalidSettings(
            [
                f"setting {setting}{source}: cannot make the forward proxy's CA in "
                f"{settings.forward_ca_dir}: {reason}"
            ]
        ) from exc


def _ca_init(args: argparse.Namespace) -> int:
    from proxy.errors import ConfigurationError
    from proxy.forward.ca import CA_CERT_FILE
    from proxy.settings import load_settings

    settings = load_settings({"data_dir": args.data_dir, "ca_dir": args.ca_dir})
    try:
        created = _forward_ca(settings)
    except ConfigurationError as exc:  # half a CA: a certificate without its key, or the reverse
        print(f"opgate: {exc}", file=sys.stderr)
        return 2
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
