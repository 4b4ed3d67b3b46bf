"""``python -m bench``: start the services, run the scenarios, write and print the results.

::

    python -m bench                       # everything: 3 runs per configuration (make bench)
    python -m bench --quick               # a smoke run of everything in minutes (make bench-quick)
    python -m bench --scenarios relay,checker --runs 5
    python -m bench --profile producer    # one scenario under pyinstrument

Exit 0 when every scenario ran (whether or not the targets are met: nothing here asserts a
timing), 1 when a scenario could not run (its error is in the JSON), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench import (
    audit_path,
    calibration,
    ceilings,
    charts,
    checker_path,
    end_to_end,
    producer_async,
    producer_path,
    relay_path,
    report,
)
from bench.config import IMPLS, SCENARIOS, BenchConfig
from bench.model import ScenarioResult
from bench.procs import ROOT, Context, render_profiles
from bench.services import Services, start_services
from bench.targets import evaluate

RESULTS = ROOT / "bench" / "results"
Runner = Callable[[Services, BenchConfig, Context], ScenarioResult]
RUNNERS: dict[str, Runner] = {
    "ceilings": ceilings.run,
    "producer": producer_path.run,
    "producer_async": producer_async.run,
    "relay": relay_path.run,
    "end_to_end": end_to_end.run,
    "checker": checker_path.run,
    "audit": audit_path.run,
}
#: Scenarios whose Python work runs in the benchmark's own threads or in child processes that
#: ``--profile`` can put under pyinstrument (the ceilings are other programs).
PROFILABLE = ("producer", "relay", "end_to_end", "checker", "audit")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="smoke run: 1 run, short durations, fewer configs")
    add("--runs", type=int, help="timed runs per configuration after the warm-up (default 3)")
    add("--seconds", type=float, help="length of a time-boxed run (default 10; quick 3)")
    add("--warmup-seconds", type=float, help="length of a time-boxed warm-up (default 3)")
    add("--scenarios", help=f"comma-separated subset of: {', '.join(SCENARIOS)}")
    add("--databases", help="comma-separated: postgresql, sqlite (default both)")
    add("--impls", help=f"comma-separated: {', '.join(IMPLS)} (default all)")
    add("--workers", help="producer-path thread counts, comma-separated (default 1,4,16)")
    add("--messages", help="producer-path messages per transaction (default 1,10)")
    add("--loads", help="end-to-end offered loads, txn/s (default 100,400,1000,5000)")
    add("--e2e-processes", type=int, help="end-to-end generator processes (default 2)")
    add("--relay-records", type=int, help="transactions preloaded per relay run (default 100,000)")
    add("--checker-txns", type=int, help="transactions for the checker (default 10,000)")
    add("--audit-txns", type=int, help="transactions the audit reads (default 1,000,000)")
    add("--poll-interval", type=float, help="baseline B's polling interval, s (default 0.1)")
    add(
        "--e2e-consumer",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting of the end-to-end consumer (repeat); default fetch.wait.max.ms=10",
    )
    add("--profile", choices=PROFILABLE, help="run this one scenario under pyinstrument")
    add("--update-readme", action="store_true", help="rewrite README.md's benchmark section")
    add(
        "--render",
        type=Path,
        metavar="JSON",
        help="start nothing: print, chart (and with --update-readme write) a stored results file",
    )
    add("--results", type=Path, default=RESULTS, help="where results go (default bench/results)")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> BenchConfig:
    config = BenchConfig.quick_mode() if args.quick else BenchConfig()
    changes: dict[str, Any] = {}
    if args.runs is not None:
        changes["runs"] = args.runs
    if args.seconds is not None:
        changes["seconds"] = args.seconds
    if args.warmup_seconds is not None:
        changes["warmup_seconds"] = args.warmup_seconds
    if args.scenarios:
        changes["scenarios"] = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    if args.profile:
        changes["scenarios"] = (args.profile,)
    if args.databases:
        dbs = tuple(d.strip() for d in args.databases.split(",") if d.strip())
        changes["databases"] = dbs
        changes["e2e_databases"] = tuple(d for d in config.e2e_databases if d in dbs) or dbs
    for name in ("impls",):
        if getattr(args, name):
            changes[name] = _names(getattr(args, name))
    for name in ("workers", "messages", "loads"):
        if getattr(args, name):
            changes[name] = tuple(int(v) for v in _names(getattr(args, name)))
    for name in ("relay_records", "checker_txns", "audit_txns", "e2e_processes"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.poll_interval is not None:
        changes["poll_interval_s"] = args.poll_interval
    if args.e2e_consumer:
        if any("=" not in item for item in args.e2e_consumer):
            raise ValueError("--e2e-consumer takes KEY=VALUE")
        changes["e2e_consumer"] = tuple(args.e2e_consumer)
    return replace(config, **changes)


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def run_scenarios(
    services: Services,
    config: BenchConfig,
    ctx: Context,
    profile: str | None,
    speeds: dict[str, list[float]],
) -> tuple[dict[str, ScenarioResult], dict[str, str]]:
    """Each scenario, with the host's Python speed before and after it put in ``speeds``."""
    results: dict[str, ScenarioResult] = {}
    errors: dict[str, str] = {}
    for name in config.scenarios:
        speeds[name] = [round(calibration.python_speed(), 2)]
        print(f"== {name} (Python speed {speeds[name][0]} M steps/s)", flush=True)
        began = time.monotonic()
        try:
            if name == "producer" and profile:
                results[name] = producer_path.run(services, config, ctx, profile=True)
            else:
                results[name] = RUNNERS[name](services, config, ctx)
        except Exception:  # one scenario failing must not lose the others' figures
            errors[name] = traceback.format_exc()
            print(f"!! {name} could not run:\n{errors[name]}", file=sys.stderr, flush=True)
        elapsed = time.monotonic() - began
        speeds[name].append(round(calibration.python_speed(), 2))
        print(f"== {name}: {elapsed:.0f} s (Python speed {speeds[name][1]} M steps/s)", flush=True)
    return results, errors


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = build_config(args)
    except ValueError as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2
    if args.render is not None:
        return rerender(args)
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    ctx = Context(args.results / stamp, profile=args.profile is not None)
    mode = "QUICK (smoke run, not results)" if config.quick else "full"
    print(f"bench {stamp}: {mode}; scenarios {', '.join(config.scenarios)}", flush=True)
    document: dict[str, Any] = {
        "timestamp": stamp,
        "started_at": started.isoformat(),
        "settings": asdict(config),
        "machine": report.machine_info(),
    }
    services = start_services(postgres=config.scenarios != ("audit",))
    try:
        document["services"] = services.describe()
        print(f"services: {report.machine_line(document)}", flush=True)
        speeds: dict[str, list[float]] = {}
        document["python_speed"] = speeds
        results, errors = run_scenarios(services, config, ctx, args.profile, speeds)
    finally:
        services.close()
    return finish(args, config, ctx, document, results, errors)


