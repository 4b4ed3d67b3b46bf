"""Every service's settings come from its env prefix the same way, with errors naming the key."""

from __future__ import annotations

import pytest

from checker import CheckerSettings
from outbox import ConfigurationError, OutboxSettings
from relay import RelaySettings


def test_producer_settings_from_env_convert_types_and_pass_kafka_keys_through() -> None:
    settings = OutboxSettings.from_env(
        {
            "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
            "OUTBOX_PRODUCER_GROUP": "orders",
            "OUTBOX_PARTITIONS": "12",
            "OUTBOX_SEND_TIMEOUT_S": "2.5",
            "OUTBOX_KAFKA__LINGER_MS": "5",
        }
    )
    assert (settings.partitions, settings.send_timeout_s) == (12, 2.5)
    assert settings.kafka == {"linger.ms": "5"}


def test_services_share_the_bootstrap_variable_and_their_own_prefix_wins() -> None:
    env = {"OUTBOX_BOOTSTRAP_SERVERS": "shared:9092", "OUTBOX_RELAY_BOOTSTRAP_SERVERS": "own:9092"}
    assert RelaySettings.from_env(env).bootstrap_servers == "own:9092"
    checker = CheckerSettings.from_env(
        {
            **env,
            "OUTBOX_CHECKER_SECRET": "s",
            "OUTBOX_CHECKER_CHECK_MAX": "4",
            "OUTBOX_CHECKER_INSECURE_LOCAL": "no",
        }
    )
    assert (checker.bootstrap_servers, checker.check_max, checker.insecure_local) == (
        "shared:9092",
        4,
        False,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OUTBOX_PRODUCER_GROUP": "g"}, "set OUTBOX_BOOTSTRAP_SERVERS"),
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_PARTITIONS": "six",
            },
            "OUTBOX_PARTITIONS='six' is not a valid int",
        ),
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_PARTITIONS": "0",
            },
            "partitions=0 must be at least 1",
        ),
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_OP_LINGER_MS": "-1",
            },
            r"op_linger_ms=-1.0 must be between 0 and 900000",
        ),
        (
            {"OUTBOX_BOOTSTRAP_SERVERS": "k", "OUTBOX_PRODUCER_GROUP": "orders\x1f"},
            r"producer_group='orders\\x1f' contains a control character",
        ),
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_HALF_SCHEMA_VERSION": "3",
            },
            r"half_schema_version=3 is not one this library writes; use one of 1, 2",
        ),
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_SEND_TIMEOUT_S": "nan",
            },
            r"send_timeout_s=nan must be positive",
        ),
        # acks=1 lets a leader's failover drop an acknowledged half record: a committed
        # transaction's message never delivered (the user's keys came after the outbox's)
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_KAFKA__ACKS": "1",
                "OUTBOX_KAFKA__ENABLE_IDEMPOTENCE": "false",
            },
            r"kafka\['acks'\]='1' would let the broker lose .* remove OUTBOX_KAFKA__ACKS",
        ),
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_KAFKA__ENABLE_IDEMPOTENCE": "false",
            },
            r"kafka\['enable.idempotence'\]='false' .* OUTBOX_KAFKA__ENABLE_IDEMPOTENCE",
        ),
    ],
)
def test_bad_settings_name_the_variable_and_the_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        OutboxSettings.from_env(env)


def test_the_checker_refuses_to_run_unsigned_unless_told_it_is_local() -> None:
    with pytest.raises(ConfigurationError, match="OUTBOX_CHECK_SECRET"):
        CheckerSettings.from_env({"OUTBOX_BOOTSTRAP_SERVERS": "k"})
    with pytest.raises(ConfigurationError, match="not a boolean"):
        CheckerSettings.from_env(
            {"OUTBOX_BOOTSTRAP_SERVERS": "k", "OUTBOX_CHECKER_INSECURE_LOCAL": "maybe"}
        )


