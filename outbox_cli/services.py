"""``kafka-outbox relay|checker|audit|demo``: the long-running services and the pass-throughs.

Each imports its service only here, so the library alone never needs the services' extras. The
relay and the checker are started by their own ``__main__.run(settings)`` (signals, logging,
the ``/healthz``, ``/readyz`` and ``/metrics`` endpoint), after the settings validated and Kafka
answered: a service that cannot start says why in one line and exits 2 or 3, which an
orchestrator shows, instead of retrying silently.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

from outbox_cli.errors import UsageError
from outbox_cli.kafka import connection, probe, require
from outbox_cli.settings import SERVICES


def run_relay(timeout: float) -> int:
    settings = SERVICES["relay"].load()
    _preflight(settings, timeout, _bootstrap_variables("relay"))
    entry = _import("relay.__main__", "services")
    code: int = entry.run(settings)
    return code


def run_checker(timeout: float) -> int:
    settings = SERVICES["checker"].load()
    _preflight(settings, timeout, _bootstrap_variables("checker"))
    entry = _import("checker.__main__", "services")
    code: int = entry.run(settings)
    return code


def _bootstrap_variables(name: str) -> str:
    service = SERVICES[name]
    return f"{service.prefix}BOOTSTRAP_SERVERS or {service.fallbacks['bootstrap_servers']}"


def _preflight(settings: Any, timeout: float, variable: str) -> None:
    topics = probe(connection(settings.bootstrap_servers, settings.kafka), timeout, variable)
    names = settings.topics
    require(topics, names.all())


def run_audit(argv: list[str]) -> int:
    """``checker.audit.cli.main(argv)``: 0 clean, 1 violations, 2 usage, 3 could not run."""
    audit = _import("checker.audit.cli", "audit")
    code: int = audit.main(argv)
    return code


def _import(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UsageError(
            f"this command needs {module} and the {extra!r} extra, which are not installed here "
            f"({err}); install kafka-outbox[{extra}]"
        ) from err


def demo_script() -> Path:
    """examples/orders/demo.py of the source checkout this package runs from."""
    return Path(__file__).resolve().parents[1] / "examples" / "orders" / "demo.py"


def run_demo(argv: list[str]) -> int:
    """Run ``make demo``'s driver with ``argv`` (it starts its own local Kafka broker)."""
    script = demo_script()
    if not script.exists():
        raise UsageError(
            f"the demo ships with the source checkout ({script} is not here); clone the "
            "repository and run `make demo` or `kafka-outbox demo` from it"
        )
    saved = sys.argv
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.argv = saved
    return 0
