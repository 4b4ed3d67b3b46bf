"""``--bootstrap-server`` and ``--command-config`` as Kafka's own tools take them, and the
database URL of ``migrate`` from the settings (a file), not only the command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox.errors import ConfigurationError
from outbox.properties import load_properties
from outbox.protocol import TopicNames
from outbox_cli.settings import command_line_connection
from tests.kafka_helpers import unique
from tests.outbox_cli.conftest import Cli


def test_a_properties_file_reads_as_kafka_s_tools_write_it(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "# comment\n! also a comment\n\nsecurity.protocol=SASL_SSL\n"
        "sasl.mechanism : SCRAM-SHA-512\nsasl.username alice\nsasl.password=p=ss:word\n"
    )
    assert load_properties(path) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "p=ss:word",  # only the first separator splits
    }
    # as Java reads it: a byte-order mark, a continued line, escapes, trailing blanks kept
    path.write_text(
        "\ufeffsasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n"
        '    required username="alice" \\\n    password="s3cret";\n'
        "ssl.ca.location=C:\\\\certs\\\\ca.pem\n"
        "client.id = tab\\there  \n"
        "weird\\=key=\\u00e9\n",
        encoding="utf-8",
    )
    assert load_properties(path) == {
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
        'required username="alice" password="s3cret";',
        "ssl.ca.location": "C:\\certs\\ca.pem",
        "client.id": "tab\there  ",
        "weird=key": "\u00e9",
    }
    path.write_text("bad=\\u12\n")
    with pytest.raises(ConfigurationError, match="malformed"):
        load_properties(path)
    with pytest.raises(ConfigurationError, match="cannot be read"):
        load_properties(tmp_path / "absent")
    path.write_text("ssl_key=x\n")
    with pytest.raises(ConfigurationError, match="'ssl_key' is not a librdkafka setting"):
        command_line_connection(None, str(path))


def test_the_flags_reach_every_service_s_settings(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text("bootstrap.servers=file:9092\nsecurity.protocol=SSL\n")
    variables = command_line_connection("flag:9092", str(path))
    assert variables["OUTBOX_BOOTSTRAP_SERVERS"] == "flag:9092"  # the flag wins over the file
    assert variables["OUTBOX_RELAY_BOOTSTRAP_SERVERS"] == "flag:9092"
    assert variables["OUTBOX_CHECKER_KAFKA__SECURITY_PROTOCOL"] == "SSL"
    assert command_line_connection(None, str(path))["OUTBOX_BOOTSTRAP_SERVERS"] == "file:9092"


@pytest.mark.integration
def test_bootstrap_server_and_command_config_win_over_the_environment(
    cli: Cli, kafka_bootstrap: str, unused_port: int, tmp_path: Path
) -> None:
    names = TopicNames(unique("__outbox-flags"))
    env = {
        # the environment names a broker that is not there: the flags must win over it
        "OUTBOX_BOOTSTRAP_SERVERS": f"127.0.0.1:{unused_port}",
        "OUTBOX_TOPIC_PREFIX": names.prefix,
        "OUTBOX_PARTITIONS": "1",
    }
    done = cli("topics", "ensure", "--bootstrap-server", kafka_bootstrap, env=env)
    assert done.code == 0, done.err
    assert os.environ["OUTBOX_BOOTSTRAP_SERVERS"] == f"127.0.0.1:{unused_port}"  # as it was
    assert "OUTBOX_RELAY_BOOTSTRAP_SERVERS" not in os.environ
    # before the command too, and a command config whose settings reach the client: plain
    # text works, SSL against this plaintext broker cannot connect
    plain = tmp_path / "plain.properties"
    plain.write_text(f"bootstrap.servers={kafka_bootstrap}\nsecurity.protocol=plaintext\n")
    assert cli("--command-config", str(plain), "status", env=env).code == 0
    ssl = tmp_path / "ssl.properties"
    ssl.write_text(f"bootstrap.servers={kafka_bootstrap}\nsecurity.protocol=ssl\n")
    refused = cli("--timeout", "3s", "--command-config", str(ssl), "status", env=env)
    assert refused.code == 3, refused.err


def test_migrate_takes_the_database_url_from_a_file_named_by_the_settings(
    cli: Cli, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    missing = cli("migrate")
    assert missing.code == 2
    assert "give --db-url, or set OUTBOX_DATABASE_URL" in missing.err
    (tmp_path / "database-url").write_text(url + "\n")
    done = cli("migrate", env={"OUTBOX_DATABASE_URL_FILE": str(tmp_path / "database-url")})
    assert done.code == 0, done.err
    database = sa.create_engine(url)
    assert "outbox_evidence" in sa.inspect(database).get_table_names()
    database.dispose()
    pruned = cli("evidence", "prune")  # the same setting
    assert pruned.code == 0, pruned.err


def test_config_hides_the_password_of_the_database_url(cli: Cli) -> None:
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
        "OUTBOX_PRODUCER_GROUP": "orders",
        "OUTBOX_DATABASE_URL": "postgresql+psycopg://orders:s3cret@db:5432/orders",
    }
    result = cli("config", "--service", "producer", env=env)
    assert result.code == 0, result.err
    assert "s3cret" not in result.out
    assert 'database_url = "postgresql+psycopg://orders:***@db:5432/orders"' in result.out


def test_a_flag_wins_over_a_file_variable_too_and_both_come_back_after(
    cli: Cli, tmp_path: Path
) -> None:
    """In a pod whose settings come from mounted files (``..._FILE``), an operator's flag must
    still win, not collide with the file variable ("both ... are set")."""
    (tmp_path / "password").write_text("from-the-secret\n")
    (tmp_path / "bootstrap").write_text("pod-kafka:9092\n")
    (tmp_path / "client.properties").write_text("sasl.password=from-the-flag\n")
    env = {
        "OUTBOX_PRODUCER_GROUP": "orders",
        "OUTBOX_BOOTSTRAP_SERVERS_FILE": str(tmp_path / "bootstrap"),
        "OUTBOX_KAFKA__SASL_PASSWORD_FILE": str(tmp_path / "password"),
    }
    result = cli(
        "--bootstrap-server",
        "flag-kafka:9092",
        "--command-config",
        str(tmp_path / "client.properties"),
        "config",
        "--service",
        "producer",
        "--json",
        env=env,
    )
    assert result.code == 0, result.err
    import json

    producer = json.loads(result.out)["producer"]
    assert producer["bootstrap_servers"] == "flag-kafka:9092"
    assert producer["kafka"] == {"sasl.password": "***"}
    assert os.environ["OUTBOX_KAFKA__SASL_PASSWORD_FILE"] == str(tmp_path / "password")
    assert "OUTBOX_KAFKA__SASL_PASSWORD" not in os.environ
    assert "OUTBOX_CONFIG_FILE" not in os.environ


def test_config_hides_a_password_given_in_a_url_s_query(cli: Cli) -> None:
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
        "OUTBOX_PRODUCER_GROUP": "orders",
        "OUTBOX_DATABASE_URL": "postgresql+psycopg://db/orders?user=orders&password=s3cret&x=1",
    }
    result = cli("config", "--service", "producer", env=env)
    assert result.code == 0, result.err
    assert "s3cret" not in result.out and "password=***&x=1" in result.out
