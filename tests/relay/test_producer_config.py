"""The relay's transactional producer settings (unit: librdkafka checks them, nothing connects)."""

from __future__ import annotations

from confluent_kafka import Producer

from relay import RelaySettings
from relay.clients import producer_config


def settings(**kafka: object) -> RelaySettings:
    return RelaySettings(bootstrap_servers="unused:9092", topic_prefix="__outbox", kafka=kafka)


def test_transactions_retry_a_concurrent_commit_after_10_ms_not_librdkafkas_100() -> None:
    config = producer_config(settings())
    assert config["retry.backoff.ms"] == 10
    Producer(config).flush(0)  # librdkafka accepts every name and value


def test_a_users_kafka_settings_override_the_back_off_but_not_the_transactional_id() -> None:
    overridden = settings(**{"retry.backoff.ms": 50, "transactional.id": "mine"})
    config = producer_config(overridden)
    assert config["retry.backoff.ms"] == 50
    assert config["transactional.id"] == overridden.transactional_id


def test_a_users_kafka_settings_override_the_batching() -> None:
    config = producer_config(settings(**{"linger.ms": 0, "batch.num.messages": 500}))
    assert (config["linger.ms"], config["batch.num.messages"]) == (0, 500)
    assert producer_config(settings())["linger.ms"] == 5
    Producer(config).flush(0)
