"""One function per command: arguments in, exit code out. The work is in the modules they call."""

from __future__ import annotations

import argparse
import time
from typing import Any

from outbox.protocol.topics import TopicNames
from outbox.settings import variable
from outbox_cli import admin, services
from outbox_cli import config as config_cmd
from outbox_cli import inspect as inspect_cmd
from outbox_cli import resume as resume_cmd
from outbox_cli import status as status_cmd
from outbox_cli.errors import UsageError
from outbox_cli.history import parse_txn_id
from outbox_cli.kafka import Reader, connection, probe, require
from outbox_cli.settings import SERVICES, available, operator_settings

BOOTSTRAP = variable("bootstrap_servers")


def topics(args: argparse.Namespace) -> int:
    return admin.ensure_topics(args.replication_factor, args.timeout)


def migrate(args: argparse.Namespace) -> int:
    return admin.migrate(_database_url(args), args.revision, args.timeout)


def evidence(args: argparse.Namespace) -> int:
    return admin.prune(_database_url(args), args.older_than, args.batch_size, args.timeout)


def _database_url(args: argparse.Namespace) -> str:
    """``--db-url``, else the producer settings' ``database_url`` (env, its file, the config
    file): a URL given as an argument shows its password to anyone who lists processes."""
    if args.db_url:
        return str(args.db_url)
    from outbox.env import collect

    service = SERVICES["producer"]
    values, _ = collect(service.cls(), service.prefix, None, {})
    url = values.get("database_url")
    if not url:
        raise UsageError(
            f"no database: give --db-url, or set {variable('database_url')} (or "
            f"{variable('database_url')}_FILE, a file holding it)"
        )
    return str(url)


def relay(args: argparse.Namespace) -> int:
    return services.run_relay(args.timeout)


def checker(args: argparse.Namespace) -> int:
    return services.run_checker(args.timeout)


def audit(argv: list[str]) -> int:
    return services.run_audit(argv)


def demo(argv: list[str]) -> int:
    return services.run_demo(argv)


def config(args: argparse.Namespace) -> int:
    chosen = [s.name for s in available()] if args.service == "all" else [args.service]
    return config_cmd.show(chosen, as_json=args.json)


def status(args: argparse.Namespace) -> int:
    config, names, found = _connect(args.timeout)
    since_ms = None if args.since is None else int((time.time() - args.since) * 1000)
    ttl = args.registry_ttl if args.registry_ttl is not None else _registry_ttl()
    with Reader(config, args.timeout) as reader:
        rows, live, unreadable = status_cmd.collect(reader, names, found[names.half], since_ms, ttl)
    return status_cmd.report(rows, live, unreadable, as_json=args.json)


def inspect(args: argparse.Namespace) -> int:
    txn_id = parse_txn_id(args.txn_id)
    config, names, found = _connect(args.timeout)
    with Reader(config, args.timeout) as reader:
        history = inspect_cmd.gather(reader, names, found, txn_id, args.slack)
    inspect_cmd.show(history, names, as_json=args.json)
    return 0


def resume(args: argparse.Namespace) -> int:
    txn_id = parse_txn_id(args.txn_id)
    config, names, found = _connect(args.timeout)
    with Reader(config, args.timeout) as reader:
        done = resume_cmd.resume(
            config,
            reader,
            names,
            found[names.half],
            txn_id,
            slack_s=args.slack,
            timeout=args.timeout,
        )
    print(resume_cmd.describe(done, names))
    return 0


def _connect(timeout: float) -> tuple[dict[str, Any], TopicNames, dict[str, int]]:
    """The operator's Kafka settings, topic names, and the partition counts of topics that
    exist; exits with a clear error when one of the outbox's topics is missing."""
    settings = operator_settings()
    config = connection(settings.bootstrap_servers, settings.kafka)
    names = settings.topics
    found = probe(config, timeout, BOOTSTRAP)
    require(found, names.all())
    return config, names, found


def _registry_ttl() -> float:
    """The checker's registry TTL from its settings (env or file), else its default."""
    from outbox.env import collect, field_defaults

    service = SERVICES["checker"]
    cls = service.cls()
    values, _ = collect(cls, service.prefix, None, {}, fallbacks=service.fallbacks)
    ttl: float = values.get("registry_ttl_s", field_defaults(cls)["registry_ttl_s"])
    return ttl
