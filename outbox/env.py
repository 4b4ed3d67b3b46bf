"""Building a settings dataclass from a config file, environment variables and overrides.

Sources, lowest precedence first:

1. the dataclass defaults (and ``defaults=`` of the caller);
2. a TOML (or YAML) file named by ``OUTBOX_CONFIG_FILE`` (``kafka-outbox --config FILE`` sets it):
   one section per settings object, ``[producer]``, ``[relay]``, ``[checker]``, ``[audit]``, keys
   the field names, a ``kafka`` sub-table for librdkafka keys;
3. environment variables: ``{PREFIX}{FIELD}`` sets a field (converted to the field's type);
   ``{PREFIX}KAFKA__{KEY}`` passes a librdkafka setting through, ``_`` standing for ``.``
   (librdkafka's names have dots, never underscores: ``OUTBOX_RELAY_KAFKA__LINGER_MS=5`` ->
   ``linger.ms=5``); a file's ``kafka`` keys are kept unless the environment sets the same key;
   ``{PREFIX}{FIELD}_FILE`` names a file holding the value instead (a Kubernetes Secret mounted
   as a file keeps it out of the environment and of ``ps``); a trailing newline is dropped from
   either (a secret written by ``openssl rand -hex 32 > file`` has one);
4. keyword overrides.

Every bad value is refused at start with the variable (or file, section and key) and the value.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, TypeVar

from outbox.errors import ConfigurationError

T = TypeVar("T")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: The variable naming the config file; ``kafka-outbox --config FILE`` sets it.
CONFIG_FILE_VARIABLE = "OUTBOX_CONFIG_FILE"
#: The sections a config file may have, one per settings object.
SECTIONS = ("producer", "relay", "checker", "audit")
#: The field that takes librdkafka settings (a ``kafka`` sub-table in a file).
KAFKA_FIELD = "kafka"


def kafka_variable(prefix: str, key: str) -> str:
    """The variable that sets librdkafka's ``key`` for settings read with ``prefix``:
    ``kafka_variable("OUTBOX_RELAY_", "session.timeout.ms")`` is
    ``OUTBOX_RELAY_KAFKA__SESSION_TIMEOUT_MS`` (the reverse of how :func:`from_env` reads it)."""
    return f"{prefix}KAFKA__{key.replace('.', '_').upper()}"


def kafka_setting_source(prefix: str, key: str) -> str:
    """Where librdkafka's ``key`` is set for settings read with ``prefix``, for a message that
    names the fix: the variable, or the key in a config file's or the settings' ``kafka``."""
    return f"{kafka_variable(prefix, key)} (or {key} in the config file's or the settings' kafka)"


def section_for(prefix: str) -> str:
    """The file section of an env prefix: ``OUTBOX_`` -> producer, ``OUTBOX_RELAY_`` -> relay."""
    return prefix.removeprefix("OUTBOX_").rstrip("_").lower() or "producer"


def from_env(
    cls: type[T],
    prefix: str,
    env: Mapping[str, str] | None,
    overrides: Mapping[str, Any],
    *,
    required: Sequence[str],
    fallbacks: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> T:
    """``cls(**values)`` from the config file, ``env`` (default ``os.environ``) and ``overrides``.

    ``fallbacks`` names variables shared by several services (e.g. ``OUTBOX_BOOTSTRAP_SERVERS``)
    used when the prefixed one is absent. ``defaults`` replace dataclass defaults.

    Raises:
        ConfigurationError: a value that does not convert, an unknown key or section in the
            file, or a required setting missing; the message names the variable or key.
    """
    values, _ = collect(cls, prefix, env, overrides, fallbacks=fallbacks, defaults=defaults)
    missing = [prefix + n.upper() for n in required if n not in values]
    if missing:
        raise ConfigurationError(f"missing settings: set {', '.join(missing)}")
    return cls(**values)


def collect(
    cls: type[Any],
    prefix: str,
    env: Mapping[str, str] | None,
    overrides: Mapping[str, Any],
    *,
    fallbacks: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The values ``from_env`` would pass to ``cls``, and where each came from.

    Sources read ``default``, ``file PATH [section]``, ``env VARIABLE`` or ``argument``.
    """
    env = os.environ if env is None else env
    kinds = {f.name: str(f.type) for f in fields(cls)}
    values: dict[str, Any] = dict(defaults or {})
    sources = dict.fromkeys(values, "default")
    kafka: dict[str, Any] = {}
    path = env.get(CONFIG_FILE_VARIABLE) or None
    if path:
        section = section_for(prefix)
        table = load_config_file(path).get(section, {})
        where = f"file {path} [{section}]"
        for key, raw in table.items():
            if key not in kinds:
                valid = ", ".join(sorted(kinds))
                raise ConfigurationError(
                    f"{path}: unknown key {key!r} in [{section}]; valid keys: {valid}"
                )
            if key == KAFKA_FIELD:
                kafka.update(_kafka_table(path, section, raw))
            else:
                values[key] = _from_file(path, section, key, raw, kinds[key])
            sources[key] = where
    variables = [(name, variable) for name, variable in (fallbacks or {}).items()]
    variables += [(name, prefix + name.upper()) for name in kinds if name != KAFKA_FIELD]
    for name, variable in variables:
        found = _from_environment(env, variable)
        if found is not None:
            raw, source = found
            values[name] = _convert(source.removeprefix("env "), raw, kinds[name])
            sources[name] = source
    kafka_prefix = prefix + "KAFKA__"
    for variable in env:
        if variable.startswith(kafka_prefix):
            name = variable.removesuffix(FILE_SUFFIX)  # sasl.password from a mounted Secret
            found = _from_environment(env, name)
            if found is not None:
                kafka[name[len(kafka_prefix) :].lower().replace("_", ".")] = found[0]
                sources[KAFKA_FIELD] = "env " + kafka_prefix + "*"
    if kafka and KAFKA_FIELD in kinds:
        values[KAFKA_FIELD] = kafka
    for name, value in overrides.items():
        values[name] = value
        sources[name] = "argument"
    return values, sources


