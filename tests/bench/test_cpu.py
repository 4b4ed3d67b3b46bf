"""bench/cpu.py reads real /proc figures: a busy loop shows up in its role, a role with no
process is NaN (never 0), and the broker is found by the main class on its command line."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from bench.cpu import CpuMeter, cpu_seconds, kafka_brokers

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_busy_role_is_charged_its_cpu_and_an_empty_role_is_nan() -> None:
    meter = CpuMeter({"me": lambda: [os.getpid()], "nobody": list})
    meter.start()
    started = time.monotonic()
    _spin(0.3)
    wall = time.monotonic() - started
    cores = meter.stop()
    # 0.3 CPU-s were spent in this process; ticks are 10 ms, the wall includes waits
    assert cores["me"] == pytest.approx(0.3 / wall, abs=0.1)
    assert math.isnan(cores["nobody"])
    assert cores["busy"] >= cores["me"] - 0.1


def test_a_broker_is_found_by_its_main_class_and_a_gone_process_reads_none() -> None:
    fake = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "kafka.Kafka", "server.properties"]
    )
    try:
        deadline = time.monotonic() + 10
        while fake.pid not in kafka_brokers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.pid in kafka_brokers()
        assert os.getpid() not in kafka_brokers()
    finally:
        fake.kill()
        fake.wait()
    assert cpu_seconds(fake.pid) is None
