"""The settings objects the command line knows, their variables, and loading them.

One typed settings object per service, each from its own env prefix and config-file section:

- ``producer``: :class:`outbox.OutboxSettings`, ``OUTBOX_*``, ``[producer]``; the operator
  commands (``topics``, ``status``, ``inspect``, ``resume``) read it too;
- ``relay``: :class:`relay.RelaySettings`, ``OUTBOX_RELAY_*``, ``[relay]``;
- ``checker``: :class:`checker.CheckerSettings`, ``OUTBOX_CHECKER_*``, ``[checker]``;
- ``audit``: ``checker.audit.settings.AuditSettings``, ``OUTBOX_AUDIT_*``, ``[audit]`` (with the
  ``audit`` extra).

``OUTBOX_BOOTSTRAP_SERVERS`` (and, for the relay and checker, ``OUTBOX_TOPIC_PREFIX``) is
shared: the services use it when their own variable is absent.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from outbox.env import CONFIG_FILE_VARIABLE, FILE_SUFFIX, KAFKA_FIELD, collect, from_env
from outbox.errors import ConfigurationError
from outbox.properties import load_properties
from outbox.settings import ENV_PREFIX, OutboxSettings
from outbox_cli.errors import UsageError

#: The producer group the operator commands use when none is configured (they produce nothing
#: in a group's name; ``resume`` keeps the transaction's own group).
OPERATOR_GROUP = "kafka-outbox-cli"
#: Variables of the test harness and tooling that share the prefix but are not settings.
NOT_SETTINGS_PREFIXES = ("OUTBOX_TEST_", "OUTBOX_CACHE_DIR")


@dataclass(frozen=True)
class Service:
    """A settings object: its name (the file section) and class. Its env prefix and the shared
    variables it falls back on are the settings module's ``ENV_PREFIX`` and ``FALLBACKS``,
    defined there once."""

    name: str
    path: str  # "module:Class", imported on use
    required: tuple[str, ...] = ("bootstrap_servers",)
    #: Part of an extra that may not be installed (``config`` and the name checks skip it).
    optional: bool = False

    @property
    def prefix(self) -> str:
        prefix: str = self._module().ENV_PREFIX
        return prefix

    @property
    def fallbacks(self) -> Mapping[str, str]:
        fallbacks: Mapping[str, str] = self._module().FALLBACKS
        return fallbacks

    def _module(self) -> Any:
        module = self.path.partition(":")[0]
        try:
            return importlib.import_module(module)
        except ImportError as err:
            raise UsageError(
                f"the {self.name} settings need {module} ({err}); install kafka-outbox[services]"
            ) from err

    def cls(self) -> type[Any]:
        found: type[Any] = getattr(self._module(), self.path.partition(":")[2])
        return found

    def load(self, env: Mapping[str, str] | None = None) -> Any:
        """The validated settings object (env default ``os.environ``).

        Raises:
            ConfigurationError: naming the variable or file key and the bad value.
        """
        return self.cls().from_env(env)

    def sources(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Where each explicitly set value came from (see :func:`outbox.env.collect`)."""
        return collect(self.cls(), self.prefix, env, {}, fallbacks=self.fallbacks)[1]

    def variables(self) -> set[str]:
        """Every variable name this settings object reads (``KAFKA__*`` aside; each has a
        ``_FILE`` twin, :func:`is_setting`)."""
        names = {self.prefix + f.name.upper() for f in fields(self.cls()) if f.name != KAFKA_FIELD}
        return names | set(self.fallbacks.values())

    @property
    def kafka_prefix(self) -> str:
        return self.prefix + "KAFKA__"


SERVICES: dict[str, Service] = {
    "producer": Service("producer", "outbox.settings:OutboxSettings"),
    "relay": Service("relay", "relay.settings:RelaySettings"),
    "checker": Service("checker", "checker.settings:CheckerSettings"),
    "audit": Service("audit", "checker.audit.settings:AuditSettings", optional=True),
}


def available() -> list[Service]:
    """The settings objects this installation can load (the audit's only with checker.audit)."""
    found = []
    for service in SERVICES.values():
        try:
            service.cls()
        except UsageError:
            if not service.optional:
                raise
            continue
        found.append(service)
    return found


def operator_settings(env: Mapping[str, str] | None = None) -> OutboxSettings:
    """The settings of the operator commands: the producer's, with a default producer group.

    Raises:
        ConfigurationError: naming the variable or file key and the bad value.
    """
    return from_env(
        OutboxSettings,
        ENV_PREFIX,
        env,
        {},
        required=("bootstrap_servers",),
        defaults={"producer_group": OPERATOR_GROUP},
    )


def command_line_connection(bootstrap: str | None, command_config: str | None) -> dict[str, str]:
    """``--bootstrap-server`` and ``--command-config``, as Kafka's own tools take them, as the
    variables that carry them: set for one run, they win over the environment and the config
    file for every settings object (the operator commands keep only the connection keys of the
    file; a service takes them all).

    Raises:
        ConfigurationError: the file cannot be read or has a key no variable can carry.
    """
    kafka = load_properties(command_config) if command_config else {}
    bootstrap = bootstrap or kafka.pop("bootstrap.servers", None)
    kafka.pop("bootstrap.servers", None)
    for key in kafka:
        if "_" in key:  # librdkafka's names have none: the variable could not carry it back
            raise ConfigurationError(
                f"{command_config}: {key!r} is not a librdkafka setting (they are dotted "
                "lower-case names, e.g. security.protocol)"
            )
    variables = {}
    for service in available():
        if bootstrap:
            variables[service.prefix + "BOOTSTRAP_SERVERS"] = bootstrap
        for key, value in kafka.items():
            variables[service.kafka_prefix + key.upper().replace(".", "_")] = value
    return variables


def known_variables() -> tuple[set[str], tuple[str, ...]]:
    """Every settings variable: exact names, and the prefixes of the librdkafka pass-through."""
    names = {CONFIG_FILE_VARIABLE}
    prefixes = []
    for service in available():
        names |= service.variables()
        prefixes.append(service.kafka_prefix)
    return names, tuple(prefixes)


def is_setting(variable: str) -> bool:
    """True when ``variable`` is read by one of the settings objects."""
    names, prefixes = known_variables()
    if variable in names or variable.removesuffix(FILE_SUFFIX) in names:
        return True  # the value, or the file holding it
    # OUTBOX_KAFKA__ is the producer's pass-through; a service's is OUTBOX_RELAY_KAFKA__ etc.
    return any(variable.startswith(p) and len(variable) > len(p) for p in prefixes)


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """``OUTBOX_*`` variables in ``env`` that no settings object reads (typos, old names)."""
    return sorted(
        v
        for v in env
        if v.startswith("OUTBOX_") and not v.startswith(NOT_SETTINGS_PREFIXES) and not is_setting(v)
    )
