#!/usr/bin/env bash
# The audit on a Spark standalone cluster, driver here (client mode), with the Kafka source and
# the PostgreSQL driver from the project's Maven cache (`make jars` -> .cache/jvm/spark).
#
#   SPARK_MASTER=spark://spark-master:7077 deploy/spark/submit-standalone.sh \
#       --bootstrap-servers kafka:9092 --from now-2h --to now-1h \
#       --jdbc-url jdbc:postgresql://db:5432/orders --jdbc-user audit --jdbc-password-env PGPASSWORD \
#       --out /reports/$(date +%F-%H) --parquet-dir hdfs:///outbox/audit/$(date +%F-%H)
#
# Needs: spark-submit of the cluster's Spark version (= the pinned pyspark, 4.2.0) on PATH, and
# `pip install 'kafka-outbox[audit]'` in the Python that PYSPARK_PYTHON names. Exit code: the
# audit's (0 clean, 1 violations, 2 usage, 3 could not run).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
jars_dir="${JARS_DIR:-$here/../../.cache/jvm/spark}"
jars="$(ls "$jars_dir"/*.jar | paste -sd, -)"
exec spark-submit \
  --master "${SPARK_MASTER:?set SPARK_MASTER, e.g. spark://spark-master:7077}" \
  --deploy-mode client \
  --name kafka-outbox-audit \
  --jars "$jars" \
  --conf spark.sql.shuffle.partitions="${SHUFFLE_PARTITIONS:-64}" \
  --conf spark.executor.memory="${EXECUTOR_MEMORY:-4g}" \
  --conf spark.ui.showConsoleProgress=false \
  --conf spark.sql.execution.useObjectHashAggregateExec=false \
  --conf spark.sql.inMemoryColumnarStorage.compressed=false \
  "$here/audit_job.py" "$@"
