"""Sending each check to what can answer it: the evidence table or the group's listener.

A producer writes on its half records what answers their checks (``outbox-check-by``): nothing
for the decorator and context-manager forms, whose evidence row is in the commit, and
``listener`` for ``TransactionalProducer``, whose local work leaves no row. Asking the evidence
table about a listener transaction would fence it and answer ROLLBACK for work that committed,
so the router never does: with no listener registered here, or a ``check_by`` this version does
not know, the answer is UNKNOWN (and the check is repeated).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from outbox.checks.async_resolver import AsyncFencedResolver
from outbox.checks.resolver import Resolver, State
from outbox.errors import ConfigurationError, ForkedWithLockHeldError
from outbox.fetch import HalfFetcher
from outbox.forking import PerProcess
from outbox.logs import fields
from outbox.protocol.check import CheckedTransaction
from outbox.protocol.states import CheckBy

log = logging.getLogger("outbox.checks")

#: What answers evidence checks: a synchronous resolver, or the asyncio one.
AnyResolver = Resolver | AsyncFencedResolver


class CheckRouter:
    """A resolver that hands each check to the evidence resolver or the listener's.

    Args:
        evidence: answers ``check_by=evidence`` checks (the fenced resolver, or the user's own);
            None answers them UNKNOWN.
        listener: returns the group's listener resolver at the time of the check (the
            ``TransactionalProducer`` may be created after the endpoint starts), or None.
        values: reads back a half value the checker left out of the request (too large).
    """

    def __init__(
        self,
        evidence: AnyResolver | None,
        listener: Callable[[], Resolver | None],
        values: OmittedValues | None = None,
    ) -> None:
        self.evidence = evidence
        self.listener = listener
        self.values = values

    def resolve(self, checks: Sequence[CheckedTransaction]) -> dict[str, State]:
        answers, parts = self._split(checks)
        for resolver, part in parts:
            if isinstance(resolver, AsyncFencedResolver):
                raise ConfigurationError(
                    "an AsyncFencedResolver answers on its application's event loop: serve it "
                    "with producer.check_app(...) (ASGI), not the threaded serve_checks()"
                )
            answers |= resolver.resolve(self._complete(resolver, part))
        return answers

    async def resolve_async(self, checks: Sequence[CheckedTransaction]) -> dict[str, State]:
        """:meth:`resolve` from an event loop: an asyncio resolver is awaited, everything that
        blocks (a synchronous resolver, the listener, reading back omitted values) runs in a
        worker thread."""
        answers, parts = self._split(checks)
        for resolver, part in parts:
            if isinstance(resolver, AsyncFencedResolver):
                answers |= await resolver.resolve(part)
            else:
                answers |= await asyncio.to_thread(self._resolve_blocking, resolver, part)
        return answers

    def _split(
        self, checks: Sequence[CheckedTransaction]
    ) -> tuple[dict[str, State], list[tuple[AnyResolver, list[CheckedTransaction]]]]:
        """Answers known without asking (UNKNOWN), and each answerer with its checks."""
        by_evidence = [c for c in checks if c.check_by == CheckBy.EVIDENCE]
        by_listener = [c for c in checks if c.check_by == CheckBy.LISTENER]
        answers = {c.txn_id: State.UNKNOWN for c in checks if c.check_by not in tuple(CheckBy)}
        for txn_id in answers:
            log.error(
                "the check of %s names an answerer this version does not know",
                txn_id,
                extra=fields(txn_id=txn_id),
            )
        parts: list[tuple[AnyResolver, list[CheckedTransaction]]] = []
        for resolver, part, missing in (
            (self.evidence, by_evidence, "no evidence resolver (engine=)"),
            (
                self.listener(),
                by_listener,
                "no TransactionListener here: create the TransactionalProducer in every "
                "process of the group that serves checks",
            ),
        ):
            if not part:
                continue
            if resolver is None:
                log.error("%d checks answered UNKNOWN: %s", len(part), missing)
                answers |= {c.txn_id: State.UNKNOWN for c in part}
            else:
                parts.append((resolver, part))
        return answers, parts

    def close(self) -> None:
        if self.values is not None:
            self.values.close()

    def _resolve_blocking(
        self, resolver: Resolver, checks: list[CheckedTransaction]
    ) -> dict[str, State]:
        return resolver.resolve(self._complete(resolver, checks))

    def _complete(
        self, resolver: Resolver, checks: list[CheckedTransaction]
    ) -> list[CheckedTransaction]:
        if self.values is not None and getattr(resolver, "needs_messages", True):
            return [self.values.complete(c) for c in checks]
        return checks


class OmittedValues:
    """Reads back, from the half topic, the values the checker left out of a request."""

    def __init__(self, config: dict[str, Any], half_topic: str) -> None:
        self.config = config
        self.half_topic = half_topic
        # each process reads with a Kafka consumer of its own (:mod:`outbox.forking`)
        self._reading = PerProcess(_Reading, None)

    def complete(self, check: CheckedTransaction) -> CheckedTransaction:
        """``check`` with its value, or unchanged (still omitted) when it cannot be read."""
        half = check.half
        if not check.value_omitted or half is None:
            return check
        reading = self._reading.get()
        try:
            with reading.lock:
                if reading.fetcher is None:
                    reading.fetcher = HalfFetcher(self.config, self.half_topic, timeout_s=5.0)
                found = reading.fetcher.fetch(half.partition, [half.original_offset], check.txn_id)
        except ForkedWithLockHeldError:  # this process can never read it: its error, not "gone"
            raise
        except Exception:
            log.exception(
                "reading back the half value of %s failed",
                check.txn_id,
                extra=fields(txn_id=check.txn_id, partition=half.partition),
            )
            return check
        record = next((r for r in found or () if r.index == half.index), None)
        if record is None:
            log.error(
                "the half value of %s is not at %s[%d] offset %d any more",
                check.txn_id,
                self.half_topic,
                half.partition,
                half.original_offset,
                extra=fields(
                    txn_id=check.txn_id,
                    topic=self.half_topic,
                    partition=half.partition,
                    offset=half.original_offset,
                ),
            )
            return check
        return replace(check, half=replace(half, message=record.message), value_omitted=False)

    def close(self) -> None:
        """Close this process's reader (a forked child's inherited one is not its own)."""
        reading = self._reading.made_here()
        if reading is None:  # inherited: never closed here (:mod:`outbox.forking`)
            return
        with reading.lock:
            if reading.fetcher is not None:
                reading.fetcher.close()
                reading.fetcher = None


class _Reading:
    """One process's reader of the half topic, made on its first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fetcher: HalfFetcher | None = None
