"""The audit run as a principal Kafka's ACLs limit, on a broker that enforces them.

Production clusters authorize each client: the audit's service account may read the outbox's
topics and not every topic they name. Kafka leaves a topic the principal may not describe out of
the list of all topics, and the audit used to take that list for what exists: a real topic it may
not see was "missing", and every COMMIT to it ``lost`` - the operator then replays them
(docs/audit.md), and delivers each twice.

The broker (tests/acl_kafka.py) has a second listener (SASL PLAIN, the user ``auditor`` here)
and Kafka's own ``StandardAuthorizer``; the plain listener's anonymous principal is a super user,
which writes the records and the ACLs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AclOperation, ResourceType  # type: ignore[attr-defined]

from checker.audit.cli import main as audit_main
from checker.audit.errors import AuditSourceError
from checker.audit.job import run_audit
from checker.audit.settings import AuditSettings
from outbox.protocol import OpState
from outbox.testing.stream import StreamWriter
from tests.acl_kafka import AclKafka
from tests.kafka_helpers import create_topic, unique

pytestmark = pytest.mark.integration

AUDITOR = "auditor"


def committed_and_promoted(acl_broker: AclKafka, prefix: str, topics: list[str]) -> None:
    """One transaction per topic, committed and promoted: nothing lost anywhere."""
    w = StreamWriter(acl_broker.plain, prefix=prefix, partitions=1)
    txns = [w.begin([(topic, b"k", b"v")]) for topic in topics]
    w.flush()
    w.commit_and_promote(txns)
    w.close()


def grant_the_outbox_topics(acl_broker: AclKafka, prefix: str) -> None:
    """What docs/audit.md asks for the audit's principal, on the outbox's own topics."""
    acl_broker.allow(
        AUDITOR, ResourceType.TOPIC, f"{prefix}-", AclOperation.READ, AclOperation.DESCRIBE
    )


def as_the_auditor(acl_broker: AclKafka, prefix: str, out: Path) -> AuditSettings:
    """The audit of ``prefix``'s topics, logged in as the ``auditor``."""
    return AuditSettings(
        bootstrap_servers=acl_broker.sasl,
        topic_prefix=prefix,
        as_of="now+10m",
        out_dir=str(out),
        kafka=acl_broker.java_login(AUDITOR),
    )


def test_a_real_topic_the_audit_may_not_see_is_an_error_not_lost_messages(
    spark: Any, acl_broker: AclKafka, tmp_path: Path
) -> None:
    visible, hidden = unique("visible-orders"), unique("hidden-orders")
    prefix = unique("__outbox-acl")
    for topic in (visible, hidden):
        create_topic(acl_broker.plain, topic)
    committed_and_promoted(acl_broker, prefix, [visible, hidden])
    grant_the_outbox_topics(acl_broker, prefix)
    acl_broker.allow(AUDITOR, ResourceType.TOPIC, visible, AclOperation.READ, AclOperation.DESCRIBE)

    settings = as_the_auditor(acl_broker, prefix, tmp_path)
    with pytest.raises(AuditSourceError) as raised:
        run_audit(spark, settings)  # was: one `lost` (the COMMIT to `hidden`), exit 1
    text = str(raised.value)
    assert f"refused the audit's request on {hidden} (" in text
    assert f"grant the audit's principal Describe and Read on {hidden}," in text
    assert "did not answer" not in text
    assert not (tmp_path / "summary.json").exists()

    # granted, the same audit is clean; its principal still may not describe the topics'
    # settings, and the summary says so in those words (not "did not answer")
    acl_broker.allow(AUDITOR, ResourceType.TOPIC, hidden, AclOperation.READ, AclOperation.DESCRIBE)
    result = run_audit(spark, settings)
    assert {n: c for n, c in result.counts.items() if c} == {}
    statistics = result.summary["statistics"]
    assert (statistics["transactions"], statistics["messages_delivered"]) == (2, 2)
    unknown = result.summary["parameters"]["retention_unknown"]
    assert "DescribeConfigs" in unknown and "refused the audit's request" in unknown
    assert "TopicAuthorizationException" in unknown and "did not answer" not in unknown


def test_a_refused_login_is_named_as_such(
    spark: Any, acl_broker: AclKafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "auditor.properties"
    config.write_text(
        "".join(f"{k}={v}\n" for k, v in acl_broker.java_login(AUDITOR, "a wrong one").items())
    )
    argv = [
        "--bootstrap-servers", acl_broker.sasl,
        "--command-config", str(config),
        "--topic-prefix", unique("__outbox-acl-login"),
        "--out", str(tmp_path / "out"),
        "--timeout", "10s",
    ]  # fmt: skip
    assert audit_main(argv) == 3
    err = capsys.readouterr().err
    assert "did not accept the audit's login" in err and "SaslAuthenticationException" in err
    assert "--command-config" in err and "did not answer" not in err


def test_a_half_record_naming_a_topic_kafka_does_not_allow_is_lost_not_an_error(
    spark: Any, acl_broker: AclKafka, tmp_path: Path
) -> None:
    """A producer not ours wrote a name no topic can have: its COMMIT can never be delivered
    (the relay parks it), and the audit says ``lost`` as it did before topics were described
    by name, rather than failing every run until retention removes the record."""
    prefix = unique("__outbox-acl-bad-name")
    w = StreamWriter(acl_broker.plain, prefix=prefix, partitions=1)
    [bad] = [w.begin([("no such topic!", b"k", b"v")])]
    w.flush()
    w.decide(bad, OpState.COMMIT)
    w.close()
    grant_the_outbox_topics(acl_broker, prefix)
    settings = as_the_auditor(acl_broker, prefix, tmp_path)
    result = run_audit(spark, settings)
    assert result.txn_ids("lost") == {bad.txn_id}
    assert {n: c for n, c in result.counts.items() if c} == {"lost": 1}
