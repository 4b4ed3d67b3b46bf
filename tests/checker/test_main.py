"""``python -m checker``'s process: the watchdog that ends a checker whose loop is stuck in a
call that never returns (:mod:`outbox.watchdog`), and the limit it uses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from checker.settings import CheckerSettings
from outbox.errors import ConfigurationError
from outbox.watchdog import EXIT_STUCK

#: A checker whose loop hangs (as in librdkafka's send_offsets_to_transaction after a broker
#: restart) and last turned 10 minutes ago, run the way ``python -m checker`` runs it.
STUCK = textwrap.dedent(
    """
    import time
    import checker.__main__ as main
    from checker.settings import CheckerSettings

    def hang(self):
        time.sleep({hang_s})

    main.Checker.run = hang
    main.Checker.idle_s = lambda self: 600.0
    main.run(CheckerSettings(bootstrap_servers="127.0.0.1:9", insecure_local=True, {extra}))
    """
)


def run(extra: str, hang_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", STUCK.format(extra=extra, hang_s=hang_s)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_checker_whose_loop_is_stuck_exits_with_code_3_and_its_stacks() -> None:
    done = run("stuck_exit_s=120")
    assert done.returncode == EXIT_STUCK == 3, done.stderr
    assert "the checker loop has not turned for 600 s" in done.stderr
    assert "in hang" in done.stderr  # the stuck thread's stack says where it hangs


def test_the_watchdog_is_off_with_stuck_exit_s_0() -> None:
    # hung for 12 s: a watchdog that is on looks every 5 s, and exits at its first look (above)
    done = run("stuck_exit_s=0", hang_s=12)
    assert done.returncode == 0, done.stderr
    assert "has not turned" not in done.stderr


def test_the_limit_is_never_shorter_than_the_liveness_limit() -> None:
    # Given request timeouts that let one round wait 3 x 100 s
    slow = CheckerSettings(
        bootstrap_servers="b:9092", insecure_local=True, request_timeout_s=100, stuck_exit_s=120
    )
    # Then the watchdog waits as long as /healthz does, not the shorter stuck_exit_s
    assert slow.liveness_limit_s == 360
    assert slow.stuck_limit_s == 360
    assert CheckerSettings(bootstrap_servers="b:9092", insecure_local=True).stuck_limit_s == 120
    off = CheckerSettings(bootstrap_servers="b:9092", insecure_local=True, stuck_exit_s=0)
    assert off.stuck_limit_s == 0


def test_a_negative_stuck_exit_s_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="stuck_exit_s=-1"):
        CheckerSettings(bootstrap_servers="b:9092", insecure_local=True, stuck_exit_s=-1)
    env = {"OUTBOX_CHECKER_BOOTSTRAP_SERVERS": "b:9092", "OUTBOX_CHECKER_STUCK_EXIT_S": "45"}
    assert CheckerSettings.from_env(env, insecure_local=True).stuck_exit_s == 45
