"""How an Admin request's failure is worded: what the operator should look at."""

from __future__ import annotations

import pytest

from checker.audit.metadata import failure_text

KAFKA = "org.apache.kafka.common.errors."


def text(*classes: str, operation: str = "DescribeConfigs", topics: tuple[str, ...] = ()) -> str:
    return failure_text(
        [*classes, "java.lang.RuntimeException", "java.lang.Exception", "java.lang.Object"],
        f"{classes[0]}: the broker's words",
        bootstrap_servers="kafka:9092",
        timeout_s=15,
        operation=operation,
        topics=topics,
    )


TOPIC_REFUSED = (KAFKA + "TopicAuthorizationException", KAFKA + "AuthorizationException")


def test_a_refused_topic_permission_names_the_acl_and_the_topics() -> None:
    said = text(*TOPIC_REFUSED, KAFKA + "ApiException", topics=("orders", "payments"))
    assert said.startswith("Kafka at kafka:9092 refused the audit's request on orders, payments")
    assert "grant the audit's principal DescribeConfigs on orders, payments," in said
    assert "the broker's words" in said and "did not answer" not in said
    # what it describes it reads too; the settings it only describes
    described = text(*TOPIC_REFUSED, operation="Describe", topics=("orders",))
    assert "grant the audit's principal Describe and Read on orders," in described
    assert "on the topics" in text(*TOPIC_REFUSED)


def test_another_refused_permission_points_at_what_kafka_names() -> None:
    said = text(KAFKA + "ClusterAuthorizationException", KAFKA + "AuthorizationException")
    assert "refused the audit's request (" in said and "the permission Kafka names" in said
    assert "DescribeConfigs" not in said and "did not answer" not in said


def test_a_refused_login_points_at_the_security_settings() -> None:
    said = text(KAFKA + "SaslAuthenticationException", KAFKA + "AuthenticationException")
    assert "did not accept the audit's login" in said and "sasl.*" in said
    assert "did not answer" not in said


@pytest.mark.parametrize(
    "classes",
    [
        (KAFKA + "TimeoutException", KAFKA + "RetriableException"),
        ("java.util.concurrent.TimeoutException",),
    ],
)
def test_a_timeout_points_at_the_address_and_the_network(classes: tuple[str, ...]) -> None:
    said = text(*classes)
    assert "did not answer within 15 s" in said and "--bootstrap-servers" in said


def test_any_other_error_is_given_as_kafka_answered_it() -> None:
    said = text(KAFKA + "InvalidTopicException", KAFKA + "ApiException")
    assert said == (
        "Kafka at kafka:9092 answered the audit's request on the topics with an error: "
        f"{KAFKA}InvalidTopicException: the broker's words"
    )
