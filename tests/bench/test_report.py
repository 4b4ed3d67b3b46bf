"""The benchmark report: the host's Python speed is shown beside the figures it affects."""

from __future__ import annotations

from typing import Any

from bench import calibration, report


def _document(**extra: Any) -> dict[str, Any]:
    return {
        "timestamp": "20261124T000000Z",
        "settings": {"quick": False, "runs": 3},
        "machine": {
            "cores": 2,
            "cpu": "cpu",
            "memory_gib": 1.0,
            "os": "os",
            "python": "3.11",
            "git_commit": "0123456789abc",
            "git_dirty": False,
        },
        "services": {"kafka": {"version": "4.2.1", "provider": "local"}, "sqlite": {}},
        **extra,
    }


def test_the_python_speed_before_and_after_each_scenario_is_printed_and_in_the_readme() -> None:
    document = _document(python_speed={"relay": [0.93, 0.71], "checker": [0.9, 0.92]})
    line = "relay 0.93 -> 0.71, checker 0.9 -> 0.92"
    assert line in report.render(document, {}, [])
    block = report.readme_block(document, {}, [])
    assert f"{line}." in block
    assert "\n\nPython speed" in block  # a paragraph of its own, not run into the machine line


def test_a_results_file_from_before_the_probe_renders_without_it() -> None:
    for document in (_document(), _document(python_speed={})):
        assert report.speed_line(document) is None
        assert "Python speed" not in report.render(document, {}, [])


def test_the_probe_reports_million_steps_per_second_of_its_fixed_workload() -> None:
    speed = calibration.python_speed(steps=20_000, repeats=3)
    assert 0.001 < speed < 1_000  # M steps/s: a steps/s figure would be a million times this
    assert calibration._workload(10) == sum(int(str(i)) + len(str(i)) for i in range(10)) + 10