# -- the config file ------------------------------------------------------------------------


def write(tmp_path, text: str, name: str = "outbox.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_toml_file_sets_each_service_from_its_own_section_and_env_wins_over_it(
    tmp_path,
) -> None:
    path = write(
        tmp_path,
        """
[producer]
bootstrap_servers = "file:9092"
producer_group = "orders"
partitions = 3
send_timeout_s = 4

[producer.kafka]
"linger.ms" = 7
"client.id" = "from-file"

[relay]
bootstrap_servers = "relay-file:9092"
batch_max_records = "250"

[checker]
secret = "from-file"
check_max = 4
""",
    )
    env = {
        "OUTBOX_CONFIG_FILE": path,
        "OUTBOX_PARTITIONS": "12",
        "OUTBOX_KAFKA__CLIENT_ID": "from-env",
        "OUTBOX_BOOTSTRAP_SERVERS": "env:9092",
    }
    producer = OutboxSettings.from_env(env, send_attempts=5)
    assert (producer.bootstrap_servers, producer.producer_group) == ("env:9092", "orders")
    assert (producer.partitions, producer.send_timeout_s, producer.send_attempts) == (12, 4.0, 5)
    assert producer.kafka == {"linger.ms": 7, "client.id": "from-env"}
    relay = RelaySettings.from_env({"OUTBOX_CONFIG_FILE": path})
    assert (relay.bootstrap_servers, relay.batch_max_records) == ("relay-file:9092", 250)
    # The shared variable is an environment variable, so it wins over the file too.
    assert RelaySettings.from_env(env).bootstrap_servers == "env:9092"
    checker = CheckerSettings.from_env(env)
    assert (checker.secret, checker.check_max, checker.bootstrap_servers) == (
        "from-file",
        4,
        "env:9092",
    )


def test_a_yaml_file_works_like_the_toml_one(tmp_path) -> None:
    path = write(
        tmp_path,
        "relay:\n  bootstrap_servers: y:9092\n  commit_interval_s: 1\n  kafka:\n    linger.ms: 3\n",
        "outbox.yaml",
    )
    relay = RelaySettings.from_env({"OUTBOX_CONFIG_FILE": path})
    assert (relay.bootstrap_servers, relay.commit_interval_s) == ("y:9092", 1.0)
    assert relay.kafka == {"linger.ms": 3}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[relay]\nbootstrap_servers = 'k'\nbatch_size = 5\n",
            r"unknown key 'batch_size' in \[relay\]; valid keys: .*batch_max_records, ",
        ),
        ("[relays]\nx = 1\n", r"unknown section 'relays'.*valid sections: \[producer\], \[relay\]"),
        (
            "[relay]\nbootstrap_servers = 'k'\nbatch_max_records = 'many'\n",
            r"\[relay\] batch_max_records='many' is not a valid int",
        ),
        (
            "[relay]\nbootstrap_servers = 'k'\nbatch_max_records = 2.5\n",
            r"\[relay\] batch_max_records = 2.5 is not a valid int",
        ),
        ("[relay]\nbootstrap_servers = 'k'\nkafka = 5\n", r"\[relay\] kafka must be a table"),
        ("[relay\n", "is not valid TOML"),
        ("[relay]\nbootstrap_servers = 'k'\nbatch_max_records = 0\n", "must be at least 1"),
    ],
)
def test_a_bad_file_names_the_file_the_section_the_key_and_the_value(
    tmp_path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigurationError, match=message):
        RelaySettings.from_env({"OUTBOX_CONFIG_FILE": path})


