#!/usr/bin/env python
"""A stand-in for Kafka's ``kafka-console-consumer.sh`` in the README test (the broker's jars
ship no scripts here): the same flags the README uses, a real ``read_committed`` consumer, and
an end, where the real tool runs until interrupted: it stops once it has printed something and
then read nothing more for ``--idle-s`` (a repeat arriving late would be printed before that)."""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap-server", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--isolation-level", default="read_uncommitted")
    parser.add_argument("--from-beginning", action="store_true")
    parser.add_argument("--property", action="append", default=[])
    parser.add_argument("--idle-s", type=float, default=8.0)
    parser.add_argument("--max-s", type=float, default=120.0)
    args = parser.parse_args()
    print_key = "print.key=true" in args.property
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap_server,
            "group.id": f"console-consumer-{uuid.uuid4().hex[:8]}",
            "isolation.level": args.isolation_level,
            "auto.offset.reset": "earliest" if args.from_beginning else "latest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    consumer.subscribe([args.topic])
    started = last = time.monotonic()
    printed = 0
    try:
        while time.monotonic() - started < args.max_s:
            msg = consumer.poll(0.5)
            now = time.monotonic()
            if msg is None:
                if printed and now - last > args.idle_s:
                    break
                continue
            if msg.error() is not None:
                if msg.error().retriable() or "UNKNOWN_TOPIC" in msg.error().name():
                    continue  # the relay creates the topic a moment later
                raise KafkaException(msg.error())
            key = (msg.key() or b"").decode()
            value = (msg.value() or b"").decode()
            print(f"{key}\t{value}" if print_key else value, flush=True)
            printed += 1
            last = now
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