def rerender(args: argparse.Namespace) -> int:
    """Tables, charts and the README section again from a stored results file."""
    document = json.loads(args.render.read_text())
    results = {
        name: ScenarioResult.from_json(name, data) for name, data in document["scenarios"].items()
    }
    settings: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in document["settings"].items()
        if k in BenchConfig.__dataclass_fields__
    }
    stored = BenchConfig(**settings)
    ctx = Context(args.results / document["timestamp"])
    return publish(args, stored, ctx, document, results, document.get("errors", {}), write=False)


def finish(
    args: argparse.Namespace,
    config: BenchConfig,
    ctx: Context,
    document: dict[str, Any],
    results: dict[str, ScenarioResult],
    errors: dict[str, str],
) -> int:
    document.update(
        {
            "finished_at": dt.datetime.now(dt.UTC).isoformat(),
            "load_average_at_end": report.machine_info()["load_average"],
            "scenarios": {name: r.to_json() for name, r in results.items()},
            "targets": [t.to_json() for t in evaluate(results)],
            "errors": errors,
        }
    )
    return publish(args, config, ctx, document, results, errors, write=True)


def publish(
    args: argparse.Namespace,
    config: BenchConfig,
    ctx: Context,
    document: dict[str, Any],
    results: dict[str, ScenarioResult],
    errors: dict[str, str],
    *,
    write: bool,
) -> int:
    """Write the JSON (unless re-rendering it), the charts, the tables, the README section."""
    targets = evaluate(results)
    json_path = args.results / f"{document['timestamp']}.json"
    if write:
        report.write_json(json_path, document)
    pictures = [p for r in results.values() if (p := charts.render(r, ctx.folder)) is not None]
    profiles = render_profiles(ctx)
    print()
    print(report.render(document, results, targets))
    print(
        f"results: {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path}"
    )
    for path in [*pictures, *profiles, *sorted((ctx.folder / "profile").glob("*-workers.*"))]:
        print(f"  {path}")
    if args.update_readme:
        if config.quick:
            print("README.md not updated: quick-mode figures are not results")
        elif errors:
            print("README.md not updated: a scenario could not run")
        elif report.update_readme(
            ROOT / "README.md", report.readme_block(document, results, targets)
        ):
            print("README.md: benchmark section updated")
        else:
            print(f"README.md has no {report.BEGIN} ... {report.END} section; not updated")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