#: The suffix of a variable naming a file that holds the value (``OUTBOX_CHECK_SECRET_FILE``).
FILE_SUFFIX = "_FILE"


def _from_environment(env: Mapping[str, str], variable: str) -> tuple[str, str] | None:
    """The raw value of ``variable`` and its source, from itself or its ``_FILE`` twin."""
    file_variable = variable + FILE_SUFFIX
    if file_variable not in env:
        if variable not in env:
            return None
        # a value copied from a file (a Secret made with --from-file) keeps its newline in a
        # variable: dropped here as from the file, so both sources give one secret
        return env[variable].rstrip("\r\n"), f"env {variable}"
    if variable in env:
        raise ConfigurationError(
            f"both {variable} and {file_variable} are set; keep one (the file for a secret)"
        )
    path = env[file_variable]
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigurationError(
            f"{file_variable}={path!r} cannot be read ({err.strerror}); point it at the file "
            f"holding {variable}'s value (a mounted Secret's key)"
        ) from err
    return text.rstrip("\r\n"), f"env {file_variable} (file {path})"


def field_defaults(cls: type[Any]) -> dict[str, Any]:
    """The dataclass defaults of ``cls`` (fields without one are left out)."""
    found: dict[str, Any] = {}
    for f in fields(cls):
        if f.default is not MISSING:
            found[f.name] = f.default
        elif f.default_factory is not MISSING:
            found[f.name] = f.default_factory()
    return found


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The whole config file: TOML, or YAML (``.yaml``/``.yml``, needs PyYAML).

    Raises:
        ConfigurationError: the file is missing, does not parse, or has an unknown section.
    """
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as err:
        raise ConfigurationError(
            f"config file {str(path)!r} cannot be read ({err.strerror}); "
            f"fix --config or {CONFIG_FILE_VARIABLE}"
        ) from err
    document = (
        _parse_yaml(file, text) if file.suffix in (".yaml", ".yml") else _parse_toml(file, text)
    )
    for key, value in document.items():
        if key not in SECTIONS or not isinstance(value, dict):
            raise ConfigurationError(
                f"{path}: unknown section {key!r} (or not a table); valid sections: "
                + ", ".join(f"[{s}]" for s in SECTIONS)
            )
    return document


def _parse_toml(file: Path, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigurationError(f"{file} is not valid TOML: {err}") from err


def _parse_yaml(file: Path, text: str) -> dict[str, Any]:
    try:
        import yaml
    except ImportError as err:
        raise ConfigurationError(
            f"{file} is YAML, which needs PyYAML (`pip install pyyaml`); or write it as TOML"
        ) from err
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigurationError(f"{file} is not valid YAML: {err}") from err
    if not isinstance(document, dict):
        raise ConfigurationError(f"{file} must hold a mapping of sections, not {document!r:.40}")
    return document


def _kafka_table(path: str, section: str, raw: object) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigurationError(
            f"{path}: [{section}] kafka must be a table of librdkafka settings "
            f'([{section}.kafka] with keys like "linger.ms" = 5), not {raw!r}'
        )
    for key, value in raw.items():
        if isinstance(value, dict | list):
            raise ConfigurationError(
                f"{path}: [{section}.kafka] {key!r} = {value!r} must be a string, number or boolean"
            )
    return dict(raw)


def _from_file(path: str, section: str, key: str, raw: object, kind: str) -> Any:
    """A file value: native TOML types as they are, strings converted like environment values."""
    base = kind.replace(" | None", "")
    where = f"{path} [{section}] {key}"
    if isinstance(raw, str):
        return _convert(where, raw, kind)
    if base == "bool" and isinstance(raw, bool):
        return raw
    if base == "int" and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if base == "float" and isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    if (
        base.startswith("tuple[str")
        and isinstance(raw, list)
        and all(isinstance(v, str) for v in raw)
    ):
        return tuple(raw)
    raise ConfigurationError(f"{where} = {raw!r} is not a valid {base}")


def _convert(variable: str, raw: str, kind: object) -> Any:
    kind = str(kind).replace(" | None", "")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError as err:
        raise ConfigurationError(f"{variable}={raw!r} is not a valid {kind}") from err
    if kind == "bool":
        lowered = raw.strip().lower()
        if lowered not in _TRUE + _FALSE:
            raise ConfigurationError(f"{variable}={raw!r} is not a boolean (true/false)")
        return lowered in _TRUE
    return raw
