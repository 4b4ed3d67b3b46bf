"""``make bench``: what the outbox's safety costs, measured beside the alternatives.

Run as ``python -m bench`` from the checkout (it is not installed). It starts its own Kafka and
PostgreSQL through :mod:`outbox.testing`, runs each scenario after a warm-up, repeats it, and
writes ``bench/results/<UTC timestamp>.json``, one PNG chart per scenario and a printed table.
No timing is ever asserted: the figures are reported, and each target of issue 8 is marked met
or not from what was measured in the same run.

Scenarios (one module each): :mod:`bench.producer_path`, :mod:`bench.relay_path`,
:mod:`bench.end_to_end`, :mod:`bench.checker_path`, :mod:`bench.audit_path`,
:mod:`bench.ceilings`. The alternatives users compare us with are in :mod:`bench.baselines`
(A and B) and :mod:`bench.baseline_c` with :mod:`bench.connect_worker` (C, Debezium's outbox).
"""
