"""The topic cache's policy: how often it asks Kafka, and what it makes of each answer.

What Kafka answers is tested against a broker enforcing ACLs (tests/relay/test_permissions.py);
here an admin stand-in answers as confluent-kafka's AdminClient does, so that every answer can
be given and every request counted.
"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined]

from relay.topic_cache import TopicCache
from tests.fake_clock import Clock

READ_ONLY = [AclOperation.READ, AclOperation.DESCRIBE]
WRITABLE = [AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE]


class Admin:
    """Answers ``list_topics`` from ``topics`` and ``describe_topics`` from ``answers`` (per
    topic: a list of operations, None, or a KafkaError code to fail with); records requests."""

    def __init__(self, topics: set[str], answers: dict[str, Any]) -> None:
        self.topics, self.answers = topics, answers
        self.listed = 0
        self.described: list[list[str]] = []
        self.created: list[str] = []
        self.down = False  # list_topics fails
        self.may_create: bool | None = True
        self.clock: Clock | None = None  # moved on by the wait for an answer that never comes

    def list_topics(self, timeout: float) -> Any:
        self.listed += 1
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return SimpleNamespace(topics={t: SimpleNamespace(error=None) for t in sorted(self.topics)})

    def describe_topics(self, topics: TopicCollection, **options: Any) -> dict[str, Future[Any]]:
        assert options["include_authorized_operations"] is True
        self.described.append(list(topics.topic_names))
        futures: dict[str, Future[Any]] = {}
        for name in topics.topic_names:
            future: Future[Any] = Future()
            answer = self.answers.get(name, WRITABLE)
            if isinstance(answer, int):
                future.set_exception(KafkaException(KafkaError(answer)))
            else:
                future.set_result(SimpleNamespace(authorized_operations=answer))
            futures[name] = future
        return futures

    def create_topics(self, new: list[Any]) -> dict[str, Future[None]]:
        [topic] = [n.topic for n in new]
        self.created.append(topic)
        future: Future[None] = Future()
        if self.may_create:
            self.topics.add(topic)
            future.set_result(None)
        elif self.may_create is None:  # no answer: result(30) raises TimeoutError, 30 s on
            future.set_exception(TimeoutError())
            if self.clock is not None:
                self.clock.now += 30
        else:
            future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
        return {topic: future}

    def poll(self, timeout: float) -> int:
        return 0


def cache(
    admin: Admin, clock: Clock, touched: list[int] | None = None, *, auto_create: bool = False
) -> TopicCache:
    return TopicCache(
        {},
        refresh_s=30,
        miss_refresh_s=5,
        auto_create=auto_create,
        admin=admin,
        clock=clock,
        touch=(lambda: touched.append(1)) if touched is not None else (lambda: None),
    )


def test_a_writable_topic_is_asked_about_once_then_served_without_a_request() -> None:
    admin, clock, touched = Admin({"orders"}, {}), Clock(), []
    topics = cache(admin, clock, touched)
    assert topics.unwritable("orders") is None
    assert (admin.listed, admin.described) == (1, [["orders"]])
    assert len(touched) == 2  # after each request: a slow authorizer is not a hung relay
    for _ in range(1000):
        clock.now += 0.01
        assert topics.unwritable("orders") is None
    assert (admin.listed, admin.described) == (1, [["orders"]])


def test_a_topic_it_may_not_write_to_is_asked_about_again_only_every_miss_refresh() -> None:
    admin, clock = Admin({"orders"}, {"orders": READ_ONLY}), Clock()
    topics = cache(admin, clock)
    said = topics.unwritable("orders")
    assert (
        said == "the relay may not write to topic orders: grant the relay's principal Write on it"
    )
    clock.now += 4
    assert topics.unwritable("orders") == said
    assert admin.described == [["orders"]]
    admin.answers["orders"] = WRITABLE  # granted
    clock.now += 2
    assert topics.unwritable("orders") is None
    assert admin.described == [["orders"], ["orders"]]


def test_kafka_refusing_to_describe_a_topic_means_the_relay_may_not_write_to_it() -> None:
    admin = Admin({"orders"}, {"orders": KafkaError.TOPIC_AUTHORIZATION_FAILED})
    assert "may not write to topic orders" in str(cache(admin, Clock()).unwritable("orders"))


def test_a_topic_kafka_no_longer_knows_is_missing() -> None:
    admin = Admin({"orders"}, {"orders": KafkaError.UNKNOWN_TOPIC_OR_PART})
    said = cache(admin, Clock()).unwritable("orders")
    assert said is not None and said.startswith("topic orders does not exist, or the relay may")
    assert "auto_create_topics" in said and "grant the relay's principal Write" in said


def test_when_kafka_does_not_say_the_write_is_tried() -> None:
    """A broker before 2.3 reports no operations; a timeout or another error tells nothing:
    the topic counts as writable, and the write itself tells (as before the look)."""
    for answer in (None, KafkaError._TIMED_OUT, KafkaError.BROKER_NOT_AVAILABLE):
        admin = Admin({"orders"}, {"orders": answer})
        assert cache(admin, Clock()).unwritable("orders") is None, answer


def test_a_full_refresh_asks_again_about_every_writable_topic_in_one_request() -> None:
    admin, clock = Admin({"a", "b", "c"}, {}), Clock()
    topics = cache(admin, clock)
    for name in ("a", "b", "c"):
        assert topics.unwritable(name) is None
    assert admin.described == [["a"], ["b"], ["c"]]
    # a missing topic's quicker refreshes list the topics, and ask nothing about the others
    clock.now += 6
    assert topics.unwritable("missing") is not None
    assert (admin.listed, len(admin.described)) == (2, 3)
    # the full refresh: one request for all, and an ACL taken away since is seen
    admin.answers["b"] = READ_ONLY
    clock.now += 31
    assert topics.unwritable("a") is None
    assert admin.described[3:] == [["a", "b", "c"]]
    assert topics.unwritable("b") is not None
    assert topics.unwritable("c") is None
    assert len(admin.described) == 4  # b's refusal kept: not asked again at once


def test_a_missing_topics_quick_listings_do_not_put_off_the_full_refresh() -> None:
    """A transaction parked on a missing topic asks about it at every batch; its listings every
    5 s must not keep the writable topics from being asked about again every 30 s (an ACL
    taken away would otherwise abort batch after batch)."""
    admin, clock = Admin({"orders"}, {}), Clock()
    topics = cache(admin, clock)
    assert topics.unwritable("orders") is None
    admin.answers["orders"] = READ_ONLY  # taken away
    for _ in range(10):
        clock.now += 6
        assert topics.unwritable("missing") is not None
        topics.unwritable("orders")
    assert ["orders"] in admin.described[1:]
    assert topics.unwritable("orders") is not None


def test_a_failed_listing_is_tried_again_after_the_miss_refresh_not_at_every_call() -> None:
    admin, clock = Admin({"orders"}, {}), Clock()
    topics = cache(admin, clock)
    assert topics.unwritable("orders") is None
    admin.down = True
    clock.now += 31
    for _ in range(100):
        assert topics.unwritable("orders") is None  # what was known, kept meanwhile
    assert admin.listed == 2
    admin.down = False
    clock.now += 6
    assert topics.unwritable("orders") is None
    assert admin.listed == 3


@pytest.mark.parametrize("answer", [False, None], ids=["refused", "no-answer"])
def test_an_auto_create_kafka_refuses_is_tried_again_only_every_miss_refresh(
    answer: bool | None,
) -> None:
    """No answer within 30 s raised TimeoutError out of the relay (not a KafkaException: the
    service exited)."""
    admin, clock = Admin(set(), {}), Clock()
    admin.may_create, admin.clock = answer, clock
    topics = cache(admin, clock, auto_create=True)
    for _ in range(50):
        assert topics.unwritable("orders") is not None
    assert admin.created == ["orders"]
    admin.may_create = True
    clock.now += 6
    assert topics.unwritable("orders") is None
    assert admin.created == ["orders", "orders"]
