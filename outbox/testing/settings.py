"""Settings of the test harness, read from ``OUTBOX_TEST_*`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from outbox.testing.service import ServiceStartError

ENV_PREFIX = "OUTBOX_TEST_"
ENV_PROVIDER = ENV_PREFIX + "PROVIDER"
ENV_KAFKA_BOOTSTRAP = ENV_PREFIX + "KAFKA_BOOTSTRAP"
ENV_POSTGRES_URL = ENV_PREFIX + "POSTGRES_URL"
ENV_SCHEMA_REGISTRY_URL = ENV_PREFIX + "SCHEMA_REGISTRY_URL"
ENV_KAFKA_IMAGE = ENV_PREFIX + "KAFKA_IMAGE"
ENV_POSTGRES_IMAGE = ENV_PREFIX + "POSTGRES_IMAGE"
ENV_BUILD_IMAGES = ENV_PREFIX + "BUILD_IMAGES"
ENV_EVENT_LOOP = ENV_PREFIX + "EVENT_LOOP"
ENV_CACHE_DIR = "OUTBOX_CACHE_DIR"

PROVIDERS = ("auto", "containers", "local")
EVENT_LOOPS = ("asyncio", "uvloop")
LOCAL_KAFKA_IMAGE = "localhost/outbox-kafka"
LOCAL_POSTGRES_IMAGE = "localhost/outbox-postgres"


def _default_cache_dir() -> Path:
    # The Makefile exports OUTBOX_CACHE_DIR; elsewhere the checkout's .cache (this file sits at
    # outbox/testing/settings.py in an editable install) or the current directory's.
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists():
        return checkout / ".cache"
    return Path.cwd() / ".cache"


def event_loop_from_env(env: Mapping[str, str] | None = None) -> str:
    """``OUTBOX_TEST_EVENT_LOOP`` ("asyncio" when unset), read on its own: the pytest plugin
    sets the loop for every session, and a mistyped provider must not stop one that starts no
    service."""
    env = os.environ if env is None else env
    return _checked_event_loop(env.get(ENV_EVENT_LOOP, "asyncio").strip().lower() or "asyncio")


def _checked_event_loop(name: str) -> str:
    if name not in EVENT_LOOPS:
        raise ServiceStartError(
            f"{ENV_EVENT_LOOP}={name!r} is not an event loop; use one of {EVENT_LOOPS}"
        )
    return name


@dataclass(frozen=True, kw_only=True)
class HarnessSettings:
    """Which provider starts the services and with what.

    Attributes:
        provider: "auto" (containers when an engine is reachable, else local processes),
            "containers" or "local". Defaults to "auto". Env: ``OUTBOX_TEST_PROVIDER``.
        kafka_bootstrap: an already-running broker to use instead of starting one.
            Env: ``OUTBOX_TEST_KAFKA_BOOTSTRAP``. Defaults to None.
        postgres_url: an already-running PostgreSQL (SQLAlchemy URL) to use instead.
            Env: ``OUTBOX_TEST_POSTGRES_URL``. Defaults to None.
        schema_registry_url: an already-running schema registry's Confluent-compatible API
            (e.g. ``http://host:8081`` or Apicurio's ``http://host:8080/apis/ccompat/v7``) to
            use instead. Env: ``OUTBOX_TEST_SCHEMA_REGISTRY_URL``. Defaults to None.
        kafka_image / postgres_image: container images. Default to the official ``apache/kafka``
            and ``postgres`` images, or to images built here from the machine's own JDK and
            PostgreSQL when ``build_images`` is on. Env: ``OUTBOX_TEST_KAFKA_IMAGE`` /
            ``OUTBOX_TEST_POSTGRES_IMAGE``.
        build_images: build the images locally instead of pulling (machines with no registry).
            Defaults to on under Podman, off under Docker. Env: ``OUTBOX_TEST_BUILD_IMAGES``.
        event_loop: the event loop ``asyncio.run`` and ``asyncio.new_event_loop`` make in the
            session: "asyncio" (the standard library's) or "uvloop" (what ``uvicorn[standard]``
            runs FastAPI on; needs the ``uvloop`` package). Defaults to "asyncio".
            Env: ``OUTBOX_TEST_EVENT_LOOP``.
        cache_dir: where Maven jars, built image roots and podman's config live.
            Env: ``OUTBOX_CACHE_DIR``. Defaults to the checkout's ``.cache``.
        ci: failures to start a service fail the run instead of skipping. Env: ``CI``.
    """

    provider: str = "auto"
    kafka_bootstrap: str | None = None
    postgres_url: str | None = None
    schema_registry_url: str | None = None
    kafka_image: str | None = None
    postgres_image: str | None = None
    build_images: bool | None = None
    event_loop: str = "asyncio"
    cache_dir: Path = Path(".cache")
    ci: bool = False

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ServiceStartError(
                f"{ENV_PROVIDER}={self.provider!r} is not a provider; use one of {PROVIDERS}"
            )
        _checked_event_loop(self.event_loop)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HarnessSettings:
        env = os.environ if env is None else env
        build = env.get(ENV_BUILD_IMAGES)
        return cls(
            provider=env.get(ENV_PROVIDER, "auto").strip().lower() or "auto",
            kafka_bootstrap=env.get(ENV_KAFKA_BOOTSTRAP) or None,
            postgres_url=env.get(ENV_POSTGRES_URL) or None,
            schema_registry_url=env.get(ENV_SCHEMA_REGISTRY_URL) or None,
            kafka_image=env.get(ENV_KAFKA_IMAGE) or None,
            postgres_image=env.get(ENV_POSTGRES_IMAGE) or None,
            build_images=None if build is None else _truthy(build),
            event_loop=event_loop_from_env(env),
            cache_dir=Path(env[ENV_CACHE_DIR]) if env.get(ENV_CACHE_DIR) else _default_cache_dir(),
            ci=_truthy(env.get("CI", "")),
        )

    @property
    def kafka_jars_dir(self) -> Path:
        return self.cache_dir / "jvm" / "kafka"

    @property
    def kafka_newest_jars_dir(self) -> Path:
        """The newest Kafka release (jvm/kafka-newest/pom.xml), for the cluster tests."""
        return self.cache_dir / "jvm" / "kafka-newest"

    @property
    def spark_jars_dir(self) -> Path:
        return self.cache_dir / "jvm" / "spark"

    def kafka_classpath(self, jars_dir: Path | None = None) -> str:
        """The broker's classpath (the pinned release's, or the one in ``jars_dir``); fails with
        the fix when ``make jars`` has not run."""
        jars = jars_dir or self.kafka_jars_dir
        if not any(jars.glob("kafka_2.13-*.jar")):
            raise ServiceStartError(
                f"no Kafka broker jars in {jars}; run `make jars` (resolves them from Maven "
                "Central)"
            )
        return str(jars / "*")

    @property
    def schema_registry_dir(self) -> Path:
        return self.cache_dir / "jvm" / "schema-registry"

    def schema_registry_jar(self) -> Path:
        """The registry's runnable jar; fails with the fix when ``make jars`` has not built it."""
        jar = self.schema_registry_dir / "schema-registry-1-runner.jar"
        if not jar.is_file():
            raise ServiceStartError(
                f"no schema registry in {self.schema_registry_dir}; run `make jars` (builds "
                "Apicurio Registry from Maven Central, jvm/schema-registry/pom.xml)"
            )
        return jar

    def kafka_version(self, jars_dir: Path | None = None) -> str:
        jars = jars_dir or self.kafka_jars_dir
        self.kafka_classpath(jars)
        jar = next(jars.glob("kafka_2.13-*.jar"))
        return jar.stem.removeprefix("kafka_2.13-")


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}
