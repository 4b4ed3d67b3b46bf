"""Commit witnesses: the latest transaction this producer committed in each database.

A check's fence is only the truth in the database the transactions write their evidence to: a
check endpoint given another engine (a wrong DSN, the staging database, one shard of several
the producer group writes to) finds no evidence there for a transaction that committed, fences
it, and answers ROLLBACK - and the committed transaction's messages are never delivered.

So each COMMIT that wrote an evidence row records its transaction id here, under the database
it went to. Before it fences, :class:`~outbox.checks.resolver.FencedResolver` looks for these
witnesses' evidence rows in its own database (in the query it makes anyway): one it cannot see
means its database is not (or not the only) one the transactions commit to, and it answers
UNKNOWN instead of fencing, logging what differs. The checker asks again; nothing is decided
from the wrong database.

A process that has committed nothing yet has no witness and fences as before. One witness is
kept per engine URL, for the :data:`MAX_DATABASES` databases most recently committed to.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import OrderedDict

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox.evidence import EVIDENCE_INSERT

log = logging.getLogger("outbox")

#: Databases remembered (the least recently committed to is forgotten first): an application
#: that makes an engine per request must not grow this without bound.
MAX_DATABASES = 16


class CommitWitnesses:
    """The latest committed transaction id per database (engine URL), safe across threads and
    across ``fork()``: a forked child keeps the parent's witnesses (the same databases) but
    takes a lock of its own, as a lock held by another thread at the fork would never be
    released in the child (:mod:`outbox.forking`)."""

    def __init__(self) -> None:
        self._latest: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _held(self) -> threading.Lock:
        if self._pid != os.getpid():  # a forked child: the inherited lock may be held forever
            self._lock, self._pid = threading.Lock(), os.getpid()
        return self._lock

    def committed(self, database: str, txn_id: str) -> None:
        """``txn_id`` committed its evidence row in ``database`` (its COMMIT returned)."""
        with self._held():
            self._latest[database] = txn_id
            self._latest.move_to_end(database)
            while len(self._latest) > MAX_DATABASES:
                self._latest.popitem(last=False)

    def latest(self) -> dict[str, str]:
        """Database → the latest transaction id committed there."""
        with self._held():
            return dict(self._latest)


def database_of(session: Session) -> str:
    """The URL (password hidden) of the database the session writes evidence rows to."""
    bind = session.get_bind(clause=EVIDENCE_INSERT)
    engine = bind.engine if isinstance(bind, sa.Connection) else bind
    url = engine.url
    # Rendering a URL costs ~5 us (its parts quoted again); each COMMIT asks, so each engine's
    # rendering is kept beside the URL object it came from, and made again if that changed.
    try:
        kept = _rendered.get(engine)
    except TypeError:  # a bind that takes no weak reference: rendered each time
        return url.render_as_string(hide_password=True)
    if kept is None or kept[0] is not url:
        kept = (url, url.render_as_string(hide_password=True))
        _rendered[engine] = kept
    return kept[1]


#: Engine -> (its URL, that URL rendered with the password hidden): :func:`database_of`.
_rendered: weakref.WeakKeyDictionary[sa.Engine, tuple[sa.URL, str]] = weakref.WeakKeyDictionary()


def witness_commit(witnesses: CommitWitnesses, session: Session, txn_id: str) -> None:
    """Record ``txn_id``, whose evidence row ``session`` just committed, as its database's
    latest witness. Called right after the COMMIT returned, so it never raises: a COMMIT that
    happened must not reach the caller as an error (a routing ``get_bind`` that fails now only
    costs the witness, logged)."""
    try:
        witnesses.committed(database_of(session), txn_id)
    except Exception:
        log.warning(
            "transaction %s committed, but the database of its evidence row could not be told; "
            "the check endpoint's wrong-database guard goes without this witness",
            txn_id,
            exc_info=True,
        )
