"""Spark batch audit jobs: did the outbox keep its promise? Checked from the topics themselves.

The audit reads the half, op and real topics (and optionally the producers' evidence tables)
with Spark, independently of the relay's and checker's code, and reports Jepsen-style findings:
lost, phantom, duplicate, partial, stuck, out of order, given up, conflicting decisions, and
evidence/op mismatches, plus counts and latency distributions. See docs/audit.md.

Entry points: ``python -m checker.audit`` (also for ``spark-submit``),
:func:`checker.audit.cli.main` (the ``kafka-outbox audit`` subcommand),
:func:`checker.audit.job.run_audit` on a SparkSession, and the pure functions on DataFrames in
:mod:`checker.audit.findings`.

Importing this package, its ``cli`` or its ``settings`` does not import pyspark: a CLI that only
prints ``--help`` or a producer application never pays for Spark.
"""

from __future__ import annotations