def test_a_missing_config_file_is_refused_with_the_variable_that_named_it(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot be read.*OUTBOX_CONFIG_FILE"):
        RelaySettings.from_env({"OUTBOX_CONFIG_FILE": str(tmp_path / "absent.toml")})


def test_collect_says_where_each_value_came_from(tmp_path) -> None:
    from outbox.env import collect

    path = write(tmp_path, "[relay]\nbootstrap_servers = 'f:1'\ngroup_id = 'g'\n")
    env = {
        "OUTBOX_CONFIG_FILE": path,
        "OUTBOX_RELAY_GROUP_ID": "env-group",
        "OUTBOX_RELAY_KAFKA__LINGER_MS": "1",
    }
    values, sources = collect(RelaySettings, "OUTBOX_RELAY_", env, {"poll_timeout_s": 0.5})
    assert values["group_id"] == "env-group"
    assert sources == {
        "bootstrap_servers": f"file {path} [relay]",
        "group_id": "env OUTBOX_RELAY_GROUP_ID",
        "kafka": "env OUTBOX_RELAY_KAFKA__*",
        "poll_timeout_s": "argument",
    }


def test_a_list_in_the_file_fills_a_tuple_setting(tmp_path) -> None:
    from dataclasses import dataclass

    from outbox.env import from_env

    @dataclass(frozen=True, kw_only=True)
    class Listing:
        names: tuple[str, ...] = ()

    path = write(tmp_path, '[listing]\nnames = ["orders", "payments"]\n')
    with pytest.raises(ConfigurationError, match=r"unknown section 'listing'"):
        from_env(Listing, "OUTBOX_LISTING_", {"OUTBOX_CONFIG_FILE": path}, {}, required=())
    path = write(tmp_path, '[audit]\nnames = ["orders", "payments"]\n')
    found = from_env(Listing, "OUTBOX_AUDIT_", {"OUTBOX_CONFIG_FILE": path}, {}, required=())
    assert found.names == ("orders", "payments")


def test_the_services_share_the_producers_topic_prefix_and_their_own_wins() -> None:
    from checker import CheckerSettings
    from relay import RelaySettings

    env = {"OUTBOX_BOOTSTRAP_SERVERS": "k:9092", "OUTBOX_TOPIC_PREFIX": "__shop"}
    assert RelaySettings.from_env(env).topic_prefix == "__shop"
    assert (
        CheckerSettings.from_env({**env, "OUTBOX_CHECKER_INSECURE_LOCAL": "true"}).topic_prefix
        == "__shop"
    )
    own = {**env, "OUTBOX_RELAY_TOPIC_PREFIX": "__own"}
    assert RelaySettings.from_env(own).topic_prefix == "__own"


BASE = {"OUTBOX_BOOTSTRAP_SERVERS": "k:9092", "OUTBOX_PRODUCER_GROUP": "orders"}


def test_one_check_secret_serves_producers_and_checker_from_a_file(tmp_path) -> None:
    # A Kubernetes Secret mounted as a file: its content, the trailing newline dropped
    (tmp_path / "check-secret").write_text("s3cret-from-a-file\n")
    env = {**BASE, "OUTBOX_CHECK_SECRET_FILE": str(tmp_path / "check-secret")}
    producer = OutboxSettings.from_env(env)
    assert producer.check_secret == "s3cret-from-a-file"
    assert CheckerSettings.from_env(env).secret == "s3cret-from-a-file"
    assert "s3cret" not in repr(producer)  # never in a log line that prints the settings
    # the checker's own variable still wins for the checker alone
    own = CheckerSettings.from_env({**env, "OUTBOX_CHECKER_SECRET": "checker-only"})
    assert own.secret == "checker-only"


def test_any_setting_and_a_librdkafka_key_can_come_from_a_file(tmp_path) -> None:
    (tmp_path / "partitions").write_text("12")
    (tmp_path / "password").write_text("kafka-pass\n")
    settings = OutboxSettings.from_env(
        {
            **BASE,
            "OUTBOX_PARTITIONS_FILE": str(tmp_path / "partitions"),
            "OUTBOX_KAFKA__SASL_PASSWORD_FILE": str(tmp_path / "password"),
        }
    )
    assert settings.partitions == 12
    assert settings.kafka == {"sasl.password": "kafka-pass"}


def test_a_file_variable_that_cannot_be_used_is_refused_naming_it(tmp_path) -> None:
    missing = str(tmp_path / "absent")
    with pytest.raises(ConfigurationError, match=f"OUTBOX_CHECK_SECRET_FILE='{missing}'"):
        OutboxSettings.from_env({**BASE, "OUTBOX_CHECK_SECRET_FILE": missing})
    (tmp_path / "s").write_text("x")
    both = {"OUTBOX_CHECK_SECRET": "y", "OUTBOX_CHECK_SECRET_FILE": str(tmp_path / "s")}
    with pytest.raises(ConfigurationError, match="both OUTBOX_CHECK_SECRET and"):
        OutboxSettings.from_env({**BASE, **both})
    (tmp_path / "n").write_text("many")
    with pytest.raises(ConfigurationError, match=r"OUTBOX_PARTITIONS_FILE .* is not a valid int"):
        OutboxSettings.from_env({**BASE, "OUTBOX_PARTITIONS_FILE": str(tmp_path / "n")})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OUTBOX_CHECK_PREVIOUS_SECRET": "old"}, "set OUTBOX_CHECK_SECRET to the new secret"),
        ({"OUTBOX_CHECK_ADVERTISE_URL": "10.0.0.7:8081"}, "is not an http"),
        ({"OUTBOX_CHECK_PORT": "70000"}, "check_port=70000 must be 0-65535"),
    ],
)
def test_bad_check_endpoint_settings_name_the_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        OutboxSettings.from_env({**BASE, **env})


