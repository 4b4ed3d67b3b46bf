"""A broker that enforces ACLs, for the services run as principals a cluster's ACLs limit.

It has two listeners: the plain one's anonymous principal is a super user (the tests write
records and ACLs through it, as an operator would), the SASL PLAIN one authenticates the
:data:`USERS`, which may do only what :meth:`AclKafka.allow` grants them (Kafka's own
``StandardAuthorizer``, no ACL = refused).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from outbox.testing.kafka_process import KafkaProcess
from outbox.testing.ports import free_port
from outbox.testing.settings import HarnessSettings
from tests.kafka_helpers import admin_client

#: The SASL users and their passwords.
USERS = {
    "auditor": "auditor-secret",
    "relay": "relay-secret",
    "checker": "checker-secret",
    "producer": "producer-secret",
}


class AclKafka:
    """``plain``: the super user's address; ``sasl``: the :data:`USERS`' address."""

    def __init__(self, process: KafkaProcess, sasl_port: int) -> None:
        self.plain = process.bootstrap
        self.sasl = f"127.0.0.1:{sasl_port}"
        self.admin = admin_client(self.plain)

    def allow(self, user: str, kind: ResourceType, name: str, *operations: AclOperation) -> None:
        """Grant ``user`` the ``operations`` on ``name`` (a prefix when it ends with ``-``,
        every resource of the kind for ``*``), and wait until the broker applies them."""
        pattern = (
            ResourcePatternType.PREFIXED if name.endswith("-") else ResourcePatternType.LITERAL
        )
        principal = f"User:{user}"
        bindings = [
            AclBinding(kind, name, pattern, principal, "*", op, AclPermissionType.ALLOW)
            for op in operations
        ]
        for future in self.admin.create_acls(bindings).values():
            future.result(30)
        # the controller has them; wait until the broker's authorizer does too
        wanted = AclBindingFilter(
            kind, name, pattern, principal, "*", AclOperation.ANY, AclPermissionType.ANY
        )
        deadline = time.monotonic() + 30
        while {b.operation for b in self.admin.describe_acls(wanted).result(30)} < set(operations):
            assert time.monotonic() < deadline, f"the broker never showed the ACLs on {name}"
            time.sleep(0.1)

    def revoke(self, user: str, kind: ResourceType, name: str, operation: AclOperation) -> None:
        """Take back one operation :meth:`allow` granted (a literal ACL), waiting for Kafka."""
        taken = AclBindingFilter(
            kind,
            name,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for future in self.admin.delete_acls([taken]).values():
            future.result(30)
        # the controller dropped it; wait until the broker's authorizer has too (as allow does)
        deadline = time.monotonic() + 30
        while self.admin.describe_acls(taken).result(30):
            assert time.monotonic() < deadline, f"the broker still shows the ACL on {name}"
            time.sleep(0.1)

    @staticmethod
    def java_login(user: str, password: str | None = None) -> dict[str, str]:
        """The Java client's settings (the audit's) to log in as ``user``."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
            f'required username="{user}" password="{password or USERS[user]}";',
        }

    @staticmethod
    def librdkafka_login(user: str) -> dict[str, str]:
        """librdkafka's settings (the relay's, the checker's) to log in as ``user``."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": USERS[user],
        }


@contextmanager
def acl_kafka(harness_settings: HarnessSettings, workdir: Path) -> Iterator[AclKafka]:
    """A broker of its own enforcing ACLs; its data folder is removed after."""
    sasl_port = free_port()
    accounts = " ".join(f'user_{u}="{p}"' for u, p in USERS.items())
    process = KafkaProcess(
        harness_settings,
        workdir=workdir,
        extra_properties={
            "listeners": (
                "PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port},"
                f"SASL://127.0.0.1:{sasl_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{{port}},SASL://127.0.0.1:{sasl_port}",
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {accounts};"
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
        },
    )
    process.format()
    process.start()
    try:
        yield AclKafka(process, sasl_port)
    finally:
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
