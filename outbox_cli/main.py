"""The ``kafka-outbox`` console script: argument parsing, settings, errors and exit codes.

Errors print one line, ``kafka-outbox: error: ...``, on stderr and end the process with the exit
code of :mod:`outbox_cli.errors`; ``--debug`` adds the traceback and librdkafka's log.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import textwrap
import traceback
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from outbox.env import CONFIG_FILE_VARIABLE, FILE_SUFFIX
from outbox.errors import ConfigurationError, OutboxError
from outbox.kafka_logging import LOGGER_NAME as LIBRDKAFKA_LOGGER
from outbox_cli.errors import EXIT_CODES, PROBLEM, USAGE, CommandError, UsageError
from outbox_cli.history import DEFAULT_SLACK_S, parse_duration

PROG = "kafka-outbox"
#: ``evidence prune``'s default retention (outbox.pruning.DEFAULT_RETENTION, without importing
#: SQLAlchemy to draw the help).
PRUNE_RETENTION_S = 14 * 24 * 3600.0
PASS_THROUGH = ("audit", "demo")
DB_URL_HELP = (
    "SQLAlchemy URL of the producer's DB; default: OUTBOX_DATABASE_URL, OUTBOX_DATABASE_URL_FILE "
    "(a file holding it, keeping the password out of ps) or database_url in [producer]"
)
#: The long-running services: their log keeps librdkafka's lines without ``--debug``.
SERVICE_COMMANDS = ("relay", "checker")


def version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("kafka-outbox")
    except PackageNotFoundError:
        from outbox import __version__

        return __version__


def exit_codes_epilog() -> str:
    lines = ["exit codes:"]
    for code, meaning in EXIT_CODES:
        lines += textwrap.wrap(meaning, 76, initial_indent=f"  {code}  ", subsequent_indent="     ")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Transactional outbox for Apache Kafka: set-up, services and operations.",
        epilog=exit_codes_epilog()
        + "\n\nsettings: OUTBOX_* environment variables and/or a TOML file (--config), "
        "see docs/cli.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(parser, top=True)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _topics(commands)
    migrate = _add(commands, "migrate", "create or upgrade the outbox tables (Alembic) in a DB")
    migrate.add_argument("--db-url", help=DB_URL_HELP)
    migrate.add_argument("--revision", default="heads", help="target revision; default heads")
    _evidence(commands)
    _add(commands, "relay", "run a relay: promotes committed half messages to their topics")
    _add(commands, "checker", "run a checker: asks producers about undecided transactions")
    for name, text in (
        ("audit", "run the Spark audit (checker.audit); arguments go to it, see `audit --help`"),
        ("demo", "run `make demo`'s orders demo on a local broker; see `demo --help`"),
    ):
        commands.add_parser(name, help=text, description=text, add_help=False)
    status = _add(commands, "status", "pending and given-up transactions per group and partition")
    status.add_argument(
        "--since",
        type=_duration,
        metavar="DURATION",
        help="scan only records of the last DURATION (e.g. 6h); default: everything retained",
    )
    status.add_argument(
        "--registry-ttl",
        type=_duration,
        metavar="DURATION",
        help="a producer instance is live while its heartbeat is younger; default: the "
        "checker's registry_ttl_s (30s)",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    inspect = _add(commands, "inspect", "one transaction: halves, ops, promotions, dead letters")
    _txn_arguments(inspect)
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    resume = _add(commands, "resume", "put a given-up transaction back to be checked again")
    _txn_arguments(resume)
    config = _add(commands, "config", "print the effective settings (secrets masked)")
    config.add_argument(
        "--service",
        choices=("all", "producer", "relay", "checker", "audit"),
        default="all",
        help="whose settings; default all",
    )
    config.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The global options; repeated on each command (without defaults, which would otherwise
    overwrite the ones given before the command) so they work on either side of it."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--config",
        metavar="FILE",
        default=default(None),
        help="TOML (or YAML) settings file with [producer], [relay], [checker], [audit] "
        f"sections; environment variables win over it (also: {CONFIG_FILE_VARIABLE})",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="show tracebacks and librdkafka's log",
    )
    parser.add_argument(
        "--timeout",
        type=_duration,
        default=default(15.0),
        metavar="DURATION",
        help="how long to wait for Kafka or the database before giving up (exit 3); default 15s",
    )
    parser.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,...]",
        default=default(None),
        help="the Kafka cluster, as Kafka's tools take it; wins over OUTBOX_BOOTSTRAP_SERVERS "
        "and the config file",
    )
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        default=default(None),
        help="librdkafka settings (key=value lines: security.protocol, sasl.*, ssl.*), as "
        "Kafka's tools take them; they win over the OUTBOX_*KAFKA__* variables",
    )


if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


def _add(commands: Commands, name: str, text: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        name,
        help=text,
        description=text,
        epilog=exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(parser, top=False)
    return parser


def _topics(commands: Commands) -> None:
    topics = _add(commands, "topics", "manage the internal topics")
    actions = topics.add_subparsers(dest="action", metavar="ACTION", required=True)
    ensure = _add(actions, "ensure", "create the missing internal topics, verify existing ones")
    ensure.add_argument(
        "--replication-factor",
        type=int,
        default=-1,
        help="replication factor of created topics; default: the broker's default",
    )


def _evidence(commands: Commands) -> None:
    evidence = _add(commands, "evidence", "upkeep of a producer database's evidence table")
    actions = evidence.add_subparsers(dest="action", metavar="ACTION", required=True)
    prune = _add(actions, "prune", "delete evidence and fence rows older than the retention")
    prune.add_argument("--db-url", help=DB_URL_HELP)
    prune.add_argument(
        "--older-than",
        type=_duration,
        default=PRUNE_RETENTION_S,
        metavar="DURATION",
        help="the retention: rows created longer ago go (at least 1d; keep them as long as "
        "the half topic keeps records); default 14d",
    )
    prune.add_argument(
        "--batch-size", type=int, default=10_000, help="rows per DB transaction; default 10000"
    )


def _txn_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("txn_id", metavar="TXN_ID", help="the transaction id (a UUIDv7)")
    parser.add_argument(
        "--slack",
        type=_duration,
        default=DEFAULT_SLACK_S,
        metavar="DURATION",
        help="search from this long before the id's timestamp (producer clock error); default 10m",
    )


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (see :data:`outbox_cli.errors.EXIT_CODES`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
        if rest and args.command not in PASS_THROUGH:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as done:  # --help (0) or bad usage (2), already printed by argparse
        return done.code if isinstance(done.code, int) else USAGE
    _logging(args.debug, args.command)
    try:
        with _scoped_environment(args):
            return dispatch(args, rest)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # one line for the operator; the traceback only on request
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {_message(err)}", file=sys.stderr)
        return exit_code_for(err)


@contextlib.contextmanager
def _scoped_environment(args: argparse.Namespace) -> Iterator[None]:
    """``--config``, ``--bootstrap-server`` and ``--command-config`` as the variables every
    settings object reads, for this command only: ``main`` called in-process leaves the
    environment as it was. A flag's variable hides its ``_FILE`` twin for the run (the flag
    wins over both)."""
    variables: dict[str, str] = {}
    if args.config:
        variables[CONFIG_FILE_VARIABLE] = args.config
    if args.bootstrap_server or args.command_config:
        from outbox_cli.settings import command_line_connection

        variables |= command_line_connection(args.bootstrap_server, args.command_config)
    hidden = [name + FILE_SUFFIX for name in variables if name != CONFIG_FILE_VARIABLE]
    before = {name: os.environ.get(name) for name in [*variables, *hidden]}
    try:
        for name in hidden:
            os.environ.pop(name, None)
        os.environ.update(variables)
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def exit_code_for(err: BaseException) -> int:
    if isinstance(err, CommandError):
        return err.exit_code
    if isinstance(err, ConfigurationError):
        return USAGE
    return PROBLEM


def _message(err: BaseException) -> str:
    if isinstance(err, OutboxError):
        return str(err)
    return f"unexpected {type(err).__name__}: {err} (run with --debug for the traceback)"


def _logging(debug: bool, command: str | None) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not debug and command not in SERVICE_COMMANDS:
        # A command's failure is its one line; a service's log shows librdkafka's (as it does
        # when started with python -m relay).
        logging.getLogger(LIBRDKAFKA_LOGGER).setLevel(logging.CRITICAL)


def dispatch(args: argparse.Namespace, rest: list[str]) -> int:
    from outbox_cli import commands

    handlers = {
        "topics": lambda: commands.topics(args),
        "migrate": lambda: commands.migrate(args),
        "evidence": lambda: commands.evidence(args),
        "relay": lambda: commands.relay(args),
        "checker": lambda: commands.checker(args),
        "audit": lambda: commands.audit(rest),
        "demo": lambda: commands.demo(rest),
        "status": lambda: commands.status(args),
        "inspect": lambda: commands.inspect(args),
        "resume": lambda: commands.resume(args),
        "config": lambda: commands.config(args),
    }
    if args.command not in handlers:  # pragma: no cover - argparse refuses it first
        raise UsageError(f"unknown command {args.command!r}")
    return handlers[args.command]()


def run() -> None:
    """The console script's entry point."""
    sys.exit(main())
