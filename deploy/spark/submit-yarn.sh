#!/usr/bin/env bash
# The audit on YARN, driver here (client mode). The Kafka source and the PostgreSQL driver come
# from a Maven repository the cluster reaches (--packages); where it reaches none, use
# submit-standalone.sh's --jars from the project's Maven cache instead.
#
#   deploy/spark/submit-yarn.sh --bootstrap-servers kafka:9092 --from now-2h --to now-1h \
#       --out /reports/$(date +%F-%H) --parquet-dir hdfs:///outbox/audit/$(date +%F-%H)
#
# Needs: HADOOP_CONF_DIR (or YARN_CONF_DIR), spark-submit 4.2.0, and `pip install
# 'kafka-outbox[audit]'` for the driver's Python. Executors run no Python code of the project.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
spark_version="${SPARK_VERSION:-4.2.0}"      # must equal the pinned pyspark
postgresql_version="${POSTGRESQL_VERSION:-42.7.8}"
exec spark-submit \
  --master yarn \
  --deploy-mode client \
  --name kafka-outbox-audit \
  --packages "org.apache.spark:spark-sql-kafka-0-10_2.13:${spark_version},org.postgresql:postgresql:${postgresql_version}" \
  --num-executors "${EXECUTORS:-4}" \
  --executor-cores "${EXECUTOR_CORES:-2}" \
  --executor-memory "${EXECUTOR_MEMORY:-4g}" \
  --conf spark.sql.shuffle.partitions="${SHUFFLE_PARTITIONS:-64}" \
  --conf spark.ui.showConsoleProgress=false \
  --conf spark.sql.execution.useObjectHashAggregateExec=false \
  --conf spark.sql.inMemoryColumnarStorage.compressed=false \
  "$here/audit_job.py" "$@"
