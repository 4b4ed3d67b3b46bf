"""The relay's protocol floor: the Kafka work every relay of this protocol does, and nothing else.

A relay of half messages must read every half record and every op record, write each committed
message to its real topic, and commit what it wrote together with how far it read, in one Kafka
transaction, for ``read_committed`` readers to see each message once. The floor does exactly
that, in Python through confluent-kafka, with the relay's own client settings
(:mod:`relay.clients`) and batch size (one ``consume()`` per Kafka transaction), and nothing of
ours' machinery: it decodes no record, matches no op to its half records (it writes each half
record as it reads it, so it would promote a rolled-back one), keeps no state, asks for no
delivery report, and writes one header, the transaction id the benchmark's watcher counts by,
with the message's key. Baseline B's polling relay writes the rows it selected, with no records
to read back and no Kafka transaction.

So promotions/s of the floor bound, on this machine and client, what any relay of this protocol
written in Python on confluent-kafka can reach; ours below the floor is ours' own machinery
(docs/benchmarks.md, "Where the relay's time goes"). It is not a relay anyone should run.

``python -m bench.relay_floor --real-topic T`` with the relay's ``OUTBOX_RELAY_*`` environment
(bootstrap, topic prefix, group, instance id); SIGTERM stops it.

The same floor on the JVM (``jvm/relay-floor/RelayFloor.java``, Kafka's own Java client, run
from its source by :func:`jvm_command`) answers the question the Python floor leaves: how fast
the protocol's Kafka work goes on this machine when no Python object is made per record, which
is what compiled code could reach at best.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from types import FrameType

from confluent_kafka import Consumer, Producer

from bench.procs import ROOT
from outbox.protocol.headers import Header
from relay.clients import consumer_config, producer_config
from relay.settings import RelaySettings

KEY = Header.REAL_KEY.value
TXN_ID = Header.TXN_ID.value


def run(settings: RelaySettings, real_topic: str, stopped: list[bool]) -> int:
    """Promote until ``stopped[0]``; the records written."""
    names = settings.topics
    producer = Producer(producer_config(settings))
    # a fresh group: nothing committed, so from the start (the relay sets offsets on assignment)
    consumer = Consumer({**consumer_config(settings), "auto.offset.reset": "earliest"})
    written = 0
    try:
        producer.init_transactions(30)
        consumer.subscribe([names.half, names.op])
        half, batch = names.half, settings.batch_max_records
        while not stopped[0]:
            messages = consumer.consume(batch, settings.poll_timeout_s)
            if not messages:
                continue
            producer.begin_transaction()
            for msg in messages:
                if msg.error() is not None or msg.topic() != half:
                    continue  # an op record: read, as every relay must, and nothing more here
                pairs: list[tuple[str, bytes]] = msg.headers() or []  # type: ignore[assignment]
                key = next((v for k, v in pairs if k == KEY), None)
                producer.produce(real_topic, msg.value(), key, headers=[(TXN_ID, msg.key())])
                written += 1
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata())
            producer.commit_transaction()
    finally:
        consumer.close()
        producer.flush(10)
    return written


#: The JVM floor's source, run without a build step (Java's source-file mode).
JVM_SOURCE = ROOT / "jvm" / "relay-floor" / "RelayFloor.java"


def jdk_found() -> bool:
    """Whether a JDK is on PATH: a Java runtime alone cannot run a source file."""
    return shutil.which("java") is not None and shutil.which("javac") is not None


def jvm_command(
    classpath: str, bootstrap: str, prefix: str, group: str, real_topic: str
) -> list[str]:
    """``java`` running the JVM floor from its source on ``classpath`` (the broker's jars, which
    hold Kafka's Java client); see :func:`jdk_found`."""
    source = str(JVM_SOURCE)
    return ["java", "-Xmx512m", "-cp", classpath, source, bootstrap, prefix, group, real_topic]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_floor", description=__doc__)
    parser.add_argument("--real-topic", required=True, help="where every half record is written")
    args = parser.parse_args(argv)
    stopped = [False]

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped[0] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    written = run(RelaySettings.from_env(), args.real_topic, stopped)
    print(f"relay floor: {written} records written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
