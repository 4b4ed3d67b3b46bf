#!/usr/bin/env bash
# The audit on a Spark standalone cluster, driver here (client mode), with the Kafka source and
# the PostgreSQL driver from the project's Maven cache (`make jars` -> .cache/jvm/spark).
#
#   SPARK_MASTER=spark://spark-master:7077 PYSPARK_PYTHON=/opt/audit/.venv/bin/python \
#     deploy/spark/submit-standalone.sh \
#       --bootstrap-servers kafka:9092 --from now-2h --to now-1h \
#       --jdbc-url jdbc:postgresql://db:5432/orders --jdbc-user audit --jdbc-password-env PGPASSWORD \
#       --out /reports/$(date +%F-%H) --parquet-dir hdfs:///outbox/audit/$(date +%F-%H)
#
# Needs: spark-submit of the cluster's Spark version (= the pinned pyspark, 4.2.0) on PATH (the
# venv's bin/ has pyspark's), and `pip install 'kafka-outbox[audit]'` in the Python that
# PYSPARK_PYTHON (or PYSPARK_DRIVER_PYTHON) names; unset, spark-submit runs `python3` from PATH.
# Settings (environment): SPARK_MASTER (required), JARS_DIR (.cache/jvm/spark),
# EXECUTOR_MEMORY (4g), EXECUTOR_CORES and TOTAL_EXECUTOR_CORES (unset: every free core of
# each worker), SHUFFLE_PARTITIONS (64). docs/audit-on-a-cluster.md has the sizing.
# Exit code: the audit's (0 clean, 1 violations, 2 usage or configuration, including a missing
# spark-submit, jar or package, 3 could not run). spark-submit's own failures before the audit
# starts (a bad setting above) exit 1 without the audit's "audit VIOLATIONS" line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
jars_dir="${JARS_DIR:-$here/../../.cache/jvm/spark}"
if [[ -z "${SPARK_MASTER:-}" ]]; then
  echo "audit: set SPARK_MASTER, e.g. spark://spark-master:7077" >&2
  exit 2
fi
if ! compgen -G "$jars_dir/spark-sql-kafka-*.jar" >/dev/null; then
  echo "audit: no spark-sql-kafka jar in $jars_dir: run \`make jars\` or set JARS_DIR" >&2
  exit 2
fi
if ! command -v spark-submit >/dev/null; then
  echo "audit: no spark-submit on PATH: put Spark 4.2.0's bin/ (or the audit venv's) on it" >&2
  exit 2
fi
jars="$(printf '%s\n' "$jars_dir"/*.jar | paste -sd, -)"
cores=()
[[ -n "${EXECUTOR_CORES:-}" ]] && cores+=(--executor-cores "$EXECUTOR_CORES")
[[ -n "${TOTAL_EXECUTOR_CORES:-}" ]] && cores+=(--total-executor-cores "$TOTAL_EXECUTOR_CORES")
exec spark-submit \
  --master "$SPARK_MASTER" \
  --deploy-mode client \
  --name kafka-outbox-audit \
  --jars "$jars" \
  ${cores[@]+"${cores[@]}"} \
  --conf spark.sql.shuffle.partitions="${SHUFFLE_PARTITIONS:-64}" \
  --conf spark.executor.memory="${EXECUTOR_MEMORY:-4g}" \
  --conf spark.ui.showConsoleProgress=false \
  --conf spark.sql.execution.useObjectHashAggregateExec=false \
  --conf spark.sql.inMemoryColumnarStorage.compressed=false \
  "$here/audit_job.py" "$@"
