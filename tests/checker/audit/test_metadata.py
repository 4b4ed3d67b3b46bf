"""How an Admin request's failure is worded: what the operator should look at."""

from __future__ import annotations

import pytest

from checker.audit.metadata import failure_text

KAFKA = "org.apache.kafka.common.errors."


def text(*classes: str, topics: tuple[str, ...] = ()) -> str:
    return failure_text(
        [*classes, "java.lang.RuntimeException", "java.lang.Exception", "java.lang.Object"],
        f"{classes[0]}: the broker's words",
        bootstrap_servers="kafka:9092",
        timeout_s=15,
        operation="DescribeConfigs",
        topics=topics,
    )


@pytest.mark.parametrize(
    "classes",
    [
        (KAFKA + "TopicAuthorizationException", KAFKA + "AuthorizationException"),
        (KAFKA + "ClusterAuthorizationException", KAFKA + "AuthorizationException"),
    ],
)
def test_a_refused_permission_names_the_acl_to_grant(classes: tuple[str, ...]) -> None:
    said = text(*classes, KAFKA + "ApiException")
    assert said.startswith("Kafka at kafka:9092 refused the audit's request on the topics")
    assert "grant the audit's principal DescribeConfigs and Read on the topics" in said
    assert "the broker's words" in said and "did not answer" not in said
    named = text(*classes, topics=("orders", "payments"))
    assert "refused the audit's request on orders, payments" in named
    assert "DescribeConfigs and Read on orders, payments" in named


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