def test_a_secret_s_trailing_newline_is_dropped_from_a_variable_as_from_a_file(tmp_path) -> None:
    """A Secret made with ``--from-file`` keeps the file's newline: a producer reading it as a
    variable (secretKeyRef) and a checker reading it as a file must still share one key."""
    (tmp_path / "check-secret").write_text("abc\n")
    producer = OutboxSettings.from_env({**BASE, "OUTBOX_CHECK_SECRET": "abc\n"})
    secret_file = str(tmp_path / "check-secret")
    checker = CheckerSettings.from_env(
        {"OUTBOX_BOOTSTRAP_SERVERS": "k", "OUTBOX_CHECK_SECRET_FILE": secret_file}
    )
    assert producer.check_secret == checker.secret == "abc"
    assert "abc" not in repr(checker)


def test_the_producers_topic_names_follow_its_prefix_through_replace_and_pickle() -> None:
    import dataclasses
    import pickle

    settings = OutboxSettings(bootstrap_servers="k:9092", producer_group="orders")
    assert settings.topics is settings.topics  # made once
    assert settings.topics.op == "__outbox-op"
    renamed = dataclasses.replace(settings, topic_prefix="__eu")
    assert renamed.topics.op == "__eu-op" and settings.topics.op == "__outbox-op"
    copied = pickle.loads(pickle.dumps(renamed))
    assert copied == renamed and copied.topics == renamed.topics
    assert {f.name for f in dataclasses.fields(settings)} >= {"topic_prefix"}
    assert "topics" not in {f.name for f in dataclasses.fields(settings)}


def test_the_guarantees_own_kafka_keys_may_be_given_as_they_are() -> None:
    settings = OutboxSettings.from_env(
        {
            "OUTBOX_BOOTSTRAP_SERVERS": "k",
            "OUTBOX_PRODUCER_GROUP": "g",
            "OUTBOX_KAFKA__ACKS": "all",
            "OUTBOX_KAFKA__ENABLE_IDEMPOTENCE": "true",
        }
    )
    assert settings.kafka == {"acks": "all", "enable.idempotence": "true"}
    assert OutboxSettings(
        bootstrap_servers="k", producer_group="g", kafka={"acks": -1, "enable.idempotence": True}
    ).kafka == {"acks": -1, "enable.idempotence": True}
