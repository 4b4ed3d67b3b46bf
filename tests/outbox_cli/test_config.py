"""``kafka-outbox config``: effective settings, their sources, secrets masked, bad ones named."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from tests.outbox_cli.conftest import Cli

FILE = """
[relay]
bootstrap_servers = "file:9092"
group_id = "relays-from-file"

[checker]
bootstrap_servers = "file:9092"
secret = "file-secret-never-shown"

[checker.kafka]
"sasl.password" = "kafka-password-never-shown"
"client.id" = "checker-1"
"""


def test_config_prints_a_valid_file_with_sources_and_masks_every_secret(
    cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.toml"
    path.write_text(FILE)
    env = {"OUTBOX_RELAY_GROUP_ID": "relays-from-env", "OUTBOX_CHECKER_CHECK_MAX": "4"}
    result = cli("--config", str(path), "config", "--service", "relay", env=env)
    assert result.code == 0, result.err
    assert 'group_id = "relays-from-env"' in result.out
    assert "# env OUTBOX_RELAY_GROUP_ID" in result.out
    assert f"# file {path} [relay]" in result.out
    document = tomllib.loads(result.out)  # the output is itself a config file
    assert document["relay"]["bootstrap_servers"] == "file:9092"

    checker = cli("config", "--service", "checker", "--config", str(path), env=env)
    assert checker.code == 0, checker.err
    assert "never-shown" not in checker.out
    parsed = tomllib.loads(checker.out)["checker"]
    assert parsed["secret"] == "***"
    assert parsed["check_max"] == 4
    assert parsed["kafka"] == {"sasl.password": "***", "client.id": "checker-1"}


def test_config_json_masks_too_and_lists_every_service(cli: Cli) -> None:
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
        "OUTBOX_PRODUCER_GROUP": "orders",
        "OUTBOX_CHECKER_SECRET": "hmac-key",
        "OUTBOX_KAFKA__SASL_PASSWORD": "pw",
    }
    result = cli("config", "--json", env=env)
    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert {"producer", "relay", "checker"} <= set(document)  # and audit, with its extra
    assert document["checker"]["secret"] == "***"
    assert document["producer"]["kafka"] == {"sasl.password": "***"}
    assert "hmac-key" not in result.out


def test_config_exits_2_naming_the_bad_variable_and_warns_about_unknown_ones(cli: Cli) -> None:
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
        "OUTBOX_RELAY_BATCH_MAX_RECORDS": "lots",
        "OUTBOX_RELAY_BATCH_SIZE": "10",
    }
    result = cli("config", "--service", "relay", env=env)
    assert result.code == 2
    assert "[relay] OUTBOX_RELAY_BATCH_MAX_RECORDS='lots' is not a valid int" in result.err
    assert (
        "warning: OUTBOX_RELAY_BATCH_SIZE is not a setting "
        "(did you mean OUTBOX_RELAY_BATCH_MAX_RECORDS?)"
    ) in result.err


def test_config_names_the_file_the_section_and_the_unknown_key(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "outbox.yaml"
    path.write_text("relay:\n  bootstrap_servers: k:9092\n  batch_max_record: 10\n")
    result = cli("--config", str(path), "config", "--service", "relay")
    assert result.code == 2
    assert f"{path}: unknown key 'batch_max_record' in [relay]; valid keys:" in result.err
    missing = cli("--config", str(tmp_path / "absent.toml"), "config", "--service", "relay")
    assert missing.code == 2
    assert "absent.toml' cannot be read" in missing.err


def test_config_knows_the_topic_retentions_and_refuses_an_op_retention_below_the_half_one(
    cli: Cli,
) -> None:
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
        "OUTBOX_PRODUCER_GROUP": "orders",
        "OUTBOX_HALF_RETENTION_MS": "259200000",
        "OUTBOX_OP_RETENTION_MS": "864000000",
    }
    result = cli("config", "--service", "producer", env=env)
    assert result.code == 0, result.err
    assert "is not a setting" not in result.err
    assert re.search(
        r"^op_retention_ms = 864000000 +# env OUTBOX_OP_RETENTION_MS$", result.out, re.M
    )
    assert re.search(
        r"^half_retention_ms = 259200000 +# env OUTBOX_HALF_RETENTION_MS$", result.out, re.M
    )
    # Op records kept for less than the half records they decide: refused, naming the fix
    shorter = cli("config", "--service", "producer", env={**env, "OUTBOX_OP_RETENTION_MS": "1000"})
    assert shorter.code == 2
    assert "set OUTBOX_OP_RETENTION_MS (now 1000) to at least OUTBOX_HALF_RETENTION_MS" in (
        shorter.err
    )


def test_config_reports_each_shared_variable_as_the_service_reads_it(cli: Cli) -> None:
    """The command line and the services name one set of variables (each defined once in the
    settings modules): a shared OUTBOX_TOPIC_PREFIX is what the relay and checker use, and
    ``config`` says so (it said "default" while the relay used the shared value)."""
    from outbox_cli.settings import SERVICES

    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": "shared:9092",
        "OUTBOX_TOPIC_PREFIX": "__team-outbox",
        "OUTBOX_CHECKER_SECRET": "s3cret",
    }
    for name in ("relay", "checker"):
        service = SERVICES[name]
        loaded = service.load(env)
        assert loaded.topic_prefix == "__team-outbox"
        assert loaded.bootstrap_servers == "shared:9092"
        assert service.sources(env)["topic_prefix"] == "env OUTBOX_TOPIC_PREFIX"
        assert service.variables() >= {"OUTBOX_TOPIC_PREFIX", "OUTBOX_BOOTSTRAP_SERVERS"}
        result = cli("config", "--service", name, env=env)
        assert result.code == 0, result.err
        assert re.search(r'topic_prefix = "__team-outbox"\s+# env OUTBOX_TOPIC_PREFIX', result.out)


def test_config_knows_the_one_check_secret_and_its_file_and_masks_it(
    cli: Cli, tmp_path: Path
) -> None:
    (tmp_path / "check-secret").write_text("from-a-mounted-secret\n")
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
        "OUTBOX_PRODUCER_GROUP": "orders",
        "OUTBOX_CHECK_SECRET_FILE": str(tmp_path / "check-secret"),
        "OUTBOX_CHECK_PREVIOUS_SECRET": "the-old-one",
        "OUTBOX_CHECK_ADVERTISE_URL": "http://10.0.0.7:8081",
    }
    result = cli("config", env=env)
    assert result.code == 0, result.err
    assert "is not a setting" not in result.err  # the _FILE variable is known
    assert "from-a-mounted-secret" not in result.out and "the-old-one" not in result.out
    document = tomllib.loads(result.out)
    assert document["producer"]["check_secret"] == document["checker"]["secret"] == "***"
    assert document["producer"]["check_previous_secret"] == "***"
    assert document["producer"]["check_advertise_url"] == "http://10.0.0.7:8081"
    assert re.search(r"secret = \"\*\*\*\"\s+# env OUTBOX_CHECK_SECRET_FILE \(file ", result.out)
