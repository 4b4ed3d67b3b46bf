"""The frames one audit caches, released together when it ends.

An audit caches what it reads and the ledger it judges on (each is used by several jobs), and
its findings (each is counted, sampled and written). The CLI's SparkSession ends with its one
audit, but :func:`checker.audit.job.run_audit` runs on any SparkSession: a notebook, a
scheduler's long-lived driver, a test session running audit after audit. Frames left cached
stay in the session's cache manager until it ends - their plans in the driver's heap, their
blocks in the executors' storage - sixteen an audit (nineteen with the evidence table): a 1 GiB
driver ran out of heap some two hundred small audits in. So a run releases what it cached,
whether it returns or fails (``with contextlib.closing(CacheScope()) as scope``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark import StorageLevel
from pyspark.sql import DataFrame

log = logging.getLogger("checker.audit")

#: Caches a frame for the run that reads it (:meth:`CacheScope.cache`).
Cache = Callable[[DataFrame], DataFrame]


class CacheScope:
    """Caches frames for one audit and releases them all at its end (:meth:`close`)."""

    def __init__(self) -> None:
        self._frames: list[DataFrame] = []

    def cache(self, frame: DataFrame) -> DataFrame:
        """``frame`` persisted (memory, spilling to disk), to be released with the scope."""
        persisted = frame.persist(StorageLevel.MEMORY_AND_DISK)
        self._frames.append(persisted)
        return persisted

    def close(self) -> None:
        """Unpersist every frame cached so far, the last cached first (a frame built on an
        earlier one goes before it: nothing is re-planned over a frame already released); their
        blocks are dropped in the background. One that cannot be (the session stopped under
        it) is logged, not raised: the audit's own error, if any, is the one to see."""
        frames, self._frames = self._frames, []
        for frame in reversed(frames):
            try:
                frame.unpersist()
            except Exception as err:  # releasing the rest matters more
                log.warning("could not release a cached frame of the audit: %s", err)
