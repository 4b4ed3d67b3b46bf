"""The audit run as a principal Kafka's ACLs limit, on a broker that enforces them.

Production clusters authorize each client: the audit's service account may read the outbox's
topics and not every topic they name. Kafka leaves a topic the principal may not describe out of
the list of all topics, and the audit used to take that list for what exists: a real topic it may
not see was "missing", and every COMMIT to it ``lost`` - the operator then replays them
(docs/audit.md), and delivers each twice.

The broker here has a second listener (SASL PLAIN, user ``auditor``) and Kafka's own
``StandardAuthorizer``; the plain listener's anonymous principal is a super user, which writes
the records and the ACLs.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from checker.audit.cli import main as audit_main
from checker.audit.errors import AuditSourceError
from checker.audit.job import run_audit
from checker.audit.settings import AuditSettings
from outbox.protocol import OpState
from outbox.testing.kafka_process import KafkaProcess
from outbox.testing.ports import free_port
from outbox.testing.settings import HarnessSettings
from outbox.testing.stream import StreamWriter
from tests.kafka_helpers import create_topic, unique

pytestmark = pytest.mark.integration

PASSWORD = "auditor-secret"


def auditor_login(password: str = PASSWORD) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="auditor" password="{password}";',
    }


class Broker:
    """A broker enforcing ACLs: ``plain`` for its super user, ``audit`` for ``User:auditor``."""

    def __init__(self, process: KafkaProcess, audit_port: int) -> None:
        self.plain = process.bootstrap
        self.audit = f"127.0.0.1:{audit_port}"
        self.admin = AdminClient({"bootstrap.servers": self.plain})

    def allow(self, kind: ResourceType, name: str, *operations: AclOperation) -> None:
        pattern = (
            ResourcePatternType.PREFIXED if name.endswith("-") else ResourcePatternType.LITERAL
        )
        bindings = [
            AclBinding(kind, name, pattern, "User:auditor", "*", op, AclPermissionType.ALLOW)
            for op in operations
        ]
        for future in self.admin.create_acls(bindings).values():
            future.result(30)
        # the controller has them; wait until the broker's authorizer does too
        wanted = AclBindingFilter(
            kind, name, pattern, "User:auditor", "*", AclOperation.ANY, AclPermissionType.ANY
        )
        deadline = time.monotonic() + 30
        while len(self.admin.describe_acls(wanted).result(30)) < len(bindings):
            assert time.monotonic() < deadline, f"the broker never showed the ACLs on {name}"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def broker(
    harness_settings: HarnessSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    audit_port = free_port()
    workdir = Path(tmp_path_factory.mktemp("acl-broker"))
    process = KafkaProcess(
        harness_settings,
        workdir=workdir,
        extra_properties={
            "listeners": (
                "PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port},"
                f"AUDIT://127.0.0.1:{audit_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{{port}},AUDIT://127.0.0.1:{audit_port}",
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,AUDIT:SASL_PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.audit.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_auditor="{PASSWORD}";'
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
        },
    )
    process.format()
    process.start()
    try:
        yield Broker(process, audit_port)
    finally:
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def committed_and_promoted(broker: Broker, prefix: str, topics: list[str]) -> None:
    """One transaction per topic, committed and promoted: nothing lost anywhere."""
    w = StreamWriter(broker.plain, prefix=prefix, partitions=1)
    txns = [w.begin([(topic, b"k", b"v")]) for topic in topics]
    w.flush()
    for t in txns:
        w.decide(t, OpState.COMMIT)
    w.flush()
    for t in txns:
        w.promote(t)
    w.close()


def grant_the_outbox_topics(broker: Broker, prefix: str) -> None:
    """What docs/audit.md asks for the audit's principal, on the outbox's own topics."""
    broker.allow(ResourceType.TOPIC, f"{prefix}-", AclOperation.READ, AclOperation.DESCRIBE)


def test_a_real_topic_the_audit_may_not_see_is_an_error_not_lost_messages(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    visible, hidden = unique("visible-orders"), unique("hidden-orders")
    prefix = unique("__outbox-acl")
    for topic in (visible, hidden):
        create_topic(broker.plain, topic)
    committed_and_promoted(broker, prefix, [visible, hidden])
    grant_the_outbox_topics(broker, prefix)
    broker.allow(ResourceType.TOPIC, visible, AclOperation.READ, AclOperation.DESCRIBE)

    settings = AuditSettings(
        bootstrap_servers=broker.audit,
        topic_prefix=prefix,
        as_of="now+10m",
        out_dir=str(tmp_path),
        kafka=auditor_login(),
    )
    with pytest.raises(AuditSourceError) as raised:
        run_audit(spark, settings)  # was: one `lost` (the COMMIT to `hidden`), exit 1
    text = str(raised.value)
    assert f"refused the audit's request on {hidden} (" in text
    assert f"grant the audit's principal Describe and Read on {hidden}," in text
    assert "did not answer" not in text
    assert not (tmp_path / "summary.json").exists()

    # granted, the same audit is clean; its principal still may not describe the topics'
    # settings, and the summary says so in those words (not "did not answer")
    broker.allow(ResourceType.TOPIC, hidden, AclOperation.READ, AclOperation.DESCRIBE)
    result = run_audit(spark, settings)
    assert {n: c for n, c in result.counts.items() if c} == {}
    statistics = result.summary["statistics"]
    assert (statistics["transactions"], statistics["messages_delivered"]) == (2, 2)
    unknown = result.summary["parameters"]["retention_unknown"]
    assert "DescribeConfigs" in unknown and "refused the audit's request" in unknown
    assert "TopicAuthorizationException" in unknown and "did not answer" not in unknown


def test_a_refused_login_is_named_as_such(
    spark: Any, broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "auditor.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in auditor_login("a wrong one").items()))
    argv = [
        "--bootstrap-servers", broker.audit,
        "--command-config", str(config),
        "--topic-prefix", unique("__outbox-acl-login"),
        "--out", str(tmp_path / "out"),
        "--timeout", "10s",
    ]  # fmt: skip
    assert audit_main(argv) == 3
    err = capsys.readouterr().err
    assert "did not accept the audit's login" in err and "SaslAuthenticationException" in err
    assert "--command-config" in err and "did not answer" not in err
