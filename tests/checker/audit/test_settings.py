"""Audit settings: RocketMQ 5 defaults for the window, validation before Spark starts."""

from __future__ import annotations

import pytest

from checker.audit.bounds import AtTime, Earliest, Latest
from checker.audit.errors import AuditConfigError
from checker.audit.settings import AuditSettings
from outbox.errors import ConfigurationError


def test_the_default_window_is_the_checkers_full_check_window() -> None:
    settings = AuditSettings(bootstrap_servers="k:9092")
    assert settings.window_ms == (6 + 15 * 30) * 1000
    assert settings.grace_ms == 60_000
    assert settings.lookback_ms == settings.window_ms + settings.grace_ms


def test_the_window_follows_the_checker_settings_unless_given() -> None:
    derived = AuditSettings(
        bootstrap_servers="k", transaction_timeout_s=1, check_interval_s=2, check_max=3
    )
    assert derived.window_ms == 7000
    assert AuditSettings(bootstrap_servers="k", window_s=9).window_ms == 9000


def test_resolve_fixes_now_in_the_bounds_and_the_clock() -> None:
    settings = AuditSettings(bootstrap_servers="k", start="now-10s", as_of="now+1s")
    resolved = settings.resolve(now_ms=100_000)
    assert resolved.start == AtTime(90_000)
    assert resolved.end == Latest()
    assert resolved.as_of_ms == 101_000
    assert AuditSettings(bootstrap_servers="k").resolve(now_ms=5).start == Earliest()


@pytest.mark.parametrize(
    "bad",
    [
        {"bootstrap_servers": ""},
        {"bootstrap_servers": "k", "start": "tomorrow"},
        {"bootstrap_servers": "k", "start": "latest"},
        {"bootstrap_servers": "k", "grace_s": -1},
        {"bootstrap_servers": "k", "check_max": 0},
    ],
)
def test_bad_settings_are_refused_at_construction(bad: dict) -> None:
    with pytest.raises(AuditConfigError):
        AuditSettings(**bad)


def test_settings_come_from_outbox_audit_variables() -> None:
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": "shared:9092",
        "OUTBOX_AUDIT_GRACE_S": "5",
        "OUTBOX_AUDIT_REAL_TOPICS": "orders,payments",
        "OUTBOX_AUDIT_KAFKA__SECURITY_PROTOCOL": "SSL",
    }
    settings = AuditSettings.from_env(env)
    assert settings.bootstrap_servers == "shared:9092"
    assert settings.grace_ms == 5000
    assert settings.real_topics == ("orders", "payments")
    assert settings.kafka == {"security.protocol": "SSL"}


def test_a_missing_bootstrap_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="BOOTSTRAP_SERVERS"):
        AuditSettings.from_env({})
