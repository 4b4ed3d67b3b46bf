"""A three-broker KRaft cluster run as local Java processes, replicated as production runs it.

Every node is broker and controller (three voters, so a quorum survives one node's loss), and
every topic - the outbox's, the real topics, ``__consumer_offsets`` and ``__transaction_state``
- has replication factor 3 and ``min.insync.replicas=2``: the setting the README's "Broker
versions" gives as the mitigation of KAFKA-20734, which a single broker cannot test. The cluster
can lose any one node, by ``kill -9`` or a clean shutdown, and keep serving; the fault test
(``tests/relay/test_cluster_faults.py``) does exactly that under load.

The jar folder is a parameter, so the same cluster runs the pinned release and the newest one
(``HarnessSettings.kafka_newest_jars_dir``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from outbox.kafka_logging import log_to_python
from outbox.testing.kafka_process import KafkaProcess, _run
from outbox.testing.left_processes import new_workdir
from outbox.testing.readiness import wait_for_kafka
from outbox.testing.service import ServiceStartError
from outbox.testing.settings import HarnessSettings

SIZE = 3
MIN_INSYNC = 2
TRANSACTION_STATE_PARTITIONS = 4
#: Partitions of ``__consumer_offsets``: a group's coordinator is one of their leaders.
OFFSETS_PARTITIONS = 4
# Three brokers, a relay pair, checkers, PostgreSQL and Spark share two cores and the memory.
NODE_HEAP = "-Xmx512m"


def cluster_properties(*, node_id: int, port: int, voters: str, log_dir: Path) -> str:
    """One node's config: broker and controller, RF 3 and min ISR 2 for every topic.

    ``leader.imbalance.check.interval.seconds`` is shortened (300 s by default) so a restarted
    broker takes back its preferred leaderships within the test, and the next kill finds
    leaders spread as in a long-running cluster. Failure detection keeps Kafka's defaults
    (``broker.session.timeout.ms`` 9 s): the recovery times measured are those of a default
    cluster.
    """
    controller_port = int(voters.split(",")[node_id - 1].rsplit(":", 1)[1])
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={log_dir}",
            "num.partitions=3",
            f"default.replication.factor={SIZE}",
            f"min.insync.replicas={MIN_INSYNC}",
            f"offsets.topic.replication.factor={SIZE}",
            f"offsets.topic.num.partitions={OFFSETS_PARTITIONS}",
            f"transaction.state.log.replication.factor={SIZE}",
            f"transaction.state.log.min.isr={MIN_INSYNC}",
            f"transaction.state.log.num.partitions={TRANSACTION_STATE_PARTITIONS}",
            "unclean.leader.election.enable=false",
            "leader.imbalance.check.interval.seconds=10",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "log.cleaner.backoff.ms=1000",
            "",
        ]
    )


class KafkaCluster:
    """Three nodes on free loopback ports; ``kill``/``stop`` one and ``restart`` it by node id."""

    def __init__(
        self,
        settings: HarnessSettings,
        *,
        jars_dir: Path | None = None,
        workdir: Path | None = None,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = workdir or new_workdir("outbox-cluster-")
        self.version = settings.kafka_version(jars_dir)
        self.nodes: dict[int, KafkaProcess] = {}
        for node_id in range(1, SIZE + 1):
            folder = self.workdir / f"node-{node_id}"
            folder.mkdir(parents=True, exist_ok=True)
            self.nodes[node_id] = KafkaProcess(settings, folder, jars_dir=jars_dir, heap=NODE_HEAP)
        self.voters = ",".join(
            f"{i}@127.0.0.1:{node.controller_port}" for i, node in self.nodes.items()
        )

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes.values())

    def start(self, timeout: float = 180.0) -> None:
        """Format every node with one cluster id, start them together, wait for a round trip.

        Raises:
            ServiceStartError: a node exited, or the cluster did not serve within ``timeout``.
        """
        any_node = next(iter(self.nodes.values()))
        out = _run(any_node._java("kafka.tools.StorageTool", "random-uuid", log=any_node.log_file))
        cluster_id = out.strip().splitlines()[-1]
        for node_id, node in self.nodes.items():
            node.config.write_text(
                cluster_properties(
                    node_id=node_id,
                    port=node.port,
                    voters=self.voters,
                    log_dir=node.workdir / "data",
                )
            )
            _run(
                node._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(node.config),
                    log=node.log_file,
                )
            )
        for node in self.nodes.values():
            node.launch()
        try:
            wait_for_kafka(
                self.bootstrap,
                timeout=timeout,
                alive=lambda: all(n.alive() for n in self.nodes.values()),
            )
        except ServiceStartError as err:
            tails = "\n".join(f"--- node {i} ---\n{n.logs(30)}" for i, n in self.nodes.items())
            self.kill_all()
            raise ServiceStartError(f"{err}\n{tails}") from err

    def kill(self, node_id: int) -> None:
        """``kill -9``: no clean shutdown, no leadership handed over."""
        self.nodes[node_id].kill()

    def stop(self, node_id: int) -> None:
        """A clean shutdown (SIGTERM): the broker hands its leaderships over first."""
        self.nodes[node_id].stop(timeout=60)

    def restart(self, node_id: int, timeout: float = 300.0) -> None:
        """Start a stopped or killed node again and wait until it serves a round trip.

        The timeout is long: on a busy 2-core machine a restarted node was seen to take more
        than 120 s to load its logs and serve (tests/relay/test_cluster_faults.py)."""
        node = self.nodes[node_id]
        if node.alive():
            raise ServiceStartError(f"node {node_id} is still running; stop or kill it first")
        node.start(timeout=timeout)

    def wait_in_sync(self, timeout: float = 180.0) -> float:
        """Wait until every replica of every partition is in sync; the seconds it took.

        Raises:
            ServiceStartError: some partition still lacked a replica after ``timeout``.
        """
        started = time.monotonic()
        lagging = self.out_of_sync()
        while lagging:
            if time.monotonic() - started > timeout:
                raise ServiceStartError(
                    f"replicas not in sync after {timeout:.0f} s: {lagging[:5]}"
                )
            time.sleep(0.5)
            lagging = self.out_of_sync()
        return time.monotonic() - started

    def out_of_sync(self) -> list[str]:
        """``topic[partition]`` of each partition whose in-sync replicas are not all three."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(log_to_python({"bootstrap.servers": self.bootstrap}))
        try:
            topics = admin.list_topics(timeout=10).topics
        except Exception as err:  # a cluster between leaders: ask again
            return [f"(no metadata: {err})"]
        return [
            f"{name}[{p}] isr={sorted(part.isrs)}"
            for name, topic in topics.items()
            for p, part in topic.partitions.items()
            if len(part.isrs) < SIZE
        ]

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> node id of its leader now (-1 when it has none)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(log_to_python({"bootstrap.servers": self.bootstrap}))
        found = admin.list_topics(topic, timeout=10).topics[topic]
        return {p: part.leader for p, part in found.partitions.items()}

    def coordinator(self, transactional_id: str) -> int:
        """The node id of the transaction coordinator of ``transactional_id``: the leader of
        its ``__transaction_state`` partition (Kafka's ``partitionFor``: the Java hash code of
        the id, made non-negative, modulo the partition count)."""
        partition = abs(java_string_hash(transactional_id)) % TRANSACTION_STATE_PARTITIONS
        return self.leaders("__transaction_state")[partition]

    def kill_all(self) -> None:
        for node in self.nodes.values():
            node.kill()

    def close(self) -> None:
        """Stop every node (killed: nothing of the data is kept) and remove the data, unless
        the caller gave the folder (pytest's tmp_path keeps the last runs' logs to read)."""
        self.kill_all()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self, tail: int | None = None) -> str:
        return "\n".join(f"--- node {i} ---\n{n.logs(tail)}" for i, n in self.nodes.items())


def java_string_hash(text: str) -> int:
    """``String.hashCode()`` of Java, as a signed 32-bit int (UTF-16 code units)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h
