"""The speed targets are computed from the rows a run measured, each against the baseline run
beside it; a target whose rows are missing says so instead of passing or failing."""

from __future__ import annotations

from bench.model import Row, ScenarioResult
from bench.stats import Summary
from bench.targets import evaluate, sustained_load


def _e2e(rows: dict[tuple[str, int], tuple[float, float, float]]) -> ScenarioResult:
    """End-to-end rows: (impl, offered) -> (achieved/s, p99 ms, broker cores)."""
    result = ScenarioResult("end_to_end", "e2e", keys=[], columns={})
    for (impl, offered), (achieved, p99, broker) in rows.items():
        metrics = {
            "achieved_per_s": Summary.of([achieved], "txn/s"),
            "p99_ms": Summary.of([p99, p99 + 2, p99 - 2], "ms"),
            "cores_broker": Summary.of([broker], "cores"),
        }
        config = {"impl": impl, "db": "postgresql", "offered_per_s": offered}
        result.rows.append(Row(config, metrics))
    return result


def test_end_to_end_targets_compare_ours_with_b_at_the_same_loads() -> None:
    results = {
        "end_to_end": _e2e(
            {
                ("ours", 100): (100, 30, 0.5),
                ("baseline_b", 100): (100, 120, 0.1),
                ("ours", 400): (396, 60, 0.9),
                ("baseline_b", 400): (390, 150, 0.2),
                ("ours", 1000): (700, 400, 1.0),  # not sustained: the shared rate is 400
                ("baseline_b", 1000): (990, 160, 0.3),
            }
        )
    }
    assert sustained_load(results, "postgresql") == 400
    by_goal = {t.name: t for t in evaluate(results)}
    p99 = by_goal["end to end p99"]
    assert (p99.value, p99.met) == (30, True)
    vs_b = by_goal["end to end vs B"]
    assert vs_b.value == 30 / 120 and vs_b.met is True
    broker = by_goal["broker CPU vs B"]
    assert broker.value is not None and abs(broker.value - 5.0) < 1e-9  # 0.5/100 vs 0.1/100
    assert broker.met is False
    shared = by_goal["end to end at a shared rate vs B"]
    assert shared.value == 60 / 150 and shared.met is True and "400" in shared.note


def test_targets_without_their_rows_are_not_measured_rather_than_met() -> None:
    targets = evaluate({})
    assert targets and all(t.met is None and t.measured == "not measured" for t in targets)
    assert sustained_load({}, "postgresql") is None


def test_the_producer_and_relay_targets_are_ratios_to_the_baseline_of_the_same_run() -> None:
    producer = ScenarioResult("producer", "p", keys=[], columns={})
    for impl, db, workers, rate, p50 in [
        ("ours", "postgresql", 16, 900, 9.0),
        ("baseline_a", "postgresql", 16, 1000, 8.0),
        ("ours", "postgresql", 1, 400, 2.0),
        ("baseline_a", "postgresql", 1, 420, 2.5),
    ]:
        metrics = {"txn_per_s": Summary.of([rate], "txn/s"), "p50_ms": Summary.of([p50], "ms")}
        producer.rows.append(
            Row({"impl": impl, "db": db, "workers": workers, "messages": 1}, metrics)
        )
    relay = ScenarioResult("relay", "r", keys=[], columns={})
    for config, rate in [
        ({"impl": "ours", "db": "-", "relays": 1}, 26_000),
        ({"impl": "baseline_b", "db": "postgresql", "relays": 1}, 20_000),
        ({"impl": "baseline_b", "db": "sqlite", "relays": 1}, 1_000),  # not the one compared
        ({"impl": "protocol_floor", "db": "-", "relays": 1}, 30_000),
        ({"impl": "protocol_floor_jvm", "db": "-", "relays": 1}, 45_000),
    ]:
        relay.rows.append(Row(config, {"promotions_per_s": Summary.of([rate], "records/s")}))
    by_goal = {t.name: t for t in evaluate({"producer": producer, "relay": relay})}
    assert by_goal["producer vs A, PostgreSQL"].value == 0.9
    assert by_goal["producer vs A, PostgreSQL"].met is True
    assert by_goal["producer vs A, SQLite"].met is None
    assert by_goal["producer p50 vs A, PostgreSQL"].value == 0.8
    assert by_goal["producer p50 vs A, PostgreSQL"].met is True
    assert by_goal["one relay vs B"].value == 1.3 and by_goal["one relay vs B"].met is True
    # the relay's Kafka work alone, measured beside them, noted against the same B
    assert by_goal["one relay vs B"].note.endswith(": 1.50x B in Python, 2.25x B on the JVM")
    relay.rows = [r for r in relay.rows if r.config["impl"] != "protocol_floor_jvm"]
    alone = {t.name: t for t in evaluate({"relay": relay})}["one relay vs B"]
    assert alone.note.endswith(": 1.50x B in Python")  # no JDK: the JVM floor was not run
    assert by_goal["two relays"].note == ""


