"""``python -m relay``'s process: the watchdog (a loop stuck in a call that never returns ends
the process) and the garbage collector's thresholds."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from relay.__main__ import EXIT_STUCK, GC_THRESHOLDS

STUCK = textwrap.dedent(
    """
    import threading, time
    from relay.__main__ import watch

    class Stuck:  # a relay whose loop stopped turning 10 minutes ago
        closed = threading.Event()
        def idle_s(self):
            return 600.0

    watch(Stuck(), limit_s=300, every_s=0.05, name="relay")
    time.sleep(30)  # the main thread "hangs"
    """
)

TURNING = textwrap.dedent(
    """
    import threading, time
    from relay.__main__ import watch

    class Turning:
        closed = threading.Event()
        def idle_s(self):
            return 1.0

    relay = Turning()
    watch(relay, limit_s=300, every_s=0.05, name="relay")
    time.sleep(0.5)
    relay.closed.set()
    """
)

RUNS_WITH = textwrap.dedent(
    """
    import gc
    import relay.__main__ as main
    from relay.settings import RelaySettings

    def report(self):  # in place of the loop: what the process runs it with
        print(gc.isenabled(), gc.get_threshold())

    main.Relay.run = report
    main.run(RelaySettings(bootstrap_servers="127.0.0.1:9", stuck_exit_s=0))
    """
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_loop_stuck_past_the_limit_exits_with_code_3_and_says_why() -> None:
    done = run(STUCK)
    assert done.returncode == EXIT_STUCK == 3, done.stderr
    assert "has not turned for 600 s" in done.stderr
    assert "Most recent call first" in done.stderr or "most recent call first" in done.stderr


def test_a_turning_loop_is_left_alone() -> None:
    done = run(TURNING)
    assert done.returncode == 0, done.stderr
    assert "has not turned" not in done.stderr


def test_the_relay_runs_with_the_collector_on_at_its_own_thresholds() -> None:
    done = run(RUNS_WITH)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"True {GC_THRESHOLDS}"
    assert GC_THRESHOLDS[0] > 700  # CPython's own first threshold
