"""The watchdog that ends a relay or checker process whose loop stopped turning, driven through
its seams: the watched service and the exit it calls."""

from __future__ import annotations

import threading

from outbox.watchdog import EXIT_STUCK, watch


class Service:
    def __init__(self, idle: float) -> None:
        self.closed = threading.Event()
        self.idle = idle

    def idle_s(self) -> float:
        return self.idle


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


def test_a_loop_idle_past_the_limit_ends_the_process_with_code_3() -> None:
    exits = Exits()
    thread = watch(Service(idle=31.0), limit_s=30, every_s=0.01, name="checker", exit=exits)
    assert exits.called.wait(5)
    thread.join(5)
    assert exits.codes == [EXIT_STUCK] == [3]


def test_a_turning_loop_and_a_closed_service_are_left_alone() -> None:
    exits = Exits()
    service = Service(idle=29.0)
    thread = watch(service, limit_s=30, every_s=0.01, name="relay", exit=exits)
    assert not exits.called.wait(0.3)
    service.closed.set()  # closed on purpose: the watchdog stops, whatever comes next
    thread.join(5)
    assert not thread.is_alive()
    service.idle = 600.0
    assert not exits.called.wait(0.1)
    assert exits.codes == []
