"""The CLI's usage errors exit 2 before Spark starts; importing it does not import Spark."""

from __future__ import annotations

import subprocess
import sys

import pytest

from checker.audit.cli import EXIT_UNAVAILABLE, EXIT_USAGE, build_parser, main, print_summary


@pytest.fixture(autouse=True)
def _no_audit_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OUTBOX_BOOTSTRAP_SERVERS",
        "OUTBOX_AUDIT_BOOTSTRAP_SERVERS",
        "OUTBOX_CONFIG_FILE",
    ):
        monkeypatch.delenv(name, raising=False)


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--from" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "BOOTSTRAP_SERVERS"),
        (["--bootstrap-servers", "k:1", "--from", "tomorrow"], "--from"),
        (["--bootstrap-servers", "k:1", "--grace", "soon"], "--grace"),
        (["--bootstrap-servers", "k:1", "--kafka-option", "nokey"], "KEY=VALUE"),
        (["--bootstrap-servers", "k:1", "--to", "earliest"], "--to earliest"),
        (["--bootstrap-servers", "k:1", "--jdbc-password-env", "NO_SUCH_VARIABLE_X"], "not set"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_an_unknown_option_is_argparse_usage_error() -> None:
    assert main(["--no-such-option"]) == EXIT_USAGE


def test_missing_spark_jars_exit_2_with_the_fix(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    # as in a fresh process, even when another test of the session started Spark already
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    code = main(["--bootstrap-servers", "k:1", "--jars-dir", str(tmp_path), "--out", str(tmp_path)])
    assert code == EXIT_USAGE
    assert "make jars" in capsys.readouterr().err


def test_exit_codes_are_distinct() -> None:
    assert len({0, 1, EXIT_USAGE, EXIT_UNAVAILABLE}) == 4


def test_the_parser_has_the_documented_options() -> None:
    options = {a for action in build_parser()._actions for a in action.option_strings}
    for name in (
        "--from",
        "--to",
        "--bootstrap-servers",
        "--topic-prefix",
        "--grace",
        "--window",
        "--out",
        "--jdbc-url",
        "--master",
    ):
        assert name in options


def test_importing_the_cli_does_not_import_pyspark() -> None:
    code = "import sys, checker.audit.cli; sys.exit(1 if 'pyspark' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


class _FakeSession:
    spark = None
    closed = False

    def close(self) -> None:
        self.closed = True


def _summary(verdict: str) -> dict:
    return {
        "verdict": verdict,
        "violations": 0 if verdict == "clean" else 3,
        "findings": {"lost": {"count": 0 if verdict == "clean" else 3}},
        "statistics": {"transactions": 5, "by_state": {}, "by_decider": {}},
    }


@pytest.mark.parametrize(("verdict", "code"), [("clean", 0), ("violations", 1)])
def test_the_verdict_is_the_exit_code(
    verdict: str, code: int, monkeypatch: pytest.MonkeyPatch, tmp_path, capsys
) -> None:
    import checker.audit.job as job
    import checker.audit.session as session

    fake = _FakeSession()
    monkeypatch.setattr(session, "start_session", lambda **_: fake)
    result = job.AuditResult(summary=_summary(verdict), out_dir=tmp_path)
    monkeypatch.setattr(job, "run_audit", lambda spark, settings: result)

    assert main(["--bootstrap-servers", "k:1", "--out", str(tmp_path)]) == code
    assert fake.closed
    assert str(tmp_path / "report.html") in capsys.readouterr().out


def test_a_failure_mid_run_is_exit_3_never_a_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    import checker.audit.job as job
    import checker.audit.session as session

    def broken(spark, settings):
        raise RuntimeError("executor lost")

    monkeypatch.setattr(session, "start_session", lambda **_: _FakeSession())
    monkeypatch.setattr(job, "run_audit", broken)
    assert main(["--bootstrap-servers", "k:1", "--out", str(tmp_path)]) == EXIT_UNAVAILABLE


def test_the_audit_takes_the_common_flags_of_every_kafka_outbox_command(tmp_path) -> None:
    """--bootstrap-server, --command-config, --config, --timeout and --debug, as the other
    commands (and Kafka's own tools) take them; the older spellings still work."""
    from checker.audit.cli import settings_from

    (tmp_path / "client.properties").write_text(
        "# as for kafka-console-consumer.sh --command-config\n"
        "bootstrap.servers=from-file:9092\n"
        "security.protocol = SSL\n"
        "ssl.ca.location: /etc/ca.pem\n"
    )
    (tmp_path / "outbox.toml").write_text('[audit]\ntopic_prefix = "__from-config"\n')
    args = build_parser().parse_args(
        [
            "--bootstrap-server",
            "flag:9092",
            "--command-config",
            str(tmp_path / "client.properties"),
            "--kafka-option",
            "ssl.ca.location=/etc/other.pem",
            "--timeout",
            "20s",
            "--debug",
        ]
    )
    settings = settings_from(args)
    assert settings.bootstrap_servers == "flag:9092"  # the flag wins over the file's
    assert settings.kafka == {"security.protocol": "SSL", "ssl.ca.location": "/etc/other.pem"}
    assert settings.metadata_timeout_s == 20
    assert args.debug
    from_file = settings_from(
        build_parser().parse_args(["--command-config", str(tmp_path / "client.properties")])
    )
    assert from_file.bootstrap_servers == "from-file:9092"
    old = build_parser().parse_args(["--bootstrap-servers", "k:1", "--metadata-timeout", "3s"])
    assert (old.bootstrap_servers, old.metadata_timeout) == ("k:1", "3s")


def test_the_audit_reads_the_config_file_given_by_flag_and_leaves_the_environment(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    (tmp_path / "outbox.toml").write_text("[audit]\nbootstrap_servers = 7\n")
    assert main(["--config", str(tmp_path / "outbox.toml")]) == EXIT_USAGE
    assert "outbox.toml [audit] bootstrap_servers = 7" in capsys.readouterr().err
    assert "OUTBOX_CONFIG_FILE" not in os.environ


def test_a_command_config_adds_to_the_kafka_settings_of_the_environment(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--command-config`` merges over ``OUTBOX_AUDIT_KAFKA__*`` (as the flag before the command
    does), it does not throw them away; the audit's keys are the Java client's."""
    from checker.audit.cli import settings_from

    (tmp_path / "jaas").write_text('PlainLoginModule required username="a" password="b";\n')
    monkeypatch.setenv("OUTBOX_AUDIT_KAFKA__SASL_JAAS_CONFIG_FILE", str(tmp_path / "jaas"))
    monkeypatch.setenv("OUTBOX_AUDIT_KAFKA__CLIENT_ID", "from-env")
    (tmp_path / "client.properties").write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nclient.id=from-file\n"
    )
    args = build_parser().parse_args(
        ["--bootstrap-server", "k:1", "--command-config", str(tmp_path / "client.properties")]
    )
    assert settings_from(args).kafka == {
        "sasl.jaas.config": 'PlainLoginModule required username="a" password="b";',
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "client.id": "from-file",
    }


def test_what_retention_left_unjudged_is_printed_under_the_findings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    summary = {
        "statistics": {
            "transactions": 5,
            "by_state": {},
            "by_decider": {},
            "commits_unverifiable": 2,
            "records_unverifiable": 0,
        },
        "findings": {"lost": {"count": 0}},
        "parameters": {"retention_unknown": "the topics' settings could not be read: denied"},
    }
    print_summary(summary)
    out = capsys.readouterr().out
    assert "?? commits_unverifiable" in out and "records_unverifiable" not in out
    assert "?? what the topics still hold is unknown: the topics' settings" in out
