"""The settings of a Spark session the audit starts itself."""

from __future__ import annotations

from checker.audit.session import GIB, driver_memory, local_defaults, merge_settings


def test_the_driver_heap_is_a_quarter_of_the_machine_between_1_and_4_gib() -> None:
    assert driver_memory(24 * GIB) == "4g"
    assert driver_memory(8 * GIB) == "2g"
    assert driver_memory(2 * GIB) == "1g"
    assert driver_memory(None) == "1g"


def test_local_sessions_use_the_measured_plan_and_heap_settings() -> None:
    settings = local_defaults()
    assert settings["spark.sql.execution.useObjectHashAggregateExec"] == "false"
    assert settings["spark.sql.inMemoryColumnarStorage.compressed"] == "false"
    assert settings["spark.driver.memory"].endswith("g")
    assert "-XX:+UseParallelGC" in settings["spark.driver.extraJavaOptions"]
    assert "log4j2.configurationFile" in settings["spark.driver.extraJavaOptions"]
    assert settings["spark.ui.enabled"] == "false"  # a user's --conf brings it back


def test_a_user_can_have_the_web_ui_back() -> None:
    merged = merge_settings(local_defaults(), {"spark.ui.enabled": "true"})
    assert merged["spark.ui.enabled"] == "true"


JAVA = "spark.driver.extraJavaOptions"
DEFAULTS = {JAVA: "-Dlog4j2.configurationFile=/tmp/x -XX:+UseParallelGC", "spark.a": "1"}


def test_a_users_java_options_are_added_to_the_audits_own() -> None:
    merged = merge_settings(DEFAULTS, {JAVA: "-XX:StartFlightRecording=filename=a.jfr"})
    assert merged[JAVA] == (
        "-Dlog4j2.configurationFile=/tmp/x -XX:+UseParallelGC "
        "-XX:StartFlightRecording=filename=a.jfr"
    )
    assert merged["spark.a"] == "1"


def test_a_users_collector_replaces_the_audits_since_the_jvm_refuses_two() -> None:
    merged = merge_settings(DEFAULTS, {JAVA: "-XX:+UseG1GC -Xss4m"})
    assert merged[JAVA] == "-Dlog4j2.configurationFile=/tmp/x -XX:+UseG1GC -Xss4m"


def test_other_user_settings_replace_the_defaults() -> None:
    merged = merge_settings(DEFAULTS, {"spark.a": "2", "spark.b": "3"})
    assert merged == {**DEFAULTS, "spark.a": "2", "spark.b": "3"}
