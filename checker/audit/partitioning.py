"""How the audit lays its data out: hash-partitioned by transaction id.

Every step after reading groups, windows or joins by ``txn_id``. When the cached sources and
the cached ledger are hash-partitioned by ``txn_id`` into the same number of parts, Spark plans
all of those steps without another shuffle; otherwise each aggregation, window and join shuffles
its input again (per million transactions: 11.8 million rows shuffled before this layout, 6.9
million with it, docs/benchmarks.md).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

#: The column the audit's frames are partitioned by.
KEY = "txn_id"


def by_transaction(frame: DataFrame) -> DataFrame:
    """``frame`` hash-partitioned by ``txn_id`` into ``spark.sql.shuffle.partitions`` parts.

    The count is explicit so that adaptive query execution keeps it (it may merge the parts of
    a repartition without one) and every frame laid out here stays co-partitioned with the
    others. Spark cannot tell that a full outer join on ``txn_id`` keeps this layout (the joined
    key is a ``coalesce`` of both sides'), so the ledger lays its result out again.
    """
    parts = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions") or "200")
    return frame.repartition(parts, KEY)