def test_the_protocol_floor_measured_beside_them_is_noted_on_the_producer_targets() -> None:
    producer = ScenarioResult("producer", "p", keys=[], columns={})
    for impl, rate, p50 in [
        ("ours", 600, 2.2),
        ("protocol_floor", 720, 2.1),
        ("baseline_a", 1000, 2.0),
    ]:
        metrics = {"txn_per_s": Summary.of([rate], "txn/s"), "p50_ms": Summary.of([p50], "ms")}
        for workers in (1, 16):
            config = {"impl": impl, "db": "postgresql", "workers": workers, "messages": 1}
            producer.rows.append(Row(config, metrics))
    asyncio = ScenarioResult("producer_async", "a", keys=[], columns={})
    for impl, rate in [("ours", 500), ("protocol_floor", 810), ("baseline_a", 1000)]:
        config = {"impl": impl, "db": "postgresql", "tasks": 16}
        asyncio.rows.append(Row(config, {"txn_per_s": Summary.of([rate], "txn/s")}))
    by_goal = {t.name: t for t in evaluate({"producer": producer, "producer_async": asyncio})}
    assert by_goal["asyncio producer vs A"].value == 0.5
    assert by_goal["asyncio producer vs A"].note.endswith(": 0.81x A")
    assert by_goal["producer vs A, PostgreSQL"].note.endswith(": 0.72x A")
    assert by_goal["producer p50 vs A, PostgreSQL"].note.endswith(": 1.05x A")
    assert by_goal["producer vs A, SQLite"].note == ""  # no floor measured there


def test_interleaved_rounds_give_the_spread_of_each_rounds_own_ratio() -> None:
    """Ours and A measured round by round (bench.model.repeat_interleaved): the spread is the
    rounds' own ratios, which a host that slows down for everyone does not widen; runs measured
    one impl after another keep the old spread (ours' min-max over A's median)."""
    # the host sped up from round to round, for both alike
    ours_runs, a_runs = [161.0, 242.0, 334.0], [230.0, 330.0, 470.0]

    def results(interleaved: bool) -> dict[str, ScenarioResult]:
        producer = ScenarioResult("producer", "p", keys=[], columns={})
        asyncio = ScenarioResult("producer_async", "a", keys=[], columns={})
        info = {"interleaved": True} if interleaved else {}
        for impl, runs in (("ours", ours_runs), ("baseline_a", a_runs)):
            metrics = {"txn_per_s": Summary.of(runs, "txn/s")}
            config = {"impl": impl, "db": "postgresql", "workers": 16, "messages": 1}
            producer.rows.append(Row(config, metrics, dict(info)))
            config = {"impl": impl, "db": "postgresql", "tasks": 16}
            asyncio.rows.append(Row(config, metrics, dict(info)))
        return {"producer": producer, "producer_async": asyncio}

    for name in ("producer vs A, PostgreSQL", "asyncio producer vs A"):
        paired = {t.name: t for t in evaluate(results(True))}[name]
        assert paired.value == 242 / 330
        assert paired.spread == "0.70-0.73x by round"  # 161/230, 242/330, 334/470
        apart = {t.name: t for t in evaluate(results(False))}[name]
        assert apart.value == 242 / 330
        assert apart.spread == "0.49-1.01x"  # 161/330 .. 334/330


def _audit_rows(*rows: tuple[int, int | None, list[float]]) -> ScenarioResult:
    """Audit rows: (transactions, java, wall seconds of each run)."""
    result = ScenarioResult("audit", "a", keys=[], columns={})
    for transactions, java, walls in rows:
        config = {"transactions": transactions, "master": "local[2]"}
        if java is not None:
            config["java"] = java
        result.rows.append(Row(config, {"audit_s": Summary.of(walls, "s")}))
    return result


def test_each_java_the_audit_ran_on_is_a_target_of_its_own() -> None:
    results = {"audit": _audit_rows((1_000_000, 17, [84.4, 86.6, 83.0]), (1_000_000, 25, [69.0]))}
    audits = [t for t in evaluate(results) if t.name == "audit"]
    assert [(t.goal, t.value, t.met) for t in audits] == [
        ("audit of 1,000,000 transactions on local[2], Java 17: <= 70 s", 84.4, False),
        ("audit of 1,000,000 transactions on local[2], Java 25: <= 70 s", 69.0, True),
    ]


def test_an_audit_of_fewer_transactions_is_not_judged_and_a_row_without_java_still_is() -> None:
    small = evaluate({"audit": _audit_rows((20_000, 17, [30.0]))})
    (target,) = [t for t in small if t.name == "audit"]
    assert target.met is None and "20,000" in target.note
    older = evaluate({"audit": _audit_rows((1_000_000, None, [75.0]))})
    (target,) = [t for t in older if t.name == "audit"]
    assert target.goal == "audit of 1,000,000 transactions on local[2]: <= 70 s"
    assert target.met is False
